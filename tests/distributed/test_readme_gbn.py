"""The documented gloo grouped-BN program (docs/reusable-parts.md) runs as written under
torchrun on 2 CPU ranks.

The block is taken from the docs verbatim, saved as ``gbn.py`` in a fresh directory and
launched as its text says (``torchrun --nproc-per-node 2 gbn.py``), with the package importable
as an installed project would be. Its last line prints each rank's BN running mean: grouped BN
over both ranks makes them equal; the same program with ``group_size=1`` (per-rank BN) gives
different numbers, so the comparison can fail.
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


def _torchrun(tmp_path: Path, program: str) -> dict[int, float]:
    (tmp_path / "gbn.py").write_text(program, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "gbn.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "terminate called" not in proc.stderr
    found = {int(m[1]): float(m[3]) for m in LINE.finditer(proc.stdout)}
    assert sorted(found) == [0, 1], proc.stdout
    return found


def test_readme_gloo_grouped_bn_program_runs_and_syncs_statistics(tmp_path: Path) -> None:
    program = _program()
    grouped = _torchrun(tmp_path, program)
    assert grouped[0] == grouped[1], grouped
    local = _torchrun(tmp_path, program.replace("group_size=2)", "group_size=1)", 1))
    assert local[0] != local[1], local
