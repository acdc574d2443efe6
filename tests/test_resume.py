"""Exact resume: a run stopped after step k and resumed with ``resume=auto`` ends with the
same weights, bit for bit, as the run that never stopped (fp32, data.workers=0)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from largebatch.cli import main
from largebatch.engine.checkpoint import list_checkpoints, load_checkpoint
from tests.smoke import EXACT

# EXACT: 4 classes x 8 train images, global batch 8 -> 4 steps per epoch, 2 epochs, fp32, warmup +
# cosine (tests/smoke.py).


@pytest.fixture(scope="module")
def straight(tmp_path_factory: pytest.TempPathFactory) -> dict[str, torch.Tensor]:
    """Final weights of the run that trains its 8 steps without stopping."""
    run = tmp_path_factory.mktemp("straight") / "run"
    assert main([*EXACT, f"run_dir={run}"]) == 0
    return _final_weights(run, expected_step=8)


def _final_weights(run: Path, expected_step: int) -> dict[str, torch.Tensor]:
    last = load_checkpoint(list_checkpoints(run / "checkpoints")[-1])
    assert last["train_state"]["step"] == expected_step
    return last["model"]


def _assert_complete(ckpt: dict) -> None:
    """Everything an exact resume needs, plus what tells a later run what made it."""
    import largebatch

    assert {"model", "optimizer", "scheduler", "scaler", "train_state", "rng", "config"} <= ckpt.keys()
    assert ckpt["optimizer"]["state"], "no momentum buffers"
    assert ckpt["scheduler"]["last_epoch"] == ckpt["train_state"]["step"]
    assert {"python", "numpy", "torch"} <= ckpt["rng"].keys()
    assert ckpt["version"] == largebatch.__version__ and ckpt["model_name"] == "resnet10t"
    assert (ckpt["world_size"], ckpt["global_batch_size"], ckpt["steps_per_epoch"]) == (1, 8, 4)
    assert ckpt["config"]["schedule"]["warmup_epochs"] == 0.5  # the resolved config


def _assert_identical(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    different = [k for k in a if not torch.equal(a[k], b[k])]
    assert not different, f"{len(different)} tensors differ after resume, e.g. {different[:3]}"


@pytest.mark.parametrize("stop_after", [4, 5], ids=["epoch-boundary", "mid-epoch"])
def test_stop_and_resume_gives_identical_weights(
    tmp_path: Path, straight: dict[str, torch.Tensor], stop_after: int
) -> None:
    run = tmp_path / "run"
    assert main([*EXACT, f"run_dir={run}", f"max_steps={stop_after}"]) == 0
    stopped = load_checkpoint(list_checkpoints(run / "checkpoints")[-1])
    assert stopped["train_state"]["step"] == stop_after
    assert stopped["train_state"]["epoch_step"] == stop_after % 4  # the data position
    _assert_complete(stopped)
    assert main([*EXACT, f"run_dir={run}", "resume=auto", "max_steps=null"]) == 0
    _assert_identical(straight, _final_weights(run, expected_step=8))
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 8 and summary["epochs"] == 2


def test_resume_at_max_steps_runs_no_extra_step(tmp_path: Path) -> None:
    run = tmp_path / "run"
    assert main([*EXACT, f"run_dir={run}", "max_steps=3"]) == 0
    assert main([*EXACT, f"run_dir={run}", "resume=auto", "max_steps=3"]) == 0
    assert json.loads((run / "summary.json").read_text())["steps"] == 3


def _lrs(run: Path) -> dict[int, float]:
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["lr"] for r in records if r.get("kind") == "train"}


def test_raising_epochs_on_resume_continues_on_the_new_schedule_and_says_so(tmp_path: Path) -> None:
    """Issue 43 case 7: a finished 2-epoch run resumed with epochs=4 jumped silently from the old
    schedule's last lr (0.0) to the new schedule's; now one log line names the change, and the
    steps after the resume use the lrs a run planned for 4 epochs from the start uses."""
    run, fresh = tmp_path / "run", tmp_path / "fresh"
    assert main([*EXACT, f"run_dir={run}", "log_every=1"]) == 0
    assert _lrs(run)[8] == 0.0  # the cosine schedule's end
    assert main([*EXACT, f"run_dir={run}", "log_every=1", "resume=auto", "epochs=4"]) == 0
    assert main([*EXACT, f"run_dir={fresh}", "log_every=1", "epochs=4"]) == 0
    expected = _lrs(fresh)
    lines = [ln for ln in (run / "train.log").read_text().splitlines() if "learning-rate schedule" in ln]
    assert len(lines) == 1, lines
    assert f"(epochs 2 -> 4): continuing on the new schedule from step 8, lr 0 -> {expected[8]:.4g}" in lines[0]
    resumed = _lrs(run)
    assert [resumed[k] for k in range(9, 17)] == pytest.approx([expected[k] for k in range(9, 17)], rel=1e-6)


def test_a_resume_with_the_same_schedule_logs_no_change(tmp_path: Path) -> None:
    run = tmp_path / "run"
    assert main([*EXACT, f"run_dir={run}", "max_steps=2"]) == 0
    assert main([*EXACT, f"run_dir={run}", "max_steps=3", "resume=auto"]) == 0
    assert "learning-rate schedule" not in (run / "train.log").read_text()


@pytest.mark.parametrize("change,was,now", [
    ("seed=1", "seed=0", "seed=1"),
    ("label_smoothing=0.2", "label_smoothing=0.1", "label_smoothing=0.2"),
])
def test_a_checkpoint_of_another_run_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture, change: str,
                                                was: str, now: str) -> None:
    """Issue 43 case 1: a checkpoint whose config differs from the run's in a key its result
    depends on belongs to another run (a reordered sweep continued one); one line, exit 2."""
    run = tmp_path / "run"
    assert main([*EXACT, f"run_dir={run}", "max_steps=1"]) == 0
    capsys.readouterr()
    assert main([*EXACT, f"run_dir={run}", "max_steps=2", "resume=auto", change]) == 2
    line = _one_error_line(capsys)
    assert f"belongs to another run: it was made with {was}, this run has {now}" in line, line
    assert main([*EXACT, f"run_dir={run}", "max_steps=2", "resume=auto", "data.workers=1"]) == 0  # how, not what


def _one_error_line(capsys: pytest.CaptureFixture) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("largebatch: error:") and "\n" not in err and "Traceback" not in err, err
    return err


class _Payload:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        import os

        return (os.system, (f"touch {self.marker}",))


def test_resume_auto_refuses_a_crafted_checkpoint_without_running_it(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    from largebatch.engine.checkpoint import checkpoint_name

    run, marker = tmp_path / "run", tmp_path / "payload-ran"
    (run / "checkpoints").mkdir(parents=True)
    torch.save({"model": {}, "x": _Payload(marker)}, run / "checkpoints" / checkpoint_name(1, 4))
    assert main([*EXACT, f"run_dir={run}", "resume=auto"]) == 2
    assert "not a plain largebatch checkpoint" in _one_error_line(capsys)
    assert not marker.exists()


def test_resume_auto_with_only_damaged_checkpoints_stops(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run = tmp_path / "run"
    assert main([*EXACT, f"run_dir={run}", "max_steps=3", "checkpoint.every_steps=1", "checkpoint.keep=3"]) == 0
    files = list_checkpoints(run / "checkpoints")
    assert len(files) == 3
    for f in files:
        f.write_bytes(f.read_bytes()[:100])
    capsys.readouterr()
    assert main([*EXACT, f"run_dir={run}", "resume=auto", "checkpoint.keep=3"]) == 2
    assert "none of the 3 checkpoint(s)" in _one_error_line(capsys)
    assert list_checkpoints(run / "checkpoints") == files  # nothing deleted, nothing new


@pytest.mark.parametrize("other", ["lamb", "lars"])
def test_resume_with_another_optimizer_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture, other: str) -> None:
    run = tmp_path / "run"
    assert main([*EXACT, f"run_dir={run}", "max_steps=1", "optimizer=sgd"]) == 0
    capsys.readouterr()
    assert main([*EXACT, f"run_dir={run}", "resume=auto", f"optimizer={other}"]) == 2
    assert f"made with optimizer=sgd, not {other}" in _one_error_line(capsys)


def test_resume_that_switches_the_lars_momentum_form_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """The buffers of LARS's two forms mean different things (one is about lr times the other)."""
    run = tmp_path / "run"
    assert main([*EXACT, f"run_dir={run}", "max_steps=1", "optimizer=lars"]) == 0
    capsys.readouterr()
    assert main([*EXACT, f"run_dir={run}", "resume=auto", "optimizer=lars", "optimizer.lr_in_momentum=true"]) == 2
    line = _one_error_line(capsys)
    assert "written with lr_in_momentum=False and this optimizer has lr_in_momentum=True" in line
    assert "resume with lr_in_momentum=False, or start afresh" in line


def test_resume_from_a_weights_only_file_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run = tmp_path / "run"
    assert main([*EXACT, f"run_dir={run}", "max_steps=1"]) == 0
    full = load_checkpoint(list_checkpoints(run / "checkpoints")[-1])
    weights = tmp_path / "weights.pt"
    torch.save({"model": full["model"]}, weights)
    capsys.readouterr()
    assert main([*EXACT, f"run_dir={tmp_path / 'new'}", f"resume={weights}"]) == 2
    assert "holds no optimizer, scheduler, train_state, rng state" in _one_error_line(capsys)


_FULL_DISK_RUN = """
import resource, signal, sys
from largebatch.cli import main
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG)
resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
sys.exit(main(sys.argv[1:]))
"""


def test_a_full_disk_while_checkpointing_exits_74_keeping_earlier_checkpoints(tmp_path: Path) -> None:
    import errno
    import subprocess
    import sys

    from largebatch.errors import EXIT_IO_ERROR

    run = tmp_path / "run"
    assert main([*EXACT, f"run_dir={run}", "max_steps=2"]) == 0
    before = list_checkpoints(run / "checkpoints")
    proc = subprocess.run(
        [sys.executable, "-c", _FULL_DISK_RUN, *EXACT, f"run_dir={run}", "resume=auto", "max_steps=3"],
        capture_output=True, text=True, timeout=300,
    )
    err = proc.stderr.strip()
    assert proc.returncode == EXIT_IO_ERROR == 74, err
    assert err.startswith("largebatch: error: cannot write checkpoint") and "\n" not in err
    assert f"Errno {errno.EFBIG}" in err and str(run / "checkpoints") in err
    assert list_checkpoints(run / "checkpoints") == before and not list((run / "checkpoints").glob(".*.tmp"))
    assert load_checkpoint(before[-1])["train_state"]["step"] == 2


@pytest.mark.parametrize("loader", ["decoded", "torchvision"])
def test_mid_epoch_resume_with_2_loader_workers_is_exact(tmp_path: Path, loader: str) -> None:
    """Stopped mid-epoch and resumed with 2 workers (the decoded store's threads, torchvision's
    worker processes): the weights of the straight run that read with 0 workers, bit for bit:
    the crops depend on (seed, epoch, index) only."""
    exact = [*EXACT, f"data.loader={loader}"]
    assert main([*exact, f"run_dir={tmp_path / 'straight'}"]) == 0
    straight = _final_weights(tmp_path / "straight", expected_step=8)
    run = tmp_path / "run"
    workers = [a for a in exact if not a.startswith("data.workers=")] + ["data.workers=2"]
    assert main([*workers, f"run_dir={run}", "max_steps=5"]) == 0
    assert main([*workers, f"run_dir={run}", "resume=auto", "max_steps=null"]) == 0
    _assert_identical(straight, _final_weights(run, expected_step=8))
    straight_2 = tmp_path / "straight2"
    assert main([*workers, f"run_dir={straight_2}"]) == 0
    _assert_identical(straight, _final_weights(straight_2, expected_step=8))


def test_resume_continues_the_noise_scale_averages(tmp_path: Path) -> None:
    """2 micro-batches a step measure the noise scale; a run stopped mid-epoch and resumed ends
    with the averages, bit for bit, and the weights of the run that did not stop."""
    accumulate = ["accumulation_steps=2"]
    straight, run = tmp_path / "straight", tmp_path / "run"
    assert main([*EXACT, *accumulate, f"run_dir={straight}"]) == 0
    assert main([*EXACT, *accumulate, f"run_dir={run}", "max_steps=5"]) == 0
    stopped = load_checkpoint(list_checkpoints(run / "checkpoints")[-1])
    assert stopped["noise_scale"]["updates"] == 5
    assert main([*EXACT, *accumulate, f"run_dir={run}", "resume=auto", "max_steps=null"]) == 0
    want, got = (load_checkpoint(list_checkpoints(r / "checkpoints")[-1]) for r in (straight, run))
    assert want["noise_scale"]["updates"] == got["noise_scale"]["updates"] == 8
    assert torch.equal(want["noise_scale"]["ema"], got["noise_scale"]["ema"])
    _assert_identical(want["model"], got["model"])
    summaries = [json.loads((r / "summary.json").read_text()) for r in (straight, run)]
    assert summaries[0]["noise_scale_final"] == summaries[1]["noise_scale_final"]


def test_a_resume_where_auto_would_read_with_another_loader_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """Issue 90 case 1: 4 steps read with data.loader=torchvision, then resume=auto without the
    override: auto reads with the decoded store on a CPU host, whose crops differ; before, the run
    went on silently (116 of 130 tensors differed from the straight run). Now one line, exit 2,
    naming both loaders and the override; with it, the run ends bit for bit as a straight one."""
    torchvision = [*EXACT, "data.loader=torchvision"]
    assert main([*torchvision, f"run_dir={tmp_path / 'straight'}"]) == 0
    straight = _final_weights(tmp_path / "straight", expected_step=8)
    run = tmp_path / "run"
    assert main([*torchvision, f"run_dir={run}", "max_steps=4"]) == 0
    assert load_checkpoint(list_checkpoints(run / "checkpoints")[-1])["resolved"]["loader"] == "torchvision"
    capsys.readouterr()
    assert main([*EXACT, f"run_dir={run}", "resume=auto", "max_steps=null"]) == 2
    line = _one_error_line(capsys)
    assert ("trained reading with the torchvision loader, but data.loader=auto now reads with decoded" in line
            and "resume with data.loader=torchvision to continue the run exactly" in line), line
    assert main([*torchvision, f"run_dir={run}", "resume=auto", "max_steps=null"]) == 0
    _assert_identical(straight, _final_weights(run, expected_step=8))
    assert json.loads((run / "summary.json").read_text())["loader"] == "torchvision"


def test_a_loader_named_at_the_resume_is_taken_and_said(tmp_path: Path) -> None:
    """A pipeline the user names at the resume is their choice: the run goes on, and says in one
    line that it is no longer bit-identical to a run that kept the first loader."""
    run = tmp_path / "run"
    assert main([*EXACT, f"run_dir={run}", "max_steps=4", "data.loader=torchvision"]) == 0
    assert main([*EXACT, f"run_dir={run}", "resume=auto", "max_steps=5", "data.loader=decoded"]) == 0
    log = (run / "train.log").read_text()
    assert "resuming with data.loader=decoded, not the torchvision loader checkpoint" in log
    assert "not bit-identical" in log


def test_a_checkpoint_that_records_no_loader_is_named_with_this_runs_loader(caplog: pytest.LogCaptureFixture) -> None:
    """An earlier version's checkpoint does not say which loader read its data: the resume names the one
    this run reads with and how to pin another (it cannot tell whether they differ)."""
    from largebatch.engine.resume import ResumeCheck, check_same_loader

    check = ResumeCheck("resnet10t", "sgd", 8, 8, 4, loader="decoded", requested_loader="auto")
    with caplog.at_level("WARNING", logger="largebatch"):
        check_same_loader(None, check, Path("old.pt"))
        check_same_loader("decoded", check, Path("same.pt"))
    assert len(caplog.records) == 1
    assert "old.pt does not record which loader" in caplog.text and "reads with decoded (data.loader=auto)" in caplog.text


def test_steps_redone_after_a_kill_appear_once_in_metrics_jsonl(tmp_path: Path) -> None:
    """Issue 90 case 6: a run killed after logging steps its last checkpoint does not hold (here:
    its step-8 checkpoint removed, as a SIGKILL before that write leaves it) redoes them when
    resumed; metrics.jsonl listed them twice, time_s going backwards. Now the stale records are
    moved to metrics-abandoned.jsonl and the file is one timeline."""
    run = tmp_path / "run"
    assert main([*EXACT, f"run_dir={run}", "log_every=1"]) == 0
    last = list_checkpoints(run / "checkpoints")[-1]
    assert last.name.endswith("s000000008.pt")
    last.unlink()
    assert main([*EXACT, f"run_dir={run}", "log_every=1", "resume=auto"]) == 0
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["kind"] == "train"]
    assert [r["step"] for r in train] == list(range(1, 9))
    times = [r["time_s"] for r in train]  # the training timeline (an epoch's record follows its checkpoint)
    assert times == sorted(times)
    aside = [json.loads(line) for line in (run / "metrics-abandoned.jsonl").read_text().splitlines()]
    assert {r["step"] for r in aside} == {5, 6, 7, 8}
    assert "record(s) of steps past 4, which this run trains again, moved to" in (run / "train.log").read_text()
