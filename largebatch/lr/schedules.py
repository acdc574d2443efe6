"""Learning-rate schedules as small pure functions of the optimizer step.

Every function returns a *multiplier* of the scaled learning rate, so one schedule serves
all parameter groups and keeps their lr ratios (detectron2's ``LRMultiplier`` idea).
Warmup wraps any decay (Goyal et al. 2017, sec. 2.2, "gradual warmup": from
``start_factor * lr`` to ``lr`` linearly over the warmup steps, updated every iteration).
Cosine and polynomial decay run over the steps after warmup; step decay counts from step 0
(Goyal et al.: x0.1 at epochs 30, 60 and 80 of 90, warmup included).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Callable, Optional, Sequence

import torch

from largebatch.errors import UsageError

if TYPE_CHECKING:
    from largebatch.batch_schedule import BatchSchedule

__all__ = [
    "long_warmup_warning",
    "warmup_factor",
    "step_decay",
    "cosine_decay",
    "poly_decay",
    "lr_multiplier",
    "build_lr_scheduler",
    "schedule_factors",
    "piecewise_linear",
]


def warmup_factor(step: float, warmup_steps: int, start_factor: float) -> float:
    """Linear warmup: ``start_factor`` at step 0, 1.0 from ``warmup_steps`` on."""
    if warmup_steps <= 0 or step >= warmup_steps:
        return 1.0
    alpha = step / warmup_steps
    return start_factor + (1.0 - start_factor) * alpha


def step_decay(step: float, milestones: Sequence[int], gamma: float) -> float:
    """``gamma ** (number of milestones <= step)``; milestones are step indices."""
    return gamma ** sum(1 for m in milestones if step >= m)


def cosine_decay(step: float, total_steps: int, end_factor: float = 0.0) -> float:
    """Half-cosine from 1 at step 0 to ``end_factor`` at ``total_steps`` (held after)."""
    if total_steps <= 0:
        return 1.0
    t = min(max(step, 0), total_steps) / total_steps
    return end_factor + (1.0 - end_factor) * 0.5 * (1.0 + math.cos(math.pi * t))


def poly_decay(step: float, total_steps: int, power: float, end_factor: float = 0.0) -> float:
    """``end + (1 - end) * (1 - step/total) ** power`` (MLPerf ResNet-50 LARS: power 2)."""
    if total_steps <= 0:
        return 1.0
    t = min(max(step, 0), total_steps) / total_steps
    return end_factor + (1.0 - end_factor) * (1.0 - t) ** power


def piecewise_linear(step: float, knots: Sequence[Sequence[float]]) -> float:
    """Linear between ``(step, factor)`` knots (steps ascending; two knots at one step: a jump to
    the later's factor), the first factor before the first knot and the last after the last.
    fast.ai's DAWNBench 2018 phases are such knots: ``{'ep': (0, 6), 'lr': (lr, 2*lr)}`` a ramp,
    ``{'ep': 16, 'lr': lr}`` a jump held to the next phase."""
    if not knots:
        raise UsageError("a piecewise schedule needs at least one [epoch, factor] point")
    if step < knots[0][0]:
        return float(knots[0][1])
    for (x0, y0), (x1, y1) in zip(knots, knots[1:]):
        if x0 <= step < x1:
            return float(y0 + (y1 - y0) * (step - x0) / (x1 - x0))
    return float(knots[-1][1])


def lr_multiplier(
    step: float,
    *,
    name: str,
    total_steps: int,
    warmup_steps: int = 0,
    warmup_start_factor: float = 0.1,
    milestones: Sequence[int] = (),
    gamma: float = 0.1,
    power: float = 2.0,
    end_factor: float = 0.0,
    knots: Sequence[Sequence[float]] = (),
) -> float:
    """The multiplier of the scaled lr at optimizer step ``step`` (0-based); ``knots``: the
    ``piecewise`` schedule's ``(step, factor)`` points (:func:`piecewise_linear`)."""
    after = step - warmup_steps
    if name == "constant":
        decay = 1.0
    elif name == "piecewise":
        decay = piecewise_linear(step, knots)
    elif name == "step":
        decay = step_decay(step, milestones, gamma)
    elif name == "cosine":
        decay = cosine_decay(after, total_steps - warmup_steps, end_factor)
    elif name == "poly":
        decay = poly_decay(after, total_steps - warmup_steps, power, end_factor)
    else:
        raise UsageError(f"unknown schedule {name!r}; choose constant, step, cosine, poly or piecewise")
    return warmup_factor(step, warmup_steps, warmup_start_factor) * decay


def schedule_factors(
    scaled_lr: float,
    *,
    base_lr: float,
    warmup_start: str = "factor",
    warmup_start_factor: float = 0.1,
    end_lr: float | None = None,
    end_factor: float = 0.0,
) -> tuple[float, float]:
    """The warmup start and decay end as fractions of ``scaled_lr``, from how a recipe states them.

    ``warmup_start="base_lr"`` starts the warmup at ``base_lr``, the lr per base batch before
    scaling (Goyal et al. 2017, sec. 2.2: "from eta to k*eta"), so the start stays right when
    the global batch changes; ``"factor"`` uses ``warmup_start_factor``. ``end_lr``, when given,
    is an absolute final lr (the MLPerf ResNet-50 reference and tensorflow/tpu's
    ``lars_util.poly_rate_schedule`` end at 1e-4 whatever the peak) and replaces ``end_factor``.
    """
    if scaled_lr <= 0:
        raise ValueError(f"the scaled lr must be positive, got {scaled_lr}")
    if warmup_start == "base_lr":
        start = base_lr / scaled_lr
    elif warmup_start == "factor":
        start = warmup_start_factor
    else:
        raise ValueError(f"unknown warmup_start {warmup_start!r}; choose factor or base_lr")
    end = end_factor if end_lr is None else end_lr / scaled_lr
    return start, end


def build_lr_scheduler(
    optimizer: torch.optim.Optimizer,
    *,
    name: str,
    steps_per_epoch: int,
    epochs: int,
    warmup_epochs: float = 0.0,
    warmup_start_factor: float = 0.1,
    milestones: Sequence[float] = (),
    gamma: float = 0.1,
    power: float = 2.0,
    end_factor: float = 0.0,
    points: Sequence[Sequence[float]] = (),
    batch_schedule: Optional[BatchSchedule] = None,
) -> torch.optim.lr_scheduler.LambdaLR:
    """A per-iteration ``LambdaLR`` over ``lr_multiplier``; epochs are converted to steps.

    With a ``batch_schedule`` (:class:`~largebatch.batch_schedule.BatchSchedule`) the schedule runs
    on the samples' clock: optimizer step n is at the base batch's step ``epoch_position(n) x
    steps_per_epoch`` (``steps_per_epoch`` is then the base batch's), so warmup and decay do not
    jump when the batch changes, and each phase's lr is multiplied by its ``lr_ratio``.
    """
    total = steps_per_epoch * epochs
    warmup = int(round(warmup_epochs * steps_per_epoch))
    ms = [int(round(m * steps_per_epoch)) for m in milestones]
    knots = [(float(e) * steps_per_epoch, float(f)) for e, f in points]  # epochs -> steps

    def base_step(step: int) -> float:
        if batch_schedule is None:
            return step
        return batch_schedule.epoch_position(step, steps_per_epoch) * steps_per_epoch

    def ratio(step: int) -> float:
        return 1.0 if batch_schedule is None else batch_schedule.lr_ratio_at_step(step, steps_per_epoch)

    fn: Callable[[int], float] = lambda step: ratio(step) * lr_multiplier(  # noqa: E731
        base_step(step),
        name=name,
        total_steps=total,
        warmup_steps=warmup,
        warmup_start_factor=warmup_start_factor,
        milestones=ms,
        gamma=gamma,
        power=power,
        end_factor=end_factor,
        knots=knots,
    )
    return torch.optim.lr_scheduler.LambdaLR(optimizer, fn)


def long_warmup_warning(*, warmup_epochs: float, warmup_steps: int, steps_per_epoch: int, epochs: int,
                        lr: float) -> Optional[str]:
    """The warning for a warmup as long as the planned run or longer, or None: such a warmup never
    reaches the peak lr (the factor is 1 from step ``warmup_steps`` on, steps count from 0), so
    the run trains on a schedule it did not ask for. A warning, not an error: a paper preset run
    for an epoch or two to check it works is a fair use. ``max_steps`` is not the plan: it stops
    a run early without changing its schedule."""
    total = epochs * steps_per_epoch
    if warmup_steps < total:
        return None
    return (f"schedule.warmup_epochs={warmup_epochs:g} is {warmup_steps} warmup steps, not fewer than the run's "
            f"{total} (epochs={epochs} x {steps_per_epoch} steps): the lr never reaches its peak {lr:.4g}; lower "
            "schedule.warmup_epochs or raise epochs")
