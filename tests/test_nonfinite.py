"""Non-finite losses: ``skip`` undoes the step exactly (or the fp16 scaler skips it, without
moving the LR schedule), bounded by ``max_skipped_steps``; ``stop`` names step and rank.

A NaN is forced the honest way: the test feeds a batch of NaN images (or, through the CLI,
a training transform that makes every image NaN), so the real loop, guard and CLI run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import pytest
import torch
from torch import nn

from largebatch.backends.torch_dist import TorchDistributedBackend
from largebatch.engine.loop import NonFiniteLossError, StepSettings, Trainer
from tests.smoke import smoke


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 3)
    )


def _batches(n: int, nan_at: tuple[int, ...] = ()) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(1)
    out = []
    for i in range(n):
        images = torch.randn(4, 3, 8, 8, generator=gen)
        labels = torch.randint(0, 3, (4,), generator=gen)
        if i in nan_at:
            images = torch.full_like(images, float("nan"))
        out.append((images, labels))
    return out


def _train(
    batches: list, *, policy: str, max_skipped: int = 10, log_every: int = 100, fp16: bool = False,
    constant_lr: bool = False,
) -> Trainer:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0 if constant_lr else 1.0 / (1 + step))
    backend = TorchDistributedBackend("cpu")
    scaler: Optional[torch.amp.GradScaler] = backend.grad_scaler(fp16, 2.0**8, 2000)
    trainer = Trainer(
        model=model, optimizer=opt, scheduler=sched, train_loader=batches, backend=backend,
        settings=StepSettings(epochs=1, global_batch_size=4, log_every=log_every, non_finite=policy,
                              max_skipped_steps=max_skipped, autocast_dtype=torch.float16 if fp16 else None),
        scaler=scaler,
    )
    trainer.train()
    return trainer


def _everything(t: Trainer) -> dict[str, torch.Tensor]:
    out = {f"model.{k}": v for k, v in t.model.state_dict().items()}
    for i, st in enumerate(t.optimizer.state.values()):
        out.update({f"opt.{i}.{k}": v for k, v in st.items() if isinstance(v, torch.Tensor)})
    return out


@pytest.mark.parametrize("nan_at", [0, 2], ids=["first-step", "mid-run"])
def test_skip_policy_matches_a_run_without_the_bad_batch(nan_at: int) -> None:
    """Parameters, BN statistics and momentum end exactly as if the NaN batch never came
    (constant LR: a skipped step still counts for the schedule, which avoids a host sync)."""
    batches = _batches(4)
    with_nan = batches[:nan_at] + _batches(1, nan_at=(0,)) + batches[nan_at:]
    skipped = _train(with_nan, policy="skip", constant_lr=True)
    clean = _train(batches, policy="skip", constant_lr=True)
    assert skipped.state.skipped_steps == 1 and clean.state.skipped_steps == 0
    a, b = _everything(skipped), _everything(clean)
    assert a.keys() == b.keys()
    different = [k for k in a if not torch.equal(a[k], b[k])]
    assert not different, different


def test_skip_policy_gives_up_after_max_skipped_steps() -> None:
    with pytest.raises(NonFiniteLossError, match=r"3 steps skipped.*max_skipped_steps=2.*first at step 2 on rank 0"):
        _train(_batches(6, nan_at=(1, 2, 3)), policy="skip", max_skipped=2, log_every=1)


def test_stop_policy_names_step_and_rank() -> None:
    with pytest.raises(NonFiniteLossError, match=r"not finite at step 3 on rank 0"):
        _train(_batches(6, nan_at=(2,)), policy="stop", log_every=2)


def test_fp16_scaler_skip_does_not_advance_the_lr_schedule() -> None:
    t = _train(_batches(4, nan_at=(1,)), policy="skip", fp16=True)
    assert t.state.step == 4 and t.state.skipped_steps == 1
    assert t.scheduler.last_epoch == 3  # 3 optimizer steps ran
    assert t.scaler.get_scale() < 2.0**8  # the scaler backed off on the NaN step
    assert all(torch.isfinite(v.float()).all() for v in _everything(t).values())


# -- through the CLI: exit code 3 and one line naming step and rank --------------------------

# the torchvision loader, whose training transform _nan_images poisons
TV = "data.loader=torchvision"


def _nan_images(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the real training transform return NaN images (test-side fault injection)."""
    import largebatch.data.pipelines.torchvision as folder

    real = folder.build_train_transform

    def poisoned(*args, **kwargs):  # type: ignore[no-untyped-def]
        transform = real(*args, **kwargs)
        return lambda image: transform(image) * float("nan")

    monkeypatch.setattr(folder, "build_train_transform", poisoned)


@pytest.mark.parametrize(
    "policy,pattern",
    [("stop", "not finite at step 1 on rank 0"), ("skip", "3 steps skipped for a non-finite loss")],
)
def test_cli_exits_3_naming_step_and_rank(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, policy: str, pattern: str
) -> None:
    from largebatch.cli import main
    from largebatch.errors import EXIT_NON_FINITE

    _nan_images(monkeypatch)
    code = main(smoke(TV, "log_every=1", f"non_finite={policy}", "max_skipped_steps=2", f"run_dir={tmp_path / 'run'}"))
    err = capsys.readouterr().err.strip()
    assert code == EXIT_NON_FINITE == 3
    assert err.startswith("largebatch: error:") and "\n" not in err and pattern in err, err
    # stop: nothing non-finite is saved; skip: the weights stayed finite, nothing saved either
    # because the run gave up before a checkpoint step.
    assert not list((tmp_path / "run" / "checkpoints").glob("*.pt"))


def test_a_finite_loss_with_infinite_state_is_never_saved(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """lr=1e6 drives BN running_var to inf while the logged loss may still be finite."""
    from largebatch.cli import main
    from largebatch.errors import EXIT_NON_FINITE
    from largebatch.engine.checkpoint import load_checkpoint

    run = tmp_path / "run"
    code = main([
        "debug=smoke", "progress=false", "tensorboard=false", "data.workers=0", "optimizer.lr=1e6",
        "max_steps=3", "non_finite=stop", "checkpoint.every_steps=1", f"run_dir={run}",
    ])
    err = capsys.readouterr().err.strip()
    assert code == EXIT_NON_FINITE, err
    assert err.startswith("largebatch: error:") and "\n" not in err and "not finite" in err
    for path in (run / "checkpoints").glob("*.pt"):  # what was saved before is all finite
        state = load_checkpoint(path)["model"]
        assert all(torch.isfinite(v).all() for v in state.values() if v.is_floating_point()), path


def test_skipped_steps_are_logged_and_in_the_summary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """Every step skipped: the log lines, summary.json, and metrics.jsonl's train records (a null
    loss, not 0.0, and ``skipped_steps``), which largebatch-report reads."""
    import json

    from largebatch.cli import main

    _nan_images(monkeypatch)
    run = tmp_path / "run"
    assert main(smoke(TV, "log_every=2", "non_finite=skip", "max_skipped_steps=100", "epochs=1", f"run_dir={run}")) == 0
    assert json.loads((run / "summary.json").read_text())["skipped_steps"] == 4
    log = (run / "train.log").read_text()
    assert "step 2: 2 step(s) skipped so far for a non-finite loss" in log
    assert "step 4: 4 step(s) skipped so far" in log
    assert "4 step(s) skipped for a non-finite loss" in capsys.readouterr().out
    # metrics.jsonl says what happened: no loss (null, not a perfect 0.0) and the count so far
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train = [(r["step"], r["loss"], r["skipped_steps"]) for r in records if r["kind"] == "train"]
    assert train == [(2, None, 2), (4, None, 4)], train
    # and largebatch-report reads it, plots included
    from largebatch.report import load_run
    from largebatch.report import main as report

    assert [t["loss"] for t in load_run(run).train] == [None, None]
    assert report([str(run), "--out", str(tmp_path / "plots")]) == 0, capsys.readouterr().err
