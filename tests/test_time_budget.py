"""The suite's time budget fails a whole run that takes longer than tests/time_budget.json allows (issue 70)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.time_budget import BUDGET_FILE, over_budget


def test_the_committed_budget_names_both_environments() -> None:
    budget = json.loads(BUDGET_FILE.read_text())
    assert set(budget) == {"main", "xla"}
    assert all(float(b["seconds"]) > 0 for b in budget.values())


def test_over_budget_names_the_total_and_the_slowest() -> None:
    durations = {"a": 3.0, "b": 10.0, "c": 1.0}
    assert over_budget(durations, 14.0) is None
    line = over_budget(durations, 13.0, shown=2)
    assert line is not None and "14 s in all" in line and "budget of 13 s" in line
    assert line.index("b 10 s") < line.index("a 3 s") and "c 1 s" not in line


def test_a_whole_run_over_its_budget_fails_and_one_within_passes(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[1]
    (tmp_path / "test_sleepy.py").write_text("import time\n\ndef test_sleeps():\n    time.sleep(0.5)\n")
    budget = tmp_path / "budget.json"

    def run(seconds: float) -> subprocess.CompletedProcess:
        budget.write_text(json.dumps({"main": {"seconds": seconds}, "xla": {"seconds": seconds}}))
        env = {**os.environ, "LARGEBATCH_TIME_BUDGET": "1", "LARGEBATCH_TIME_BUDGET_FILE": str(budget),
               "PYTHONPATH": str(root), "LARGEBATCH_TEST_DURATIONS": str(tmp_path / "profile")}
        return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "tests.time_budget", "-p", "no:cacheprovider",
                               str(tmp_path / "test_sleepy.py")], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=120)

    over = run(0.2)
    assert over.returncode == 1, over.stdout
    assert "over this suite's budget of 0 s" in over.stdout and "test_sleeps" in over.stdout
    within = run(60)
    assert within.returncode == 0, within.stdout
    assert "time budget (main):" in within.stdout
    profile = json.loads((tmp_path / "profile" / "durations-main.json").read_text())  # LARGEBATCH_TEST_DURATIONS
    assert list(profile) == ["test_sleepy.py::test_sleeps"] and profile["test_sleepy.py::test_sleeps"] >= 0.5


def test_under_xdist_the_controller_sums_every_workers_tests(tmp_path: Path) -> None:
    """scripts/test.sh runs the suite on pytest-xdist workers: the budget and the profile hold
    all of them (the workers' reports reach the controller), checked and written once."""
    root = Path(__file__).resolve().parents[1]
    for name in ("a", "b", "c", "d"):
        (tmp_path / f"test_{name}.py").write_text("import time\n\ndef test_sleeps():\n    time.sleep(0.4)\n")
    budget = tmp_path / "budget.json"
    budget.write_text(json.dumps({"main": {"seconds": 1.2}, "xla": {"seconds": 1.2}}))
    env = {**os.environ, "LARGEBATCH_TIME_BUDGET": "1", "LARGEBATCH_TIME_BUDGET_FILE": str(budget),
           "PYTHONPATH": str(root), "LARGEBATCH_TEST_DURATIONS": str(tmp_path / "profile")}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "tests.time_budget", "-p", "no:cacheprovider",
                           "-n", "2", "."], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    # 4 x 0.4 s over two workers: ~0.8 s of wall time, 1.6 s of tests, over the 1.2 s budget
    assert proc.returncode == 1, proc.stdout
    assert proc.stdout.count("over this suite's budget of 1 s") == 1, proc.stdout
    profile = json.loads((tmp_path / "profile" / "durations-main.json").read_text())
    assert sorted(profile) == [f"test_{n}.py::test_sleeps" for n in "abcd"], profile
