"""LR scaling, warmup and decay at their boundaries."""

from __future__ import annotations

import math

import pytest
import torch

from largebatch.lr import (
    build_lr_scheduler,
    cosine_decay,
    lr_multiplier,
    poly_decay,
    scale_lr,
    schedule_factors,
    step_decay,
    warmup_factor,
)


def test_linear_and_sqrt_scaling() -> None:
    assert scale_lr(0.1, 8192, 256, "linear") == pytest.approx(3.2)  # Goyal et al.
    assert scale_lr(0.1, 1024, 256, "sqrt") == pytest.approx(0.2)
    assert scale_lr(0.1, 1024, 256, "none") == 0.1
    with pytest.raises(ValueError, match="lr_scaling"):
        scale_lr(0.1, 1024, 256, "cubic")
    with pytest.raises(ValueError, match="positive"):
        scale_lr(0.1, 0, 256, "linear")


def test_warmup_boundaries() -> None:
    assert warmup_factor(0, 10, 0.1) == pytest.approx(0.1)
    assert warmup_factor(5, 10, 0.1) == pytest.approx(0.55)
    assert warmup_factor(10, 10, 0.1) == 1.0
    assert warmup_factor(3, 0, 0.1) == 1.0


def test_step_decay_boundaries() -> None:
    assert step_decay(29, [30, 60], 0.1) == 1.0
    assert step_decay(30, [30, 60], 0.1) == pytest.approx(0.1)
    assert step_decay(60, [30, 60], 0.1) == pytest.approx(0.01)


def test_cosine_and_poly_boundaries() -> None:
    assert cosine_decay(0, 100) == 1.0
    assert cosine_decay(50, 100) == pytest.approx(0.5)
    assert cosine_decay(100, 100, end_factor=0.1) == pytest.approx(0.1)
    assert cosine_decay(150, 100) == pytest.approx(0.0)
    assert poly_decay(0, 100, 2.0) == 1.0
    assert poly_decay(50, 100, 2.0) == pytest.approx(0.25)
    assert poly_decay(100, 100, 2.0) == 0.0


def test_warmup_wraps_decay() -> None:
    kw = dict(total_steps=110, warmup_steps=10, warmup_start_factor=0.0)
    assert lr_multiplier(0, name="cosine", **kw) == 0.0
    assert lr_multiplier(10, name="cosine", **kw) == pytest.approx(1.0)  # decay starts after warmup
    assert lr_multiplier(60, name="poly", power=2.0, **kw) == pytest.approx(0.25)
    assert lr_multiplier(110, name="cosine", **kw) == pytest.approx(0.0, abs=1e-12)
    # step decay counts from step 0, warmup included (Goyal et al.)
    assert lr_multiplier(50, name="step", milestones=[50], gamma=0.1, **kw) == pytest.approx(0.1)
    with pytest.raises(ValueError, match="schedule"):
        lr_multiplier(0, name="linear", total_steps=1)


def test_scheduler_is_per_iteration_and_keeps_group_ratios() -> None:
    w = torch.nn.Parameter(torch.zeros(1))
    b = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([{"params": [w], "lr": 1.0}, {"params": [b], "lr": 0.5}], lr=1.0)
    sched = build_lr_scheduler(opt, name="cosine", steps_per_epoch=10, epochs=3, warmup_epochs=1,
                               warmup_start_factor=0.1)
    lrs = []
    for _ in range(30):
        lrs.append([g["lr"] for g in opt.param_groups])
        opt.step()
        sched.step()
    assert lrs[0][0] == pytest.approx(0.1) and lrs[0][1] == pytest.approx(0.05)
    assert lrs[5][0] == pytest.approx(0.55)
    assert lrs[10][0] == pytest.approx(1.0)
    assert lrs[20][0] == pytest.approx(0.5 * (1 + math.cos(math.pi * 0.5)))
    assert all(a == pytest.approx(2 * b_) for a, b_ in lrs)


def test_warmup_from_base_lr_follows_the_batch() -> None:
    """Goyal et al. sec. 2.2: warmup from eta (the lr per base batch) to k*eta, at any k."""
    for batch in (256, 1024, 8192):
        scaled = scale_lr(0.1, batch, 256, "linear")
        start, _ = schedule_factors(scaled, base_lr=0.1, warmup_start="base_lr")
        assert start * scaled == pytest.approx(0.1)
    assert schedule_factors(3.2, base_lr=0.1, warmup_start="factor", warmup_start_factor=0.25)[0] == 0.25
    with pytest.raises(ValueError, match="warmup_start"):
        schedule_factors(3.2, base_lr=0.1, warmup_start="zero")


def test_absolute_end_lr_replaces_end_factor() -> None:
    """MLPerf / tensorflow/tpu poly decay ends at 1e-4 whatever the peak."""
    for peak in (10.0, 34.0):
        _, end = schedule_factors(peak, base_lr=peak, end_lr=1e-4, end_factor=0.5)
        assert end * peak == pytest.approx(1e-4)
    assert schedule_factors(10.0, base_lr=10.0, end_factor=0.5)[1] == 0.5
