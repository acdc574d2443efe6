"""Time to accuracy: the first-crossing rule, stop_at_target, never reached; and where a run
reports it (summary.json, TensorBoard, the MLPerf-style event log, in order)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import pytest

from largebatch.cli import main
from largebatch.engine.hooks import target_check
from largebatch.engine.mllog import run_status

TINY = ["debug=smoke", "progress=false", "model=resnet10t", "data.workers=0", "global_batch_size=16",
        "data.synthetic.train_per_class=8", "data.synthetic.val_per_class=2"]


def _replay(top1s: list[float], target: Optional[float], stop_at_target: bool) -> tuple[Optional[float], list[bool]]:
    """Feed evaluations at wall times 10, 20, 30, ... through the rule, as EvalHook does."""
    ttt: Optional[float] = None
    stops = []
    for i, top1 in enumerate(top1s):
        ttt, stop = target_check(top1, 10.0 * (i + 1), target_top1=target, stop_at_target=stop_at_target,
                                 time_to_target_s=ttt)
        stops.append(stop)
    return ttt, stops


def test_first_crossing_is_kept_even_if_accuracy_drops_and_recrosses() -> None:
    ttt, stops = _replay([50.0, 70.0, 65.0, 80.0], target=70.0, stop_at_target=False)
    assert ttt == 20.0  # the 2nd evaluation, at the target exactly (>=)
    assert stops == [False] * 4


def test_stop_at_target_stops_at_the_first_evaluation_at_or_above_target() -> None:
    ttt, stops = _replay([50.0, 69.99, 70.5, 71.0], target=70.0, stop_at_target=True)
    assert ttt == 30.0
    assert stops == [False, False, True, True]


def test_never_reached_and_no_target() -> None:
    assert _replay([10.0, 20.0, 30.0], target=75.9, stop_at_target=True) == (None, [False] * 3)
    assert _replay([10.0, 99.0], target=None, stop_at_target=True) == (None, [False, False])


def test_run_status() -> None:
    assert run_status(target_top1=75.9, time_to_target_s=12.0, failed=False) == "success"
    assert run_status(target_top1=75.9, time_to_target_s=None, failed=False) == "aborted"
    assert run_status(target_top1=None, time_to_target_s=None, failed=False) == "success"
    assert run_status(target_top1=None, time_to_target_s=None, failed=True) == "aborted"


@pytest.fixture(scope="module")
def data_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cache")  # the tiny data set is generated once per module


@pytest.fixture()
def cache(tmp_path: Path, data_cache: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("LARGEBATCH_CACHE", str(data_cache))
    return tmp_path


def _events(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "mlperf_log.jsonl").read_text().splitlines()]


def test_stop_at_target_run_reports_time_to_target_everywhere(cache: Path) -> None:
    run = cache / "run"
    args = [*TINY, "epochs=3", "target_top1=0", "stop_at_target=true", f"run_dir={run}"]
    assert main(args) == 0
    summary = json.loads((run / "summary.json").read_text())
    evals = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in evals if r["kind"] == "eval"]
    assert summary["epochs"] == 1 and len(evals) == 1  # stopped after the first evaluation
    assert summary["time_to_target_s"] == evals[0]["wall_s"] > 0
    assert "target" in summary["stop_reason"]

    events = _events(run)
    keys = [e["key"] for e in events]
    assert keys[0] == "run_start" and keys[-1] == "run_stop"
    flow = [k for k in keys if k in ("epoch_start", "epoch_stop", "eval_accuracy", "run_stop")]
    assert flow == ["epoch_start", "epoch_stop", "eval_accuracy", "run_stop"]
    assert all(isinstance(e["time_ms"], int) and isinstance(e["metadata"], dict) for e in events)
    assert [e["time_ms"] for e in events] == sorted(e["time_ms"] for e in events)
    stop = events[-1]
    assert stop["event_type"] == "INTERVAL_END" and stop["metadata"]["status"] == "success"
    assert stop["metadata"]["time_to_target_s"] == summary["time_to_target_s"]
    assert events[keys.index("eval_accuracy")]["metadata"]["epoch_num"] == 1

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run / "tensorboard"))
    acc.Reload()
    (point,) = acc.Scalars("val/time_to_target_s")
    assert point.value == pytest.approx(summary["time_to_target_s"], rel=1e-5)


def test_unreached_target_runs_all_epochs_and_logs_aborted(cache: Path) -> None:
    run = cache / "run"
    assert main([*TINY, "epochs=2", "target_top1=100.5", "stop_at_target=true", "tensorboard=false",
                 f"run_dir={run}"]) == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["epochs"] == 2 and summary["time_to_target_s"] is None
    events = _events(run)
    flow = [e["key"] for e in events if e["key"] in ("epoch_start", "epoch_stop", "eval_accuracy", "run_stop")]
    assert flow == ["epoch_start", "epoch_stop", "eval_accuracy"] * 2 + ["run_stop"]
    assert [e["metadata"]["epoch_num"] for e in events if e["key"] == "epoch_start"] == [1, 2]
    assert events[-1]["metadata"]["status"] == "aborted"
    assert {"global_batch_size", "opt_name", "target_accuracy"} <= {e["key"] for e in events}
