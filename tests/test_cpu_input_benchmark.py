"""benchmarks/cpu_input.py runs end to end at a tiny size, so that it cannot rot (a smoke run: the
numbers mean nothing here; the table in benchmarks/README.md is made with its default arguments)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_cpu_input_prints_a_row_per_case(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "cpu_input.py"), "--cases", "20:16,24:12",
                           "--batch", "8", "--batches", "1", "--rounds", "1", "--per-class", "2"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| 2")]
    assert [r.split("|")[1].strip() for r in rows] == ["20 -> 16", "24 -> 12"], proc.stdout
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert len(cells) == 8 and cells[6].endswith("x)") and float(cells[7].replace(",", "")) > 0, row
