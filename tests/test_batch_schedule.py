"""Batch-size control (``batch_schedule``, issue 57): the schedule's arithmetic and checks, the lr
on the samples' clock, and real CPU runs that raise the batch by accumulation or by the per-device
batch, resumed inside each phase bit for bit."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from largebatch.batch_schedule import BatchSchedule
from largebatch.cli import main
from largebatch.engine.checkpoint import list_checkpoints, load_checkpoint
from largebatch.engine.loop import Trainer
from largebatch.errors import ConfigError, UsageError
from largebatch.lr import build_lr_scheduler
from tests.smoke import EXACT, smoke

# ---------------------------------------------------------------------------------------
# the arithmetic


def test_each_phase_has_its_batch_factor_and_steps() -> None:
    """Mikami et al.'s form: a small batch first, raised in steps (here x2 at epoch 2, x4 at 5)."""
    s = BatchSchedule.of([[2, 512], [5, 1024]], global_batch_size=256, epochs=8)
    assert [s.batch_at(e) for e in range(8)] == [256, 256, 512, 512, 512, 1024, 1024, 1024]
    assert [s.factor_at(e) for e in (0, 2, 7)] == [1, 2, 4]
    assert [s.steps_in_epoch(e, 10) for e in (0, 2, 5)] == [10, 5, 2]  # 10 // 4: the tail dropped
    assert s.total_steps(8, 10) == 2 * 10 + 3 * 5 + 3 * 2
    assert s.describe() == "256, 512 from epoch 2, 1024 from epoch 5 (accumulation; lr linear-scaled per phase)"


def test_the_samples_clock_counts_epochs_whatever_the_batch() -> None:
    s = BatchSchedule.of([[1, 16], [2, 32]], global_batch_size=8, epochs=4)
    base = 8  # steps of an epoch at the base batch: then 4, then 2 per epoch
    positions = [s.epoch_position(n, base) for n in range(8 + 4 + 2 + 2 + 1)]
    assert positions[:9] == [n / 8 for n in range(9)]
    assert positions[8:13] == [1.0, 1.25, 1.5, 1.75, 2.0]
    assert positions[12:] == [2.0, 2.5, 3.0, 3.5, 4.0]
    assert BatchSchedule.of([], global_batch_size=8, epochs=4) is None


def test_the_lr_follows_the_scaling_rule_per_phase_or_is_held() -> None:
    linear = BatchSchedule.of([[1, 32]], global_batch_size=8, epochs=2, lr_scaling="linear")
    root = BatchSchedule.of([[1, 32]], global_batch_size=8, epochs=2, lr_scaling="sqrt")
    held = BatchSchedule.of([[1, 32]], global_batch_size=8, epochs=2, lr="hold")
    assert [linear.lr_ratio(e) for e in (0, 1)] == [1.0, 4.0]
    assert [root.lr_ratio(e) for e in (0, 1)] == [1.0, 2.0]
    assert [held.lr_ratio(e) for e in (0, 1)] == [1.0, 1.0]


@pytest.mark.parametrize("steps,pattern", [
    ([[0, 16]], "epochs ascending in 1..3"),
    ([[4, 16]], "epoch 4 is not below epochs=4 (a step's epoch lies in 1..3); set epochs= above 4, or move"),
    ([[2, 16], [1, 32]], "batch_schedule.steps=[[2, 16], [1, 32]] is out of range"),
    ([[1, 12]], "whole multiple of global_batch_size (8)"),
    ([[1, 4]], "whole multiple of global_batch_size (8)"),
    ([[1, 16, 2]], "[[epoch, global_batch], ...]"),
    ([[1.5, 16]], "[[epoch, global_batch], ...]"),
])
def test_bad_schedules_are_one_clear_error(steps: list[list[Any]], pattern: str) -> None:
    with pytest.raises(ConfigError) as err:
        BatchSchedule.of(steps, global_batch_size=8, epochs=4)
    assert pattern in str(err.value) and "\n" not in str(err.value)


def test_bad_settings_stop_at_compose_time_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    for bad, pattern in ((["batch_schedule.steps=[[1,12]]"], "batch_schedule.steps=[[1, 12]] is out of range"),
                         (["batch_schedule.via=sideways"], "batch_schedule.via"),
                         (["batch_schedule.steps=[[1,16]]", "model.compile=reduce-overhead"],
                          "batch_schedule.via=per_device")):
        assert main(smoke("epochs=2", *bad, f"run_dir={tmp_path / 'run'}")) == 2
        err = capsys.readouterr().err.strip()
        assert pattern in err and "\n" not in err, err
        assert not (tmp_path / "run").exists()  # refused before anything was written


def test_the_lr_schedule_runs_on_samples_and_jumps_only_by_the_rule() -> None:
    """Warmup + cosine over 4 epochs of 8 base steps, the batch x2 from epoch 1 and x4 from 2:
    the lr divided by the phase's ratio is the unscheduled lr at the same epoch position."""
    def lrs(schedule: BatchSchedule | None, steps: int) -> list[float]:
        p = torch.nn.Parameter(torch.zeros(1))
        opt = torch.optim.SGD([p], lr=1.0)
        sched = build_lr_scheduler(opt, name="cosine", steps_per_epoch=8, epochs=4, warmup_epochs=1.5,
                                   warmup_start_factor=0.1, batch_schedule=schedule)
        out = []
        for _ in range(steps):
            out.append(opt.param_groups[0]["lr"])
            opt.step()
            sched.step()
        return out

    s = BatchSchedule.of([[1, 16], [2, 32]], global_batch_size=8, epochs=4)
    plain = lrs(None, 32)
    scheduled = lrs(s, 8 + 4 + 2 + 2)
    for n, lr in enumerate(scheduled):
        position = s.epoch_position(n, 8)
        base_step = position * 8
        assert base_step == int(base_step)  # every step lands on a base step here
        assert lr == pytest.approx(plain[int(base_step)] * s.lr_ratio(int(position)), rel=1e-12)
    assert scheduled[8] / scheduled[7] == pytest.approx(2 * plain[8] / plain[7])  # the rule's x2, no more


def test_the_loop_refuses_an_epoch_without_an_optimizer_step() -> None:
    """The Trainer refuses, before any step, a loader that cannot fill the accumulation steps and
    a phase whose global batch is larger than an epoch's images (issue 71: the checks moved out
    of ``Trainer.__init__`` into a method of their own)."""
    from largebatch.backends.torch_dist import TorchDistributedBackend
    from largebatch.engine.loop import StepSettings

    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0)
    batch = (torch.zeros(4, 2), torch.zeros(4, dtype=torch.long))

    def trainer(batches: int, settings: StepSettings) -> Trainer:
        return Trainer(model=model, optimizer=opt, scheduler=sched, train_loader=[batch] * batches,
                       backend=TorchDistributedBackend("cpu"), settings=settings)

    with pytest.raises(UsageError, match="an epoch has no optimizer step: 1 batches per rank for 2 accumulation"):
        trainer(1, StepSettings(epochs=1, global_batch_size=8, accumulation_steps=2))
    phases = BatchSchedule.of([[1, 64]], global_batch_size=4, epochs=2)  # 16 images an epoch, then 64 a step
    with pytest.raises(UsageError, match="epoch 1 has no optimizer step: its global batch 64 is larger than the "
                                         "16 images of an epoch"):
        trainer(4, StepSettings(epochs=2, global_batch_size=4, batch_schedule=phases))
    assert trainer(4, StepSettings(epochs=2, global_batch_size=4)).steps_per_epoch == 4


# ---------------------------------------------------------------------------------------
# real runs: 4 classes x 16 images, base batch 8: 8 base steps per epoch


DATA = ["data.synthetic.train_per_class=16", "epochs=3"]
PHASES = ["batch_schedule.steps=[[1,16],[2,32]]"]  # 8 steps of 8, 4 of 16, 2 of 32


@pytest.fixture
def forward_sizes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The batch size of every training forward (Trainer.loss)."""
    seen: list[int] = []
    loss = Trainer.loss

    def recording(self: Trainer, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        seen.append(images.shape[0])
        return loss(self, images, labels)

    monkeypatch.setattr(Trainer, "loss", recording)
    return seen


def _records(run: Path, kind: str) -> list[dict[str, Any]]:
    return [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["kind"] == kind]


# the forwards of each way of raising the batch: 1, 2, then 4 micro-batches of 8 per step, or one
# forward of the whole per-device batch
SIZES = {"accumulation": [8] * 8 + [8] * 8 + [8] * 8, "per_device": [8] * 8 + [16] * 4 + [32] * 2}


@pytest.fixture(scope="module", params=["accumulation", "per_device"])
def phased(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path, list[int]]:
    """One uninterrupted run per ``via`` (exact: resumable bit for bit), its directory and the batch
    size of each training forward; read by the run's own checks and by the resumes' comparison."""
    via = request.param
    run = tmp_path_factory.mktemp(f"phased-{via}") / "straight"
    seen: list[int] = []
    loss = Trainer.loss

    def recording(self: Trainer, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        seen.append(images.shape[0])
        return loss(self, images, labels)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Trainer, "loss", recording)
        assert main([*EXACT, *DATA, *PHASES, f"batch_schedule.via={via}", f"run_dir={run}"]) == 0
    return via, run, seen


# the tests that read a module fixture's run share one pytest-xdist worker, where it runs once
@pytest.mark.xdist_group("batch_schedule_phased")
def test_a_run_raises_the_batch_per_phase(phased: tuple[str, Path, list[int]]) -> None:
    via, run, sizes = phased
    assert sizes == SIZES[via]
    epochs = _records(run, "epoch")
    assert [(r["epoch"], r["step"], r["global_batch_size"]) for r in epochs] == [(1, 8, 8), (2, 12, 16), (3, 14, 32)]
    log = (run / "train.log").read_text()
    assert "batch schedule: global batch 8, 16 from epoch 1, 32 from epoch 2" in log
    assert "epoch 2/3: global batch 16 (was 8)" in log and "epoch 3/3: global batch 32 (was 16)" in log
    events = [json.loads(line) for line in (run / "mlperf_log.jsonl").read_text().splitlines()]
    changes = [(e["value"], e["metadata"].get("epoch_num")) for e in events if e["key"] == "global_batch_size"]
    assert changes == [(8, None), (16, 2), (32, 3)]  # the run_start value, then each change
    # summary.json keeps the batches reached beside the base, and largebatch-report shows them
    summary = json.loads((run / "summary.json").read_text())
    assert (summary["global_batch_size"], summary["global_batch_size_per_epoch"],
            summary["final_global_batch_size"]) == (8, [8, 16, 32], 32)
    assert _report_batch_column(run) == "8->16->32"


def _report_batch_column(run: Path) -> str:
    """The "global batch" cell of largebatch-report's table for ``run`` (one run: no spaces in cells)."""
    from largebatch.report import main as report

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert report([str(run), "--no-plots"]) == 0
    head, _, row = out.getvalue().splitlines()[:3]
    assert head.split()[-4:] == ["global", "batch", "world", "size"], head
    return row.split()[-2]


def test_without_a_schedule_nothing_changes(tmp_path: Path, forward_sizes: list[int]) -> None:
    run = tmp_path / "run"
    assert main(smoke(*DATA, f"run_dir={run}")) == 0
    assert forward_sizes == [8] * 24
    assert all("global_batch_size" not in r for r in _records(run, "epoch"))
    assert "batch schedule" not in (run / "train.log").read_text()
    summary = json.loads((run / "summary.json").read_text())
    assert (summary["global_batch_size_per_epoch"], summary["final_global_batch_size"]) == ([8, 8, 8], 8)
    assert _report_batch_column(run) == "8"


def test_the_lr_of_each_phase_is_the_rule_times_the_samples_clock(tmp_path: Path) -> None:
    """The lr logged after step n is the next step's: x2 of the constant base lr from step 9 (the
    first of epoch 1), x4 from step 13 (the first of epoch 2)."""
    run = tmp_path / "run"
    assert main(smoke(*DATA, *PHASES, "schedule=constant", "schedule.warmup_epochs=0", "log_every=1",
                      f"run_dir={run}")) == 0
    lr = {r["step"]: r["lr"] for r in _records(run, "train")}
    base = lr[1]
    assert [lr[7], lr[8], lr[11], lr[12]] == pytest.approx([base, 2 * base, 2 * base, 4 * base])
    held = tmp_path / "held"
    assert main(smoke(*DATA, *PHASES, "batch_schedule.lr=hold", "schedule=constant", "schedule.warmup_epochs=0",
                      "log_every=1", f"run_dir={held}")) == 0
    assert {r["lr"] for r in _records(held, "train")} == {base}


def _weights(run: Path, step: int) -> dict[str, torch.Tensor]:
    last = load_checkpoint(list_checkpoints(run / "checkpoints")[-1])
    assert last["train_state"]["step"] == step
    return last["model"]


@pytest.mark.xdist_group("batch_schedule_phased")
def test_resumed_inside_each_phase_the_run_is_bit_identical(tmp_path: Path, phased: tuple[str, Path, list[int]],
                                                            forward_sizes: list[int]) -> None:
    """Stopped at step 3 (phase 1, epoch 0), 10 (phase 2, epoch 1 half done) and 13 (phase 3,
    epoch 2 half done), each resumed: the weights of the uninterrupted run, and the same forwards."""
    via, straight, uninterrupted = phased
    exact = [*EXACT, *DATA, *PHASES, f"batch_schedule.via={via}"]
    run = tmp_path / "run"
    for stop in (3, 10, 13):
        assert main([*exact, f"run_dir={run}", f"max_steps={stop}", *(["resume=auto"] if stop > 3 else [])]) == 0
        state = load_checkpoint(list_checkpoints(run / "checkpoints")[-1])["train_state"]
        assert (state["step"], state["epoch"], state["epoch_step"]) == {3: (3, 0, 3), 10: (10, 1, 2),
                                                                        13: (13, 2, 1)}[stop]
    assert main([*exact, f"run_dir={run}", "resume=auto", "max_steps=null"]) == 0
    assert forward_sizes == uninterrupted
    a, b = _weights(straight, 14), _weights(run, 14)
    assert [k for k in a if not torch.equal(a[k], b[k])] == []
    assert load_checkpoint(list_checkpoints(run / "checkpoints")[-1])["train_state"]["images_seen"] == 3 * 64


@pytest.mark.parametrize("via,small", [("accumulation", [4, 4, 4]), ("per_device", [4, 8, 16])])
def test_the_noise_scale_is_measured_over_each_phases_batches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture, via: str,
                                                             small: list[int]) -> None:
    """accumulation_steps=2 on one process measures the first micro-batch against the step: the
    step's gradient grows with the batch (8 -> 16 -> 32 images); the micro-batch stays 4 images when
    the schedule adds micro-batches, and grows with the per-device batch when it concatenates."""
    from largebatch.diagnostics.noise_scale import GradientNoiseScale

    pairs: list[tuple[int, int]] = []
    update = GradientNoiseScale.update

    def recording(self: Any, sq_small: torch.Tensor, b_small: float, sq_big: torch.Tensor, b_big: float) -> None:
        pairs.append((int(b_small), int(b_big)))
        update(self, sq_small, b_small, sq_big, b_big)

    monkeypatch.setattr(GradientNoiseScale, "update", recording)
    run = tmp_path / "run"
    assert main(smoke(*DATA, *PHASES, "accumulation_steps=2", f"batch_schedule.via={via}", f"run_dir={run}")) == 0
    assert pairs == [(small[0], 8)] * 8 + [(small[1], 16)] * 4 + [(small[2], 32)] * 2
    assert json.loads((run / "summary.json").read_text())["noise_scale_final"] is not None
    assert "; your global batch is 32" in capsys.readouterr().out  # the closing line: the last phase's


@pytest.fixture(scope="module")
def stopped_at_2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run of DATA + PHASES stopped after step 2, which the resumes below are refused."""
    run = tmp_path_factory.mktemp("stopped") / "run"
    assert main(smoke(*DATA, *PHASES, f"run_dir={run}", "max_steps=2")) == 0
    return run


@pytest.mark.xdist_group("batch_schedule_stopped")
def test_a_resume_with_another_batch_schedule_is_refused(stopped_at_2: Path, capsys: pytest.CaptureFixture) -> None:
    capsys.readouterr()
    assert main(smoke(*DATA, "batch_schedule.steps=[[1,32]]", f"run_dir={stopped_at_2}", "resume=auto")) != 0
    err = capsys.readouterr().err.strip()
    assert "belongs to another run" in err and "batch_schedule.steps=[[1, 32]]" in err and "\n" not in err


def test_a_step_past_the_last_epoch_names_epochs_as_the_cause(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Issue 75, item 7: at epochs=1 the range was printed as "1..0", with no word of epochs."""
    assert main(smoke("epochs=1", "batch_schedule.steps=[[1,16]]", f"run_dir={tmp_path / 'run'}")) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("largebatch: error: batch_schedule.steps=[[1, 16]] needs epochs >= 2 (a step's epoch lies in "
                   "1..epochs-1), but epochs=1: set epochs= above 1, or batch_schedule.steps=[]"), err
    assert not (tmp_path / "run").exists()


def test_a_lowered_batch_runs_each_phase_and_resumes_bit_identical(tmp_path: Path, forward_sizes: list[int]) -> None:
    """A schedule may lower the batch (fastai2018_rn50_128gpu goes 16K -> 8K): each epoch has its
    own factor, the data order does not depend on it, so 8 -> 32 -> 16 trains 8 + 2 + 4 steps and
    a run stopped inside the lowered phase resumes to the uninterrupted run's weights."""
    exact = [*EXACT, *DATA, "batch_schedule.steps=[[1,32],[2,16]]", "batch_schedule.via=per_device"]
    straight = tmp_path / "straight"
    assert main([*exact, f"run_dir={straight}"]) == 0
    assert forward_sizes == [8] * 8 + [32] * 2 + [16] * 4
    epochs = _records(straight, "epoch")
    assert [(r["epoch"], r["step"], r["global_batch_size"]) for r in epochs] == [(1, 8, 8), (2, 10, 32), (3, 14, 16)]
    assert "epoch 3/3: global batch 16 (was 32)" in (straight / "train.log").read_text()
    run = tmp_path / "run"
    assert main([*exact, f"run_dir={run}", "max_steps=11"]) == 0  # epoch 2's first step of 16
    assert main([*exact, f"run_dir={run}", "resume=auto", "max_steps=null"]) == 0
    a, b = _weights(straight, 14), _weights(run, 14)
    assert [k for k in a if not torch.equal(a[k], b[k])] == []


@pytest.mark.xdist_group("batch_schedule_stopped")
def test_a_resume_refusal_prints_values_as_written(stopped_at_2: Path, capsys: pytest.CaptureFixture) -> None:
    """Issue 75, item 7: the run's own side was printed as its enum (BatchGrowth.per_device)."""
    capsys.readouterr()
    assert main(smoke(*DATA, *PHASES, "batch_schedule.via=per_device", f"run_dir={stopped_at_2}", "resume=auto")) == 2
    err = capsys.readouterr().err.strip()
    assert ("it was made with batch_schedule.via=accumulation, this run has batch_schedule.via=per_device;"
            in err and "\n" not in err), err


def test_a_checkpoint_from_before_the_setting_resumes_with_it_off() -> None:
    from omegaconf import OmegaConf

    from largebatch.config import compose_config
    from largebatch.engine.resume import check_same_run

    now = json.loads(json.dumps(OmegaConf.to_container(compose_config(["debug=smoke"]), resolve=True),
                                default=lambda e: e.value))
    old = {k: v for k, v in now.items() if k != "batch_schedule"}
    check_same_run(old, now, Path("ckpt.pt"))  # no error
    now["batch_schedule"]["steps"] = [[1, 16]]
    with pytest.raises(Exception, match=r"made with batch_schedule.steps=\[\], this run has batch_schedule.steps=\[\[1, 16\]\]"):
        check_same_run(old, now, Path("ckpt.pt"))


# ---------------------------------------------------------------------------------------
# the adaptive schedule: the batch raised by the measured noise scale


def test_the_adaptive_rule_raises_past_the_threshold_within_its_bounds() -> None:
    from largebatch.batch_schedule import AdaptiveBatchSchedule

    s = AdaptiveBatchSchedule.of_adaptive(global_batch_size=8, raise_at=2.0, growth=2, max_batch=32)
    assert not s.decide(0, 1e9, base_steps=8)  # epoch 0: nothing measured yet
    assert not s.decide(1, 15.9, base_steps=8)  # under 2 x 8
    assert s.decide(2, 16.0, base_steps=8)  # 2 x 8: raised to 16
    assert not s.decide(3, float("inf"), base_steps=8) and not s.decide(4, float("nan"), base_steps=8)
    assert s.decide(5, 40.0, base_steps=8) and not s.decide(6, 1e9, base_steps=8)  # 32 is the cap
    assert s.factors == [1, 1, 2, 2, 2, 4, 4] and s.batch_at(9) == 32
    assert s.possible_factors() == [1, 2, 4]
    tight = AdaptiveBatchSchedule.of_adaptive(global_batch_size=8, raise_at=1.0, growth=4, max_batch=None)
    assert tight.decide(0, 0, base_steps=3) is False and tight.decide(1, 1e9, base_steps=3) is False  # no whole step
    with pytest.raises(ValueError, match="out of order"):
        tight.decide(5, 1.0, base_steps=3)


def test_a_kept_batch_says_which_bound_kept_it() -> None:
    """Issue 75, item 7: every kept batch was put down to the threshold, even one kept because the
    raised batch would pass the cap or the epoch's images."""
    from largebatch.batch_schedule import AdaptiveBatchSchedule

    s = AdaptiveBatchSchedule.of_adaptive(global_batch_size=8, raise_at=2.0, growth=2, max_batch=32)
    assert s.why_kept(1, 15.9, base_steps=8) == "a raise needs >= 2 x 8"
    assert s.why_kept(2, float("nan"), base_steps=8) == "a raise needs >= 2 x 16"
    assert s.why_kept(4, 1e9, base_steps=8) == "64 would pass batch_schedule.adaptive.max_global_batch=32"
    assert s.why_kept(2, 1e9, base_steps=3) == "32 would exceed the 24 images of an epoch"
    assert s.why_kept(1, 16.0, base_steps=8) is None


@pytest.mark.parametrize("bad,pattern", [
    (["batch_schedule.adaptive.growth=1"], "batch_schedule.adaptive.growth=1 is out of range"),
    (["batch_schedule.adaptive.raise_at=0"], ("batch_schedule.adaptive.raise_at=0.0 is out of range: it must be a "
                                              "finite number > 0")),
    # never raising is the fixed batch: the message says which switch that is (issue 75, item 7)
    (["batch_schedule.adaptive.raise_at=inf"], ("batch_schedule.adaptive.raise_at=inf never raises the batch: to "
                                                "keep global_batch_size, set batch_schedule.adaptive.enabled=false; "
                                                "to raise it, set batch_schedule.adaptive.raise_at= to a finite "
                                                "number > 0")),
    (["batch_schedule.adaptive.max_global_batch=12"], "batch_schedule.adaptive.max_global_batch=12 is out of range"),
    (["batch_schedule.steps=[[1,16]]"], "set batch_schedule.steps=[] or batch_schedule.adaptive.enabled=false"),
])
def test_bad_adaptive_settings_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture, bad: list[str],
                                            pattern: str) -> None:
    assert main(smoke("batch_schedule.adaptive.enabled=true", *bad, f"run_dir={tmp_path / 'run'}")) == 2
    err = capsys.readouterr().err.strip()
    assert pattern in err and "\n" not in err, err


def test_adaptive_needs_the_noise_scale_measured(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(smoke("batch_schedule.adaptive.enabled=true", f"run_dir={tmp_path / 'run'}")) != 0
    err = capsys.readouterr().err.strip()
    assert "which this run does not measure (one process, no accumulation)" in err and "\n" not in err, err


ADAPTIVE = ["accumulation_steps=2", "batch_schedule.adaptive.enabled=true", "batch_schedule.adaptive.max_global_batch=32",
            "epochs=4"]


@pytest.fixture
def noise_of(monkeypatch: pytest.MonkeyPatch) -> dict[str, float]:
    """The noise scale every decision reads (the tracker still updates: its measurement is tested
    above); a large value raises at every epoch start the bounds allow."""
    from largebatch.diagnostics.noise_scale import GradientNoiseScale

    value = {"now": 1e6}
    monkeypatch.setattr(GradientNoiseScale, "noise_scale", lambda self: torch.tensor(value["now"]))
    return value


def test_an_adaptive_run_raises_its_batch_and_resumes_bit_identical(tmp_path: Path, noise_of: dict[str, float],
                                                                   forward_sizes: list[int]) -> None:
    """Raised at each epoch start to the cap: 8, 16, 32, 32 (8 + 4 + 2 + 2 steps); stopped inside
    epoch 2 (the decision made before the stop) and resumed: the uninterrupted run's weights."""
    exact = [*EXACT, "data.synthetic.train_per_class=16", *ADAPTIVE]
    straight = tmp_path / "straight"
    assert main([*exact, f"run_dir={straight}"]) == 0
    assert [r["global_batch_size"] for r in _records(straight, "epoch")] == [8, 16, 32, 32]
    assert "epoch 2/4: gradient noise scale ~1000000 images, global batch 8: raised to 16" in (
        straight / "train.log").read_text()
    run = tmp_path / "run"
    assert main([*exact, f"run_dir={run}", "max_steps=13"]) == 0
    state = load_checkpoint(list_checkpoints(run / "checkpoints")[-1])["train_state"]
    assert (state["epoch"], state["epoch_step"], state["batch_factors"]) == (2, 1, [1, 2, 4])
    # the resumed run keeps the decisions its checkpoint carries (epoch 2 stays x4, not re-decided
    # from the new reading); epoch 3 is at the cap either way
    noise_of["now"] = 0.0
    assert main([*exact, f"run_dir={run}", "resume=auto", "max_steps=null"]) == 0
    assert [r["global_batch_size"] for r in _records(run, "epoch")][-2:] == [32, 32]
    a, b = _weights(straight, 16), _weights(run, 16)
    assert [k for k in a if not torch.equal(a[k], b[k])] == []


def test_an_adaptive_batch_kept_by_the_epochs_images_says_so(tmp_path: Path, noise_of: dict[str, float]) -> None:
    """32 images, base batch 8: raised to 16 and 32, then x2 = 64 would exceed the epoch's images
    (the log said "a raise needs >= 2 x 32", which the reading of 1e6 met)."""
    run = tmp_path / "run"
    assert main(smoke("accumulation_steps=2", "batch_schedule.adaptive.enabled=true", "epochs=4",
                      f"run_dir={run}")) == 0
    assert [r["global_batch_size"] for r in _records(run, "epoch")] == [8, 16, 32, 32]
    assert ("epoch 4/4: gradient noise scale ~1000000 images, global batch 32: kept (64 would exceed the 32 "
            "images of an epoch)") in (run / "train.log").read_text()
    # the batches reached: in summary.json, the report's column and its noise-scale plot's batch line
    summary = json.loads((run / "summary.json").read_text())
    assert (summary["global_batch_size"], summary["global_batch_size_per_epoch"],
            summary["final_global_batch_size"]) == (8, [8, 16, 32, 32], 32)
    assert _report_batch_column(run) == "8->16->32"
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from largebatch.report import main as report

    dashed: list = []
    flat: list = []
    real_plot, real_axhline = plt.Axes.plot, plt.Axes.axhline
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(plt.Axes, "plot", lambda ax, *a, **k: (k.get("linestyle") == "--" and dashed.append(
            (list(a[0]), list(a[1]), k["label"]))) or real_plot(ax, *a, **k))
        mp.setattr(plt.Axes, "axhline", lambda ax, y, **k: flat.append(y) or real_axhline(ax, y, **k))
        assert report([str(run), "--out", str(tmp_path / "plots")]) == 0
    # 4 steps of 8, 2 of 16, then 1 of 32 in each of the last two epochs; no flat line at the base
    assert dashed == [([0, 4, 4, 6, 6, 7, 7, 8], [8, 8, 16, 16, 32, 32, 32, 32], "run: global batch 8->16->32")]
    assert 8 not in flat, flat
