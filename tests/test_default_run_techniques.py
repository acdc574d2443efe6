"""benchmarks/default_run_techniques.py: every arm runs every seed with its overrides in effect
(the progressive arm's epochs really train at its sides), the table compares each with the
baseline seed by seed, and a rerun with the same --out trains nothing again."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "default_run_techniques.py"


def test_the_arms_run_their_overrides_and_a_rerun_goes_on(tmp_path: Path) -> None:
    cmd = [sys.executable, str(SCRIPT), "--quick", "--seeds", "0", "--out", str(tmp_path), "target_top1=1"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=600).stdout
    rows = [json.loads(line) for line in (tmp_path / "rows.jsonl").read_text().splitlines()]
    assert sorted(r["arm"] for r in rows) == ["baseline", "progressive"]
    sides = [r.get("image_size") for r in map(json.loads, (tmp_path / "progressive-seed0" / "metrics.jsonl")
                                               .read_text().splitlines()) if r.get("kind") == "epoch"]
    assert sides == [8, 16], sides
    line = next(x for x in out.splitlines() if x.startswith("| progressive |"))
    assert "| 1/1 |" in line and line.count("n/a") == 0, line  # reached, so a time ratio per seed
    again = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=600).stdout
    assert "seed 0: best" not in again and len((tmp_path / "rows.jsonl").read_text().splitlines()) == 2
