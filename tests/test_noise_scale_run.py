"""A run reports the gradient noise scale where it comes free, and says so where it does not.

CLI runs (``largebatch.cli.main``) on the shrunk smoke data (tests/smoke.py): with 2 micro-batches
a step the noise scale reaches each log record of metrics.jsonl, summary.json and the closing
lines; one process without accumulation says it is not measured; ``enabled=false`` says nothing.
The agreement of the two measurements is tests/distributed/test_noise_scale_dist.py's.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from largebatch.cli import main
from tests.smoke import smoke


def _records(run: Path) -> list[dict]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == "train"]


def test_accumulation_reports_the_noise_scale(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run = tmp_path / "run"
    assert main(smoke(f"run_dir={run}", "accumulation_steps=2", "log_every=1")) == 0
    records = _records(run)
    assert len(records) == 8
    for r in records:
        assert {"noise_scale", "grad_sq_norm", "noise_trace"} <= r.keys(), r
        assert math.isfinite(r["noise_trace"]) and math.isfinite(r["grad_sq_norm"])
    summary = json.loads((run / "summary.json").read_text())
    final = summary["noise_scale_final"]
    last = records[-1]["noise_scale"]
    assert (final is None and not (math.isfinite(last) and last >= 0)) or final == pytest.approx(last, rel=1e-3)
    out = capsys.readouterr().out
    assert "largebatch: gradient noise scale at the end: " in out and "your global batch is 8" in out, out
    log = (run / "train.log").read_text()
    assert "noise scale: measured from micro-batches (4 vs 8 images" in log
    # largebatch-report shows it: the column (summary.json's value) and the plot over the steps
    from largebatch.report import load_run, main as report

    loaded = load_run(run)
    assert loaded.noise_scale_final == final and [t["noise_scale"] for t in loaded.train] == \
        pytest.approx([r["noise_scale"] for r in records], nan_ok=True)
    assert report([str(run), "--out", str(tmp_path / "plots")]) == 0
    assert (tmp_path / "plots" / "noise_scale_vs_step.png").stat().st_size > 5000


def test_one_process_without_accumulation_says_it_is_not_measured(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run = tmp_path / "run"
    assert main(smoke(f"run_dir={run}", "max_steps=2")) == 0
    assert all("noise_scale" not in r for r in _records(run))
    assert json.loads((run / "summary.json").read_text())["noise_scale_final"] is None
    assert "largebatch: noise scale: not measured (one process, no accumulation)" in capsys.readouterr().out


def test_the_probe_measures_one_process_without_accumulation(tmp_path: Path) -> None:
    run = tmp_path / "run"
    assert main(smoke(f"run_dir={run}", "max_steps=4", "log_every=2", "diagnostics.noise_scale.probe_every=2")) == 0
    records = _records(run)
    assert records and all("noise_scale" in r and math.isfinite(r["noise_trace"]) for r in records), records
    log = (run / "train.log").read_text()
    assert "noise scale: measured by a probe every 2 steps (4 vs 8 images per gradient): one extra backward " \
           "per probe, ~50% of steps" in log, log


def test_disabled_measures_and_says_nothing(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run = tmp_path / "run"
    assert main(smoke(f"run_dir={run}", "max_steps=2", "accumulation_steps=2",
                      "diagnostics.noise_scale.enabled=false")) == 0
    assert all("noise_scale" not in r for r in _records(run))
    assert "noise_scale_final" not in json.loads((run / "summary.json").read_text())
    assert "noise scale" not in capsys.readouterr().out
