"""Weight EMA (timm ``ModelEmaV3``, issue 35): the decay sequence, exact resume, both
accuracies evaluated, the time to target taken from the one ``ema.target`` names."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Optional

import pytest
import torch
from torch import nn

from largebatch.cli import main
from largebatch.engine import hooks as H
from largebatch.engine.checkpoint import list_checkpoints, load_checkpoint
from largebatch.engine.ema import EmaHook, build_model_ema
from largebatch.engine.loop import StepSettings
from tests.test_no_host_sync import HostReads
from tests.smoke import EXACT
from tests.test_resume import _assert_identical


def _tiny() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))


def _expected_decay(n: int, *, decay: float, warmup: bool, gamma: float, power: float, min_decay: float,
                    after: int = 0) -> float:
    """The decay of the n-th update (n >= 1), transcribed from timm's ModelEmaV3.get_decay."""
    k = n - after - 1  # timm: step - update_after_step - 1
    if k <= 0:
        return 0.0  # the first update copies the weights
    if not warmup:
        return decay
    return max(min(1 - (1 + k / gamma) ** -power, decay), min_decay)


def _fake_trainer(model: nn.Module) -> Any:
    return SimpleNamespace(model=model, state=SimpleNamespace(step=0), backend=SimpleNamespace(world_size=1))


def _train_step(model: nn.Module, step: int) -> None:
    """Move every weight and BN statistic, as an optimizer step and a forward would."""
    g = torch.Generator().manual_seed(step)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g))
    model.train()
    model(torch.randn(8, 3, generator=g))  # BN running statistics and num_batches_tracked move


@pytest.mark.parametrize("warmup,every", [(True, 1), (False, 1), (True, 3)], ids=["warmup", "no-warmup", "every-3"])
def test_ema_follows_the_decay_formula(warmup: bool, every: int) -> None:
    decay, gamma, power, min_decay = 0.95, 2.0, 0.75, 0.4  # warmup: clamped below, then rising, then capped
    model = _tiny()
    ema = build_model_ema(model, decay=decay, warmup=warmup, warmup_gamma=gamma, warmup_power=power,
                          min_decay=min_decay)
    hook = EmaHook(ema, every=every)
    hook.trainer = _fake_trainer(model)
    expected = {k: v.detach().double().clone() for k, v in model.state_dict().items() if v.is_floating_point()}
    decays = []
    for step in range(1, 120 * every + 1):
        _train_step(model, step)
        hook.trainer.state.step = step
        hook.after_step()
        if step % every == 0:
            d = _expected_decay(step // every, decay=decay, warmup=warmup, gamma=gamma, power=power,
                                min_decay=min_decay)
            decays.append(d)
            for k, v in model.state_dict().items():
                if k in expected:
                    expected[k] = d * expected[k] + (1 - d) * v.double()
        state = ema.module.state_dict()
        for k, v in expected.items():
            torch.testing.assert_close(state[k].double(), v, rtol=1e-5, atol=1e-6, msg=f"{k} at step {step}")
        if step % every == 0:  # integer buffers are copied
            assert torch.equal(state["1.num_batches_tracked"], model.state_dict()["1.num_batches_tracked"])
    if warmup:  # the sequence went through all three regimes of the formula
        assert decays[0] == 0.0 and decays[1] == min_decay and min_decay < decays[10] < decay and decays[-1] == decay
    else:
        assert decays[0] == 0.0 and set(decays[1:]) == {decay}


def test_tensorflow_ema_is_timm_warmup_with_offset() -> None:
    """update_after_step=-2, gamma 9, power 1: tf.train.ExponentialMovingAverage(decay,
    num_updates=n) uses min(decay, (1 + n) / (10 + n)) (its documented formula)."""
    ema = build_model_ema(_tiny(), decay=0.9999, warmup=True, warmup_gamma=9, warmup_power=1, update_after_step=-2)
    for n in [1, 2, 3, 10, 100, 1_000, 10_000, 89_990, 89_991, 89_992, 200_000]:
        tf = min(0.9999, (1 + n) / (10 + n))
        assert ema.get_decay(n) == pytest.approx(tf, rel=0, abs=1e-15), n
        assert _expected_decay(n, decay=0.9999, warmup=True, gamma=9, power=1, min_decay=0, after=-2) == ema.get_decay(n)


def test_ema_update_reads_nothing_back_to_the_host() -> None:
    model = _tiny()
    hook = EmaHook(build_model_ema(model, decay=0.99, warmup=True))
    hook.trainer = _fake_trainer(model)
    with HostReads() as reads:
        for step in range(1, 6):
            hook.trainer.state.step = step
            hook.after_step()
    assert reads.count == 0, reads.names


def _eval_hook(target: str, raw: list[float], ema: list[float], target_top1: Optional[float]) -> tuple[Any, list]:
    """An EvalHook whose evaluations return the given top-1s for the raw and the EMA model."""
    raw_model, ema_model = nn.Linear(1, 1), nn.Linear(1, 1)
    seen: list[dict] = []
    hook = H.EvalHook([], H.EvalSettings(target_top1=target_top1, top1_of=target), ema_model=lambda: ema_model)
    state = SimpleNamespace(epoch=0, step=0, evals=[], best_top1=-1.0, best_epoch=-1, time_to_target_s=None)
    hook.trainer = SimpleNamespace(
        model=raw_model, settings=StepSettings(epochs=len(raw), global_batch_size=1), state=state, backend=None,
        elapsed=lambda: 10.0 * state.epoch, request_stop=lambda reason: None,
        call=lambda event, metrics: seen.append(metrics),
    )
    return hook, seen


@pytest.mark.parametrize("target", ["raw", "ema"])
def test_evaluation_reports_both_and_times_the_target_named(monkeypatch: pytest.MonkeyPatch, target: str) -> None:
    raw, ema = [50.0, 70.0, 60.0], [40.0, 55.0, 80.0]
    hook, seen = _eval_hook(target, raw, ema, target_top1=65.0)
    calls = iter(x for pair in zip(raw, ema) for x in pair)

    def fake_evaluate(model: nn.Module, loader: Any, **_: Any) -> dict[str, float]:
        return {"top1": next(calls), "top5": 99.0, "loss": 1.0, "total": 10}

    monkeypatch.setattr(H, "evaluate", fake_evaluate)
    for epoch in (1, 2, 3):
        hook.trainer.state.epoch = epoch
        hook.after_epoch()
    assert [m["top1"] for m in seen] == raw and [m["ema_top1"] for m in seen] == ema
    assert all({"top5", "ema_top5", "ema_loss"} <= m.keys() for m in seen)
    s = hook.trainer.state
    if target == "raw":
        assert (s.best_top1, s.best_epoch, s.time_to_target_s) == (70.0, 2, 20.0)
    else:
        assert (s.best_top1, s.best_epoch, s.time_to_target_s) == (80.0, 3, 30.0)


def test_ema_target_needs_an_ema_model() -> None:
    with pytest.raises(ValueError, match="'ema' with an ema_model"):
        H.EvalHook([], H.EvalSettings(top1_of="ema"))


EMA = ["ema.enabled=true", "ema.decay=0.8", "ema.warmup=true", "ema.target=ema", "checkpoint.every_steps=1"]


def _last(run: Path, step: int) -> dict[str, Any]:
    ckpt = load_checkpoint(list_checkpoints(run / "checkpoints")[-1])
    assert ckpt["train_state"]["step"] == step
    return ckpt


@pytest.fixture(scope="module")
def straight_ema(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("straight_ema") / "run"
    assert main([*EXACT, *EMA, f"run_dir={run}"]) == 0
    return run


def test_stop_and_resume_with_ema_is_bit_identical(tmp_path: Path, straight_ema: Path) -> None:
    run = tmp_path / "run"
    assert main([*EXACT, *EMA, f"run_dir={run}", "max_steps=5"]) == 0  # mid-epoch
    assert "ema" in _last(run, 5)
    assert main([*EXACT, *EMA, f"run_dir={run}", "resume=auto", "max_steps=null"]) == 0
    a, b = _last(straight_ema, 8), _last(run, 8)
    _assert_identical(a["model"], b["model"])
    _assert_identical(a["ema"], b["ema"])
    different = [k for k in a["ema"] if a["ema"][k].is_floating_point() and not torch.equal(a["ema"][k], a["model"][k])]
    assert different, "the EMA equals the weights: nothing was averaged"
    final = [json.loads((r / "summary.json").read_text()) for r in (straight_ema, run)]
    for key in ("best_top1", "final_top1", "final_ema_top1", "final_ema_top5"):
        assert final[0][key] == final[1][key], key
    assert final[0]["top1_of"] == "ema"


def test_resume_with_ema_from_a_checkpoint_without_it_starts_from_the_weights(tmp_path: Path) -> None:
    run = tmp_path / "run"
    assert main([*EXACT, f"run_dir={run}", "max_steps=4"]) == 0
    assert "ema" not in _last(run, 4)
    resumed = _last(run, 4)["model"]
    assert main([*EXACT, "ema.enabled=true", "ema.decay=0.9999", f"run_dir={run}", "resume=auto",
                 "max_steps=5", "checkpoint.every_steps=1"]) == 0
    log = (run / "train.log").read_text()
    assert log.count("holds no EMA weights") == 1 and "the EMA starts from its weights at step 4" in log
    # one update (the 5th step, decay 0.9999) after starting from the step-4 weights
    ema = _last(run, 5)["ema"]
    changed = [k for k, v in resumed.items() if v.is_floating_point() and not torch.allclose(ema[k], v, rtol=0, atol=1e-4)]
    assert not changed, changed[:3]


def test_report_of_a_run_without_summary_counts_the_ema_when_the_run_did(tmp_path: Path) -> None:
    """A run killed before summary.json: largebatch-report reads the evaluations themselves."""
    from largebatch.report import load_run

    run = tmp_path / "run"
    run.mkdir()
    records = [
        {"kind": "eval", "epoch": 1, "step": 4, "top1": 70.0, "top5": 90.0, "ema_top1": 50.0, "ema_top5": 80.0,
         "top1_of": "ema", "wall_s": 10.0},
        {"kind": "eval", "epoch": 2, "step": 8, "top1": 60.0, "top5": 90.0, "ema_top1": 66.0, "ema_top5": 85.0,
         "top1_of": "ema", "wall_s": 20.0},
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (run / "mlperf_log.jsonl").write_text(json.dumps({"key": "target_accuracy", "value": 0.65}) + "\n")
    r = load_run(run)
    assert (r.best_top1, r.time_to_target_s) == (66.0, 20.0)  # raw would give 70.0 and 10.0
