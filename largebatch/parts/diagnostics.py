"""The diagnostics section: the gradient noise scale (``diagnostics.noise_scale``) and the adaptive
batch schedule that reads it (``batch_schedule.adaptive``)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Optional

from largebatch.batch_schedule import AdaptiveBatchSchedule
from largebatch.errors import UsageError

if TYPE_CHECKING:
    from largebatch.backends.base import Backend
    from largebatch.batch_schedule import BatchSchedule
    from largebatch.config.schema import TrainConfig
    from largebatch.diagnostics.noise_scale import LocalNormTap
    from largebatch.engine.adaptive_batch import AdaptiveBatchHook
    from largebatch.engine.batch_plan import BatchPlan
    from largebatch.engine.noise_scale_hook import NoiseScaleHook

__all__ = ["adaptive_batch_of", "noise_scale_of"]

log = logging.getLogger("largebatch")


def noise_scale_of(cfg: TrainConfig, backend: Backend, plan: BatchPlan,
                   local_norm_tap: Optional[LocalNormTap]) -> Optional[NoiseScaleHook]:
    """The gradient noise scale's hook (``diagnostics.noise_scale``), or None when disabled.
    ``local_norm_tap``: the one ``train_model_of`` returned beside the model (DDP's buckets, or
    XLA's ``.grad``; None in one process). Where it is measured, and where not, is
    :func:`plan_noise_scale`'s choice; rank 0 says which."""
    from largebatch.engine.compile import uses_cuda_graphs
    from largebatch.engine.noise_scale_hook import NoiseScaleHook, plan_noise_scale

    ns = cfg.diagnostics.noise_scale
    if not ns.enabled:
        return None
    where = plan_noise_scale(world_size=backend.world_size, accumulation_steps=plan.accumulation_steps,
                             per_device_batch=plan.per_device, local_norm_tap=local_norm_tap,
                             probe_every=ns.probe_every,
                             xla=backend.device.type == "xla",
                             cuda_graphs=uses_cuda_graphs(cfg.model.compile) and backend.device.type == "cuda")
    if backend.is_main:
        log.info("%s", where.describe(ns.beta))
    return NoiseScaleHook(where, beta=ns.beta, local_norm_tap=local_norm_tap)


def adaptive_batch_of(batches: Optional[BatchSchedule], noise_scale: Optional[NoiseScaleHook],
                      backend: Backend) -> Optional[AdaptiveBatchHook]:
    """The adaptive batch schedule's hook (``batch_schedule.adaptive``), or None; it needs the
    noise scale measured, and says in one line how to measure it where it is not."""
    if not isinstance(batches, AdaptiveBatchSchedule):
        return None
    if noise_scale is None or noise_scale.plan.source is None:
        why = "diagnostics.noise_scale.enabled=false" if noise_scale is None else noise_scale.plan.reason
        raise UsageError(
            f"batch_schedule.adaptive.enabled=true raises the batch from the measured gradient noise scale, which "
            f"this run does not measure ({why}): enable diagnostics.noise_scale, and on one process use "
            f"accumulation_steps >= 2 or diagnostics.noise_scale.probe_every=N")
    from largebatch.engine.adaptive_batch import AdaptiveBatchHook

    return AdaptiveBatchHook(batches, noise_scale.tracker, is_main=backend.is_main)
