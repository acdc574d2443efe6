"""largebatch-report: the comparison table and PNG plots from two short runs, and bad input."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from largebatch.cli import main as train
from largebatch.report import Run, format_table, load_run, main

TINY = ["debug=smoke", "progress=false", "model=resnet10t", "data.workers=0", "tensorboard=false",
        "data.synthetic.train_per_class=8", "data.synthetic.val_per_class=2"]
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = tmp_path_factory.mktemp("runs")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LARGEBATCH_CACHE", str(root / "cache"))
        a, b = root / "small_batch", root / "large_batch"
        assert train([*TINY, "epochs=2", "global_batch_size=8", "target_top1=0", f"run_dir={a}"]) == 0
        assert train([*TINY, "epochs=2", "global_batch_size=16", "optimizer=lars", "target_top1=100.5",
                      f"run_dir={b}"]) == 0
    return [a, b]


def test_report_prints_the_table_and_writes_three_pngs(two_runs: list[Path], tmp_path: Path,
                                                      capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "plots"
    assert main([*map(str, two_runs), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    lines = text.splitlines()
    assert "time to target" in lines[0] and "global batch" in lines[0] and "world size" in lines[0]
    small = next(ln for ln in lines if ln.startswith("small_batch"))
    large = next(ln for ln in lines if ln.startswith("large_batch"))
    assert " s " in small + " " and "success" in small  # reached target 0 at the first evaluation
    # MLPerf logs `aborted` for a target not reached; the table says the run finished
    assert "not reached" in large and "finished" in large and "aborted" not in large
    assert small.split()[-2:] == ["8", "1"] and large.split()[-2:] == ["16", "1"]  # batch, world size
    for name in ("top1_vs_wall.png", "top1_vs_epoch.png", "lr_vs_step.png", "noise_scale_vs_step.png"):
        data = (out / name).read_bytes()
        assert data.startswith(PNG) and len(data) > 5000, name


def test_loaded_run_matches_its_files(two_runs: list[Path]) -> None:
    run = load_run(two_runs[0])
    assert [e["epoch"] for e in run.evals] == [1, 2]
    assert run.time_to_target_s == run.evals[0]["wall_s"]
    # the logged lr of each train record (cosine ends at exactly 0 on the last step)
    assert run.train and all(t["lr"] >= 0 for t in run.train) and run.train[0]["lr"] > 0
    assert run.status == "success"


def test_markdown_table_from_records_alone() -> None:
    runs = [
        Run("a", Path("a"), summary={"target_top1": 75.9, "time_to_target_s": 3600.0, "best_top1": 76.1,
                                      "epochs": 90, "img_per_s": 2300.4, "global_batch_size": 8192, "world_size": 256}),
        Run("b", Path("b"), evals=[{"epoch": 1, "top1": 40.0, "wall_s": 5.0}]),  # killed before its summary
    ]
    table = format_table(runs, markdown=True).splitlines()
    assert table[2] == "| a | success | 75.9 | 3600.0 s | 76.10 | 90 | 2300 | - | 8192 | 256 |"
    assert table[3] == "| b | unknown | - | no target | 40.00 | 1 | - | - | - | - |"  # no end logged, no plan


@pytest.mark.parametrize("kind", ["empty_dir", "missing", "file", "bad_json"])
def test_bad_input_is_one_line_and_exit_2(kind: str, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "x"
    if kind == "empty_dir":
        path.mkdir()
    elif kind == "file":
        path.write_text("hello")
    elif kind == "bad_json":
        path.mkdir()
        (path / "metrics.jsonl").write_text('{"kind": "eval"\n')
    assert main([str(path), "--no-plots"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("largebatch-report: error:") and "\n" not in err and str(path) in err


def report(*args: object) -> subprocess.CompletedProcess:
    """``python -m largebatch.report ARGS --no-plots``, the real command, in a subprocess."""
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    return subprocess.run([sys.executable, "-m", "largebatch.report", *map(str, args), "--no-plots"],
                          capture_output=True, text=True, env=env, timeout=60)


def copy_run(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("checkpoints"))
    return dst


def assert_one_error_line(proc: subprocess.CompletedProcess, *needles: str) -> None:
    err = proc.stderr.strip()
    assert proc.returncode == 2, proc
    assert "Traceback" not in err and "\n" not in err and err.startswith("largebatch-report: error:"), err
    for needle in needles:
        assert needle in err, (needle, err)


@pytest.mark.parametrize("damage", ["binary_metrics", "summary_list", "summary_wrong_type", "metrics_record_list",
                                    "metrics_missing_key", "mlperf_binary", "summary_nested_deep", "summary_nan",
                                    "summary_huge_negative", "summary_infinite_time", "metrics_nan_top1",
                                    "metrics_nested_deep"])
def test_damaged_file_is_one_line_naming_it(damage: str, two_runs: list[Path], tmp_path: Path) -> None:
    run = copy_run(two_runs[0], tmp_path / "run")
    if damage == "binary_metrics":
        bad, needle = run / "metrics.jsonl", "not UTF-8"
        bad.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe" + bytes(range(256)))
    elif damage == "summary_list":
        bad, needle = run / "summary.json", "a JSON list, not the object"
        bad.write_text("[1, 2, 3]\n")
    elif damage == "summary_wrong_type":
        bad, needle = run / "summary.json", "'best_top1' is 'high', not a number"
        bad.write_text('{"best_top1": "high"}\n')
    elif damage == "metrics_record_list":
        bad, needle = run / "metrics.jsonl", "line 2 is JSON but not an object"
        bad.write_text(bad.read_text().splitlines()[0] + "\n[1, 2]\n")
    elif damage == "metrics_missing_key":
        bad, needle = run / "metrics.jsonl", "'top1' is missing"
        bad.write_text('{"kind": "eval", "epoch": 1, "wall_s": 1.0}\n')
    # issue 43 case 5: the next five were a RecursionError traceback (exit 1), or values
    # printed as if they were results
    elif damage == "summary_nested_deep":
        bad, needle = run / "summary.json", "JSON nested too deep to read under 'best_top1'"
        bad.write_text('{"best_top1": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    elif damage == "summary_nan":
        bad, needle = run / "summary.json", "'best_top1' is nan, not a percentage in 0-100"
        bad.write_text('{"best_top1": NaN, "epochs": 2}\n')
    elif damage == "summary_huge_negative":
        bad, needle = run / "summary.json", "'img_per_s' is -1e+308, not a rate >= 0"
        bad.write_text('{"best_top1": 50.0, "img_per_s": -1e308}\n')
    elif damage == "summary_infinite_time":
        bad, needle = run / "summary.json", "'time_to_target_s' is inf, not a time >= 0"
        bad.write_text('{"best_top1": 50.0, "target_top1": 40, "time_to_target_s": Infinity}\n')
    elif damage == "metrics_nan_top1":
        bad, needle = run / "metrics.jsonl", "line 1: 'top1' is nan, not a finite number"
        bad.write_text('{"kind": "eval", "epoch": 1, "top1": NaN, "wall_s": 1.0}\n')
    elif damage == "metrics_nested_deep":
        bad, needle = run / "metrics.jsonl", "line 1 is damaged: JSON nested too deep"
        bad.write_text("[" * 100_000 + "]" * 100_000 + "\n")
    else:
        bad, needle = run / "mlperf_log.jsonl", "not UTF-8"
        bad.write_bytes(b"\xff" * 64)
    proc = report(run)
    assert_one_error_line(proc, str(bad), needle, "move it out of the run directory")
    (row,) = proc.stdout.splitlines()[2:]  # the run keeps its row, marked damaged, with nothing else shown
    assert row.split() == ["run", "damaged", "-", "no", "target", "-", "-", "-", "-", "-", "-"], row


def test_one_damaged_run_among_several_is_named_and_the_others_reported(two_runs: list[Path], tmp_path: Path) -> None:
    damaged = copy_run(two_runs[0], tmp_path / "damaged")
    (damaged / "summary.json").write_text("[1, 2, 3]\n")
    proc = report(two_runs[0], damaged, two_runs[1], tmp_path / "missing")
    assert proc.returncode == 2  # something could not be read: a script notices
    errors = proc.stderr.strip().splitlines()
    assert len(errors) == 2 and "Traceback" not in proc.stderr
    assert str(damaged / "summary.json") in errors[0] and str(tmp_path / "missing") in errors[1]
    rows = [ln.split()[:2] for ln in proc.stdout.splitlines()[2:]]
    assert rows == [["small_batch", "success"], ["damaged", "damaged"], ["large_batch", "finished"]]


def test_a_live_run_is_running_not_its_earlier_attempts_end(two_runs: list[Path], tmp_path: Path) -> None:
    """Issue 54 item 6c: a resumed run, live, showed as `preempted` with the numbers of its
    earlier attempt's summary.json. The lock a live run holds says "running"; once it is
    gone the run is judged from its files again."""
    from tests.test_run_dir import _hold_lock

    run = copy_run(two_runs[0], tmp_path / "run")  # reached its target: success, best top-1 from summary
    summary = json.loads((run / "summary.json").read_text())
    summary.update(stop_reason="preempted (SIGTERM)", best_top1=12.5)  # the earlier attempt's end
    (run / "summary.json").write_text(json.dumps(summary))
    holder = _hold_lock(run)  # another process, as a live run: POSIX locks are per process
    try:
        loaded = load_run(run)
        assert loaded.status == "running" and loaded.best_top1 != 12.5, loaded
        row = report(run).stdout.splitlines()[2].split()
        assert row[:2] == ["run", "running"] and "12.50" not in row, row
    finally:
        holder.kill()
        holder.wait()
    assert load_run(run).status == "preempted" and load_run(run).best_top1 == 12.5


@pytest.mark.parametrize("case,status", [
    ("no_summary", "finished"),              # run_stop says `aborted` (target not reached) and no error
    ("no_summary_no_run_stop", "finished"),  # metrics reached config.yaml's epochs
    ("killed_in_epoch_2", "unfinished"),     # no end logged, metrics stop at epoch 1 of 2
    ("killed_no_config", "unknown"),         # no end logged and no plan to compare with
    ("max_steps", "finished"),               # no end logged, metrics reached config.yaml's max_steps
    ("failed", "failed"),                    # run_stop carries an error
    ("preempted", "preempted"),
])
def test_status_without_summary_is_inferred(case: str, status: str, two_runs: list[Path], tmp_path: Path) -> None:
    run = copy_run(two_runs[1], tmp_path / "run")  # target 100.5, never reached: MLPerf says aborted
    (run / "summary.json").unlink()
    mlperf, metrics, config = run / "mlperf_log.jsonl", run / "metrics.jsonl", run / "config.yaml"
    no_stop = "".join(ln for ln in mlperf.read_text().splitlines(True) if '"run_stop"' not in ln)
    if case != "no_summary":
        mlperf.write_text(no_stop)
    first_epoch = [ln for ln in metrics.read_text().splitlines(True) if '"epoch": 2' not in ln]
    if case in ("killed_in_epoch_2", "killed_no_config", "max_steps"):
        metrics.write_text("".join(first_epoch))
    if case == "killed_no_config":
        config.unlink()
    if case == "max_steps":
        config.write_text(config.read_text().replace("max_steps: null", "max_steps: 4"))
    if case in ("failed", "preempted"):
        meta = ('"error": "RuntimeError(\'boom\')", "stop_reason": null' if case == "failed"
                else '"error": null, "stop_reason": "preempted (SIGTERM)"')
        mlperf.write_text(no_stop + '{"key": "run_stop", "metadata": {"status": "aborted", %s}}\n' % meta)
    proc = report(run)
    assert proc.returncode == 0 and proc.stderr == "", proc
    assert proc.stdout.splitlines()[2].split()[:2] == ["run", status]


def _noise_run(root: Path, name: str, values: list, batch: int, final: object = "absent") -> Path:
    """A run directory written by hand: train records with ``noise_scale`` values (json writes
    nan and inf as NaN and Infinity, as the run does), and its summary."""
    run = root / name
    run.mkdir(parents=True)
    lines = [json.dumps({"kind": "train", "step": i + 1, "epoch": 0, "lr": 0.1, "loss": 1.0, "img_per_s": 10.0,
                         "noise_scale": v}) for i, v in enumerate(values)]
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    summary = {"best_top1": 50.0, "global_batch_size": batch, "world_size": 1, "epochs": 1}
    if final != "absent":
        summary["noise_scale_final"] = final
    (run / "summary.json").write_text(json.dumps(summary))
    return run


def test_the_noise_scale_column_and_plot(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """The column: summary.json's noise_scale_final (null: not measured or not resolved at the
    end), else, for a run without it, the last value logged if finite; the plot draws the finite
    positive values (nan: nothing averaged yet; inf: not resolved) on a log axis beside each
    run's global batch."""
    a = _noise_run(tmp_path, "measured", [float("nan"), float("inf"), -3.0, 40.0, 120.0], 64, final=118.4)
    b = _noise_run(tmp_path, "summary_lost", [20.0, float("inf"), 300.0], 256)
    c = _noise_run(tmp_path, "not_measured", [None, None], 32, final=None)
    d = _noise_run(tmp_path, "unresolved", [30.0, float("inf")], 16)
    assert load_run(d).noise_scale_final is None
    assert load_run(_noise_run(tmp_path, "unresolved_at_end", [30.0, 50.0], 16, final=None)).noise_scale_final is None
    runs = [load_run(p) for p in (a, b, c)]
    assert [r.noise_scale_final for r in runs] == [118.4, 300.0, None]
    table = format_table(runs).splitlines()
    head = table[0].split("  ")
    assert "noise scale" in table[0] and table[0].index("noise scale") < table[0].index("global batch"), head
    cells = {ln.split()[0]: ln.split()[-3:] for ln in table[2:]}
    assert cells == {"measured": ["118", "64", "1"], "summary_lost": ["300", "256", "1"],
                     "not_measured": ["-", "32", "1"]}
    out = tmp_path / "plots"
    assert main([str(a), str(b), str(c), "--out", str(out)]) == 0
    assert (out / "noise_scale_vs_step.png").read_bytes().startswith(PNG)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from largebatch.report import _noise_scale_plot

    drawn: list = []
    real_plot = plt.Axes.plot
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(plt.Axes, "plot", lambda ax, *a, **k: drawn.append(a) or real_plot(ax, *a, **k))
        lines: list = []
        real_axhline = plt.Axes.axhline
        mp.setattr(plt.Axes, "axhline", lambda ax, y, **k: lines.append(y) or real_axhline(ax, y, **k))
        _noise_scale_plot(runs, tmp_path / "ns.png", plt)
    assert [list(zip(*d)) for d in drawn] == [[(4, 40.0), (5, 120.0)], [(1, 20.0), (3, 300.0)]]
    assert lines == [64, 256]


def test_a_noise_scale_that_is_not_a_number_is_damage(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run = _noise_run(tmp_path, "bad", ["many"], 64)
    assert main([str(run), "--no-plots"]) == 2
    err = capsys.readouterr().err
    assert "'noise_scale' is 'many', not a number" in err and len(err.strip().splitlines()) == 1


def _batch_run(root: Path, name: str, epoch_batches: list, summary: dict) -> Path:
    """A run directory written by hand: epoch records (with ``global_batch_size`` where given, as a
    batch schedule writes them), a train record whose steps were all skipped (null loss), a summary."""
    run = root / name
    run.mkdir(parents=True)
    lines = [{"kind": "train", "step": 1, "epoch": 0, "lr": 0.1, "loss": None, "skipped_steps": 1, "img_per_s": 9.0}]
    for i, batch in enumerate(epoch_batches):
        lines.append({"kind": "epoch", "epoch": i + 1, "step": 4 * (i + 1), "epoch_time_s": 1.0,
                      **({} if batch is None else {"global_batch_size": batch})})
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    (run / "summary.json").write_text(json.dumps({"world_size": 1, "epochs": len(epoch_batches), **summary}))
    return run


def test_the_global_batch_column_shows_the_batches_trained(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """summary.json's global_batch_size is the base batch: the column lists the batches each epoch
    trained with (summary.json's per-epoch list, else the epoch records'), and a run directory from
    before either (one batch) reads as it always did."""
    new = _batch_run(tmp_path, "scheduled", [32, 64, 128], {"global_batch_size": 32, "final_global_batch_size": 128,
                                                            "global_batch_size_per_epoch": [32, 64, 128]})
    older = _batch_run(tmp_path, "older_scheduled", [32, 64, 64, 128], {"global_batch_size": 32})
    fixed = _batch_run(tmp_path, "fixed", [None, None], {"global_batch_size": 32})
    runs = [load_run(p) for p in (new, older, fixed)]
    assert [r.batches for r in runs] == [[32, 64, 128], [32, 64, 64, 128], [32]]
    assert [t["loss"] for t in runs[0].train] == [None]  # every step of the interval skipped
    cells = {ln.split()[0]: ln.split()[-2] for ln in format_table(runs).splitlines()[2:]}
    assert cells == {"scheduled": "32->64->128", "older_scheduled": "32->64->128", "fixed": "32"}
    assert main([str(new), str(older), str(fixed), "--out", str(tmp_path / "plots")]) == 0


def test_a_bad_per_epoch_batch_is_damage(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run = _batch_run(tmp_path, "bad", [32], {"global_batch_size": 32, "global_batch_size_per_epoch": [32, "x"]})
    assert main([str(run), "--no-plots"]) == 2
    err = capsys.readouterr().err
    assert "'global_batch_size_per_epoch' is [32, 'x'], not a list of whole numbers > 0" in err, err
    run = _batch_run(tmp_path, "bad_record", [0], {"global_batch_size": 32})
    assert main([str(run), "--no-plots"]) == 2
    assert "'global_batch_size' 0 at step 4 is not a whole number > 0" in capsys.readouterr().err


def test_a_run_that_skipped_most_of_its_steps_is_not_called_finished(two_runs: list[Path], tmp_path: Path) -> None:
    """Issue 90 case 6: a run that skipped 7 of its 8 steps (non-finite losses under
    non_finite=skip) was reported `finished`; now `skipped`. One skipped step of 8 stays finished."""
    for skipped, status in ((7, "skipped"), (1, "finished")):
        run = copy_run(two_runs[1], tmp_path / f"run{skipped}")
        summary = json.loads((run / "summary.json").read_text())
        summary.update(skipped_steps=skipped, steps=8, stop_reason=None)
        (run / "summary.json").write_text(json.dumps(summary))
        assert load_run(run).status == status
