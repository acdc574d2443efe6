"""Every line marked ``# gpu-only`` in largebatch/ runs in a CPU test (issue 53).

A statement that runs only with a CUDA device, DALI's GPU decode or CUDA graphs carries a
trailing ``# gpu-only`` marker; the stand-in tests (``tests/test_gpu_standins_*.py``, with
CUDA's device calls stood in for by tests/cuda_standin.py) must execute each. This test runs
only those files, under coverage.py in a subprocess, and names every marked line none of them
reached. A line only a real GPU can run says why: ``# gpu-only: <reason>``; it is exempt.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

coverage = pytest.importorskip("coverage")  # the dev extra installs it

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "largebatch"
# "# gpu-only" ending the line or followed by a comment of its own, not "# gpu-only: <reason>"
MARKER = re.compile(r"#\s*gpu-only\b(?!\s*:)")
EXEMPT = re.compile(r"#\s*gpu-only\s*:\s*\S")


def marked_lines(package: Path = PACKAGE) -> tuple[dict[Path, dict[int, str]], dict[Path, dict[int, str]]]:
    """``(marked, exempt)``: per file, line number -> text of each ``# gpu-only`` line."""
    marked: dict[Path, dict[int, str]] = {}
    exempt: dict[Path, dict[int, str]] = {}
    for path in sorted(package.rglob("*.py")):
        for number, text in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if EXEMPT.search(text):
                exempt.setdefault(path, {})[number] = text.strip()
            elif MARKER.search(text):
                marked.setdefault(path, {})[number] = text.strip()
    return marked, exempt


def test_the_marker_scan_tells_marked_from_exempt_lines(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text("a = 1  # gpu-only\nb = 2  # gpu-only: needs a GPU\nc = 3  # not\n"
                                   "d = 4  # why  # gpu-only\n")
    marked, exempt = marked_lines(tmp_path)
    assert marked == {tmp_path / "m.py": {1: "a = 1  # gpu-only", 4: "d = 4  # why  # gpu-only"}}
    assert exempt == {tmp_path / "m.py": {2: "b = 2  # gpu-only: needs a GPU"}}


def test_every_gpu_only_line_runs_in_a_cpu_test(tmp_path: Path) -> None:
    marked, _ = marked_lines()
    assert sum(map(len, marked.values())) > 0, "no '# gpu-only' line found in largebatch/: the scan is broken"
    standins = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("test_gpu_standins_*.py"))
    assert standins, "no tests/test_gpu_standins_*.py file"
    data = tmp_path / ".coverage"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    run = subprocess.run(
        [sys.executable, "-m", "coverage", "run", f"--data-file={data}", f"--source={PACKAGE}",
         "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "ignore::DeprecationWarning", *standins],
        check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )
    assert run.returncode == 0, f"the stand-in tests failed:\n{run.stdout[-4000:]}\n{run.stderr[-2000:]}"
    executed = coverage.CoverageData(basename=str(data))
    executed.read()
    missed = []
    for path, lines in marked.items():
        ran = set(executed.lines(str(path)) or ())
        missed += [f"{path.relative_to(ROOT)}:{n}: {text}" for n, text in lines.items() if n not in ran]
    assert not missed, "'# gpu-only' lines no stand-in test reached:\n" + "\n".join(missed)
