"""The noise scale's wiring into the loop (largebatch.engine.noise_scale_hook), on one process.

Where each measurement applies (:func:`plan_noise_scale`), and the loss scale taken out: a
power-of-two loss scale multiplies every gradient exactly, so the averages of a loss-scaled run
equal those of an unscaled one bit for bit once the scale² is divided out on the device.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from largebatch.backends.torch_dist import TorchDistributedBackend
from largebatch.engine.loop import StepSettings, Trainer
from largebatch.engine.noise_scale_hook import NoiseScaleHook, NoiseScalePlan, plan_noise_scale


def test_the_plan_uses_what_the_run_has() -> None:
    tap = object()
    assert plan_noise_scale(world_size=4, accumulation_steps=2, per_device_batch=8, local_norm_tap=tap) == \
        NoiseScalePlan("ranks", 16, 64)
    assert plan_noise_scale(world_size=1, accumulation_steps=4, per_device_batch=8, local_norm_tap=None) == \
        NoiseScalePlan("micro-batches", 8, 32)
    none = plan_noise_scale(world_size=1, accumulation_steps=1, per_device_batch=8, local_norm_tap=None)
    assert none.source is None and none.reason == "one process, no accumulation"
    untapped = plan_noise_scale(world_size=2, accumulation_steps=1, per_device_batch=8, local_norm_tap=None)
    assert untapped.source is None


def test_the_probe_is_refused_on_xla_and_with_cuda_graphs_and_the_plan_says_so() -> None:
    """The feature's own policy (issue 71: it was the run's): the probe only where it was tried,
    the refusal's reason and the start-up line from the plan."""
    one = dict(world_size=1, accumulation_steps=1, per_device_batch=8, local_norm_tap=None, probe_every=4)
    probe = plan_noise_scale(**one)
    assert probe == NoiseScalePlan("probe", 4, 8, probe_every=4)
    assert probe.describe(0.99) == ("noise scale: measured by a probe every 4 steps (4 vs 8 images per gradient): "
                                    "one extra backward per probe, ~25% of steps, EMA beta 0.99")
    on_xla = plan_noise_scale(**one, xla=True)
    assert on_xla.source is None and "accumulation_steps >= 2" in on_xla.reason
    graphs = plan_noise_scale(**one, cuda_graphs=True)
    assert graphs.source is None and graphs.describe(0.9) == (
        "noise scale: not measured (the probe does not run with CUDA graphs (model.compile=reduce-overhead))")
    # what comes free is not refused: accumulation on XLA, ranks with CUDA graphs
    assert plan_noise_scale(**{**one, "accumulation_steps": 2}, xla=True).source == "micro-batches"
    assert plan_noise_scale(**{**one, "world_size": 2, "local_norm_tap": object()}, cuda_graphs=True).describe(0.9) == \
        "noise scale: measured from ranks (8 vs 16 images per gradient), EMA beta 0.9"


def _run(scaler: object, accumulation: int = 2) -> NoiseScaleHook:
    gen = torch.Generator().manual_seed(1)
    batches = [(torch.randn(4, 3, 8, 8, generator=gen), torch.randint(0, 3, (4,), generator=gen)) for _ in range(8)]
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.3)
    plan = plan_noise_scale(world_size=1, accumulation_steps=accumulation, per_device_batch=4, local_norm_tap=None)
    hook = NoiseScaleHook(plan, beta=0.5)
    Trainer(model=model, optimizer=opt, scheduler=torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0),
            train_loader=batches, backend=TorchDistributedBackend("cpu"), scaler=scaler, hooks=[hook],
            settings=StepSettings(epochs=1, global_batch_size=4 * accumulation, accumulation_steps=accumulation,
                                  log_every=100)).train()
    return hook


def test_the_loss_scale_is_divided_out() -> None:
    plain = _run(None)
    scaled = _run(torch.amp.GradScaler("cpu", init_scale=2.0**12, growth_interval=1000))
    assert plain.tracker.updates == scaled.tracker.updates == 4
    assert torch.isfinite(plain.tracker.noise_trace())
    torch.testing.assert_close(scaled.tracker.state_dict()["ema"], plain.tracker.state_dict()["ema"], rtol=0, atol=0)


def test_the_step_view_gives_the_loss_scale_its_gradients_carry() -> None:
    """Issue 71: the hook reads the loss scale from what the loop publishes (``Trainer.step_view``),
    not the scaler's private ``_scale``: the scale after a backward, as a device tensor of the
    asked dtype; None without a scaler or with a disabled one; ``scaled`` is what backward takes."""
    from largebatch.engine.loop import StepView

    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**12, growth_interval=1000)
    loss = torch.tensor(3.0, requires_grad=True)
    view = StepView((), lambda x, y: loss, scaler)
    view.scaled(loss).backward()
    like = torch.zeros((), dtype=torch.float64)
    scale = view.loss_scale(like)
    assert scale is not None and scale.dtype == torch.float64 and scale.item() == scaler.get_scale() == 2.0**12
    assert loss.grad is not None and loss.grad.item() == 2.0**12
    assert StepView((), view.loss).loss_scale(like) is None
    assert StepView((), view.loss, torch.amp.GradScaler("cpu", enabled=False)).loss_scale(like) is None
    assert StepView((), view.loss).scaled(loss) is loss


def test_an_overflowed_step_is_left_out() -> None:
    """A scale that overflows the first step's gradients: the scaler skips the step, and so does the
    tracker (inf norms), chosen on the device."""
    hook = _run(torch.amp.GradScaler("cpu", init_scale=3.0e38, growth_interval=1000))
    ema = hook.tracker.state_dict()["ema"]
    assert torch.isfinite(ema).all()
    assert ema[2] < 1 - 0.5**4  # fewer than 4 steps folded in (the EMA of ones is 1 - beta^t)


@pytest.mark.parametrize("accumulation", [1])
def test_not_measured_leaves_the_tracker_alone(accumulation: int) -> None:
    hook = _run(None, accumulation)
    assert hook.tracker.updates == 0 and hook.report(4)[1] == "noise scale: not measured (one process, no accumulation)"


def test_a_backend_that_reduces_in_its_optimizer_step_gives_the_pair_at_the_reduction() -> None:
    """XLA's order, stood in on CPU: the tap's local norm after the last backward, the reduced
    norm in the optimizer's step pre-hook, after the backend's reduction (here: x 1/2) and before
    the update. The XLA:CPU replicas test the real thing (tests/xla/test_noise_scale_xla.py)."""
    from largebatch.backends.xla import XlaLocalNormTap
    from largebatch.diagnostics.noise_scale import squared_norm

    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.3)
    backend = TorchDistributedBackend("cpu")
    seen: list[torch.Tensor] = []

    def reduce_then_step(optimizer: torch.optim.Optimizer, scaler: object) -> None:
        seen.append(squared_norm([p.grad for p in model.parameters()]))  # the local gradient
        for p in model.parameters():
            p.grad.mul_(0.5)  # the "reduction"
        optimizer.step()

    backend.optimizer_step = reduce_then_step  # type: ignore[method-assign]
    tap = XlaLocalNormTap(model)
    plan = plan_noise_scale(world_size=2, accumulation_steps=1, per_device_batch=4, local_norm_tap=tap)
    hook = NoiseScaleHook(plan, beta=0.5, local_norm_tap=tap)
    pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
    update = hook.tracker.update
    hook.tracker.update = lambda small, bs, big, bb: (pairs.append((small, big)), update(small, bs, big, bb))[1]
    gen = torch.Generator().manual_seed(2)
    batches = [(torch.randn(4, 3, generator=gen), torch.randint(0, 2, (4,), generator=gen)) for _ in range(3)]
    Trainer(model=model, optimizer=opt, scheduler=torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0),
            train_loader=batches, backend=backend, hooks=[hook],
            settings=StepSettings(epochs=1, global_batch_size=8, log_every=100)).train()
    assert plan.source == "ranks" and len(pairs) == len(seen) == 3
    for (small, big), local in zip(pairs, seen):
        torch.testing.assert_close(small, local)
        torch.testing.assert_close(big, local / 4)
    assert not opt._optimizer_step_pre_hooks, "the pre-hook outlived the run"


@pytest.mark.parametrize("batch, words, steps, examples", [
    (100, "perfect scaling", "11x", "1.1x"),  # B = B_noise / 10: S = 11 S_min, E = 1.1 E_min
    (1000, "near the critical batch", "2x", "2x"),  # B = B_noise: twice the fewest of both
    (10000, "diminishing returns", "1.1x", "11x"),
])
def test_the_early_line_names_the_regime_in_mccandlish_terms(batch: int, words: str, steps: str,
                                                              examples: str) -> None:
    from largebatch.engine.noise_scale_hook import batch_against_noise_scale

    line = batch_against_noise_scale(batch, 1000.0, 300)
    assert words in line and f"{steps} the fewest steps" in line and f"{examples} the fewest examples" in line
    assert "early estimate" in line and "\n" not in line


def test_the_early_line_is_said_once_when_the_estimate_is_resolved(caplog: pytest.LogCaptureFixture) -> None:
    from types import SimpleNamespace

    hook = NoiseScaleHook(NoiseScalePlan(source="micro-batches", batch_small=4, batch_big=8))
    hook.trainer = SimpleNamespace(state=SimpleNamespace(step=4, epoch=1),  # type: ignore[assignment]
                                   settings=SimpleNamespace(batch_schedule=None, batch_factor=lambda epoch: 1))
    caplog.set_level("INFO", logger="largebatch")
    hook.after_log({"noise_scale": 4.0})  # within the first epoch and before step 300: too early
    hook.after_epoch()
    hook.after_log({"noise_scale": float("nan")})  # not resolved yet: nothing said, and not used up
    assert "noise scale after" not in caplog.text
    # B_simple as the log step read it (the tracker's value): 4 images against a global batch of 8
    hook.after_log({"noise_scale": 4.0})
    hook.trainer.state.step = 300
    hook.after_log({"noise_scale": 5.0})
    assert caplog.text.count("noise scale after 4 steps: B_simple ~4 images; your global batch 8 is 2x it") == 1
    assert "~5 images" not in caplog.text
