"""The noise-scale probe (one process, no accumulation; largebatch/engine/noise_scale_hook.py).

Through the real Trainer: the probe's averages on the linear-regression problem of
tests/test_noise_scale.py (closed form ``B_simple = 21``), its agreement with the accumulation-2
measurement on the same draws, and a probed run's parameters, BN statistics and later dropout
masks equal to those of a run without it.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from largebatch.backends.torch_dist import TorchDistributedBackend
from largebatch.engine.loop import StepSettings, Trainer
from largebatch.engine.noise_scale_hook import NoiseScaleHook, NoiseScalePlan, plan_noise_scale
from largebatch.errors import UsageError
from tests.test_noise_scale import DELTA, SIGMA, TRUE_B_SIMPLE, TRUE_G2, TRUE_TRACE, D

BATCH = 64  # B_big; the probe's halves are B_small = 32
STEPS = 3000
BETA = 0.999  # weights from 1 down to beta**STEPS = 0.05: ~1.7k effective steps


class RegressionTrainer(Trainer):
    """The loop with the squared error ``½ (x·w − y)²`` as its loss (labels are the targets ``y``)."""

    def loss(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return 0.5 * (self.model(images).squeeze(-1) - labels).square().mean()


def _regression_batches(batch: int, steps: int, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``y = x·w* + ε`` with ``w* = 0``, so a model at ``w = δ`` has ``w − w* = δ`` (as in the closed form)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(steps, batch, D, generator=gen)
    y = SIGMA * torch.randn(steps, batch, generator=gen)
    return list(zip(x.unbind(), y.unbind()))


def _regression_run(batches: list, *, accumulation: int, probe_every: int) -> NoiseScaleHook:
    model = nn.Linear(D, 1, bias=False)
    with torch.no_grad():
        model.weight.zero_()
        model.weight[0, 0] = DELTA
    opt = torch.optim.SGD(model.parameters(), lr=0.0)  # lr 0: every step measures at w = w* + δ
    per_device = batches[0][0].shape[0]
    plan = plan_noise_scale(world_size=1, accumulation_steps=accumulation, per_device_batch=per_device,
                            local_norm_tap=None, probe_every=probe_every)
    hook = NoiseScaleHook(plan, beta=BETA)
    RegressionTrainer(model=model, optimizer=opt, scheduler=torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0),
                      train_loader=batches, backend=TorchDistributedBackend("cpu"), hooks=[hook],
                      settings=StepSettings(epochs=1, global_batch_size=per_device * accumulation,
                                            accumulation_steps=accumulation, log_every=10**6)).train()
    return hook


def _measured(hook: NoiseScaleHook) -> dict[str, float]:
    t = hook.tracker
    return {"|G|²": t.grad_sq_norm().item(), "tr Σ": t.noise_trace().item(), "B_simple": t.noise_scale().item()}


@pytest.fixture(scope="module")
def probed() -> NoiseScaleHook:
    return _regression_run(_regression_batches(BATCH, STEPS), accumulation=1, probe_every=1)


# the tests that read ``probed`` (3,000 steps) share one pytest-xdist worker, where it runs once
@pytest.mark.xdist_group("noise_scale_probe")
def test_the_probe_matches_the_closed_form(probed: NoiseScaleHook) -> None:
    """Tolerance 6%: by the spread argument of tests/test_noise_scale.py (the EMA's weights times
    the per-step estimates' spread, computed from these draws: 0.9% |G|², 1.0% tr Σ, 1.2% B_simple
    one standard deviation), ~5 standard deviations, while a wrong batch size (B_small = 64 or 16)
    or a half's norm taken as the full one misses by a factor of 2 or more."""
    assert probed.plan == NoiseScalePlan("probe", 32, 64, probe_every=1)
    assert probed.tracker.updates == STEPS
    truth = {"|G|²": TRUE_G2, "tr Σ": TRUE_TRACE, "B_simple": TRUE_B_SIMPLE}
    error = {k: v / truth[k] - 1 for k, v in _measured(probed).items()}
    print(f"relative error {error}")
    assert all(abs(e) < 0.06 for e in error.values()), error


@pytest.mark.xdist_group("noise_scale_probe")
def test_the_probe_agrees_with_two_micro_batches(probed: NoiseScaleHook) -> None:
    """The same draws as two micro-batches of 32 (the first half is B_small there): the same pair of
    batch sizes, so the two averages agree up to the second half's norm, which only the probe uses.
    Tolerance 22%: the accumulation path, with one half's norm, is the noisier (its B_simple spreads
    by 5.3% one standard deviation on these draws, the probe's by 1.2%, their difference by 5.2%),
    so 22% is ~4 standard deviations of the difference; each must also match the closed form."""
    halves = [half for x, y in _regression_batches(BATCH, STEPS)
              for half in ((x[: BATCH // 2], y[: BATCH // 2]), (x[BATCH // 2:], y[BATCH // 2:]))]
    accumulated = _regression_run(halves, accumulation=2, probe_every=0)
    assert accumulated.plan.source == "micro-batches" and accumulated.plan.batch_small == 32
    a, b = _measured(probed), _measured(accumulated)
    diff = {k: a[k] / b[k] - 1 for k in a}
    print(f"probe {a}, micro-batches {b}")
    assert all(abs(d) < 0.22 for d in diff.values()), diff
    assert abs(b["B_simple"] / TRUE_B_SIMPLE - 1) < 0.22, b


class Net(nn.Module):
    """BN (running statistics) and dropout (RNG draws): what a probe's forwards could disturb."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 6, 3), nn.BatchNorm2d(6), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                                  nn.Flatten(), nn.Dropout(0.3), nn.Linear(6, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def _classifier_run(probe_every: int, scaler: object = None) -> tuple[nn.Module, NoiseScaleHook, list]:
    gen = torch.Generator().manual_seed(3)
    batches = [(torch.randn(8, 3, 8, 8, generator=gen), torch.randint(0, 3, (8,), generator=gen)) for _ in range(6)]
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
    plan = plan_noise_scale(world_size=1, accumulation_steps=1, per_device_batch=8, local_norm_tap=None,
                            probe_every=probe_every)
    hook = NoiseScaleHook(plan, beta=0.5)
    step_grads: list = []
    opt.register_step_pre_hook(lambda o, *_: step_grads.append([p.grad.clone() for p in model.parameters()]))
    Trainer(model=model, optimizer=opt, scheduler=torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0),
            train_loader=batches, backend=TorchDistributedBackend("cpu"), scaler=scaler, hooks=[hook],
            settings=StepSettings(epochs=2, global_batch_size=8, log_every=100)).train()
    return model, hook, step_grads


@pytest.mark.parametrize("scaled", [False, True], ids=["fp32", "loss-scaled"])
def test_the_probe_changes_nothing_in_the_run(scaled: bool) -> None:
    """12 steps, probed every 2: each step's gradient, the parameters, the BN running statistics
    (updated once a step: num_batches_tracked = 12) and the dropout masks of the steps after a
    probe are those of the run without it, bit for bit. Without the buffers' copy-back or the RNG
    fork this fails."""
    def scaler() -> object:
        return torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=1000) if scaled else None

    plain, off, plain_grads = _classifier_run(0, scaler())
    probed, on, probed_grads = _classifier_run(2, scaler())
    assert off.tracker.updates == 0 and on.tracker.updates == 6
    assert torch.isfinite(on.tracker.noise_trace()) and torch.isfinite(on.tracker.grad_sq_norm())
    assert len(plain_grads) == len(probed_grads) == 12
    for a, b in zip(plain_grads, probed_grads):
        for ga, gb in zip(a, b):
            torch.testing.assert_close(gb, ga, rtol=0, atol=0)
    for (name, a), (_, b) in zip(plain.state_dict().items(), probed.state_dict().items()):
        torch.testing.assert_close(b, a, rtol=0, atol=0, msg=name)
    assert int(probed.body[1].num_batches_tracked) == 12
    if scaled:  # a power-of-two loss scale, divided out on the device: the unscaled run's averages exactly
        unscaled = _classifier_run(2)[1].tracker.state_dict()["ema"]
        torch.testing.assert_close(on.tracker.state_dict()["ema"], unscaled, rtol=0, atol=0)


def test_the_probe_is_planned_only_where_nothing_comes_free() -> None:
    assert plan_noise_scale(world_size=1, accumulation_steps=1, per_device_batch=9, local_norm_tap=None,
                            probe_every=10) == NoiseScalePlan("probe", 4, 9, probe_every=10)
    assert plan_noise_scale(world_size=1, accumulation_steps=2, per_device_batch=8, local_norm_tap=None,
                            probe_every=10).source == "micro-batches"
    assert plan_noise_scale(world_size=2, accumulation_steps=1, per_device_batch=8, local_norm_tap=object(),
                            probe_every=10).source == "ranks"
    one = plan_noise_scale(world_size=1, accumulation_steps=1, per_device_batch=1, local_norm_tap=None, probe_every=1)
    assert one.source is None and "batch of 1" in one.reason
    with pytest.raises(UsageError, match="probe_every=-1"):
        plan_noise_scale(world_size=1, accumulation_steps=1, per_device_batch=8, local_norm_tap=None, probe_every=-1)


def test_the_probe_loss_is_the_steps_loss() -> None:
    """The probe calls ``Trainer.loss``, the function the step itself calls: the same cross-entropy."""
    model = nn.Linear(4, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(5, 4), torch.tensor([0, 1, 2, 0, 1])
    trainer = Trainer(model=model, optimizer=opt, scheduler=None, train_loader=[(x, y)],
                      backend=TorchDistributedBackend("cpu"), settings=StepSettings(epochs=1, global_batch_size=5,
                                                                                   label_smoothing=0.1))
    assert math.isclose(trainer.loss(x, y).item(), F.cross_entropy(model(x), y, label_smoothing=0.1).item(),
                        rel_tol=1e-6)
