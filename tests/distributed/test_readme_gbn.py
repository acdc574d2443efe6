"""The documented gloo grouped-BN program (docs/reusable-parts.md) runs as written under
torchrun on 2 CPU ranks.

The block is taken from the docs verbatim, saved as ``gbn.py`` in a fresh directory and
launched as its text says (``torchrun --nproc-per-node 2 gbn.py``), with the package importable
as an installed project would be. Its last line prints each rank's BN running mean: grouped BN
over both ranks makes them equal; the same program with ``group_size=1`` (per-rank BN) gives
different numbers, so the comparison can fail. The two launches run side by side (each its own
directory and ``--standalone`` rendezvous port): most of a launch is its processes' imports.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.docs_text import python_blocks

ROOT = Path(__file__).resolve().parents[2]
LINE = re.compile(r"rank (\d): loss ([\d.]+), bn1 running mean (-?[\d.]+)")


def _program() -> str:
    (block,) = [b for b in python_blocks() if b.startswith("# gbn.py")]
    return block


def _start(directory: Path, program: str) -> subprocess.Popen:
    directory.mkdir()
    (directory / "gbn.py").write_text(program, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "gbn.py"],
        cwd=directory, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def _means(proc: subprocess.Popen) -> dict[int, float]:
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr[-3000:]
    assert "terminate called" not in stderr
    found = {int(m[1]): float(m[3]) for m in LINE.finditer(stdout)}
    assert sorted(found) == [0, 1], stdout
    return found


def test_readme_gloo_grouped_bn_program_runs_and_syncs_statistics(tmp_path: Path) -> None:
    program = _program()
    local_program = program.replace("group_size=2)", "group_size=1)", 1)
    assert local_program != program
    procs = [_start(tmp_path / "grouped", program), _start(tmp_path / "local", local_program)]
    try:
        grouped, local = (_means(proc) for proc in procs)
    finally:
        for proc in procs:  # no-op for a launch that ended; none outlives a failed test
            proc.kill()
            proc.wait()
    assert grouped[0] == grouped[1], grouped
    assert local[0] != local[1], local
