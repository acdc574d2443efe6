"""The batch arithmetic, written once: global = per_device x world_size x accumulation_steps.

:func:`plan_batches` splits ``global_batch_size`` over the ranks and the micro-steps, or says
which multiple to use; :func:`batch_too_large` is the error for a global batch the training data
cannot fill once per epoch, naming the largest one that fits. ``largebatch.run`` plans the batch
before anything is built and restates a loader's refusal with :func:`batch_too_large`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from largebatch.errors import UsageError

__all__ = ["BatchPlan", "batch_too_large", "plan_batches"]


@dataclass(frozen=True)
class BatchPlan:
    """The batch arithmetic: global = per_device x world_size x accumulation_steps."""

    global_batch_size: int
    world_size: int
    accumulation_steps: int
    per_device: int


def plan_batches(global_batch_size: int, world_size: int, accumulation_steps: int) -> BatchPlan:
    """Split ``global_batch_size`` over devices and micro-steps, or say why it cannot be."""
    if global_batch_size < 1 or accumulation_steps < 1:
        raise UsageError(
            f"global_batch_size ({global_batch_size}) and accumulation_steps "
            f"({accumulation_steps}) must be positive"
        )
    parts = world_size * accumulation_steps
    if global_batch_size % parts:
        lower = global_batch_size - global_batch_size % parts
        raise UsageError(
            f"global_batch_size={global_batch_size} is not divisible by world size {world_size} "
            f"x accumulation_steps {accumulation_steps} = {parts}; use a multiple of {parts}, "
            f"e.g. global_batch_size={max(lower, parts)}"
        )
    return BatchPlan(global_batch_size, world_size, accumulation_steps, global_batch_size // parts)


def batch_too_large(plan: BatchPlan, *, num_samples: Optional[int] = None,
                    batches_per_rank: Optional[int] = None) -> UsageError:
    """The error for a global batch the training data cannot fill once per epoch.

    Given the data set's ``num_samples`` (the sampler refused the per-rank batch) or the
    ``batches_per_rank`` it gives (fewer than the accumulation steps), it names the largest
    global batch that fits at this world size and accumulation.
    """
    w, a = plan.world_size, plan.accumulation_steps
    if num_samples is not None:
        per_rank = num_samples // w
        have = f"the training data has {num_samples} samples"
    else:
        per_rank = (batches_per_rank or 0) * plan.per_device
        have = f"the training data gives each rank {batches_per_rank} batch(es) of {plan.per_device} per epoch"
    fits = per_rank // a * a * w
    fix = (f"the largest global batch that fits is {fits}: set global_batch_size={fits} or smaller, or add data"
           if fits else "no global batch fits on this many ranks: add data or use fewer ranks")
    return UsageError(
        f"global_batch_size={plan.global_batch_size} ({plan.per_device} per device x {w} rank(s) x {a} "
        f"accumulation step(s)) is larger than an epoch: {have}; {fix}"
    )

