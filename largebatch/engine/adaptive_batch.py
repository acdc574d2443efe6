"""The batch raised by the measured gradient noise scale, decided at each epoch start.

:class:`AdaptiveBatchHook` drives an :class:`~largebatch.batch_schedule.AdaptiveBatchSchedule`
(the decision rule, in the ground layer) from the run's noise-scale tracker
(:mod:`largebatch.engine.noise_scale_hook`): before an epoch nobody has decided yet, rank 0 reads
B_simple once (one host read per epoch, none per step), every rank receives it, and the schedule
appends the epoch's factor. The decisions live in ``TrainState.batch_factors``, which checkpoints
carry, so a run resumed inside an epoch trains the batches the uninterrupted run decided.

Hook order: it runs before every hook that reads the epoch's batch (the data order's skip, the
log lines, the MLPerf log), which ``largebatch.engine.assemble`` ensures by placing it first.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from largebatch.batch_schedule import AdaptiveBatchSchedule
from largebatch.engine.loop import Hook

__all__ = ["AdaptiveBatchHook"]

log = logging.getLogger("largebatch")


class AdaptiveBatchHook(Hook):
    """Decides each epoch's global batch (module docstring). ``tracker``: the noise-scale hook's
    :class:`~largebatch.diagnostics.noise_scale.GradientNoiseScale`."""

    def __init__(self, schedule: AdaptiveBatchSchedule, tracker: Any, *, is_main: bool) -> None:
        self.schedule = schedule
        self.tracker = tracker
        self.is_main = is_main

    def before_train(self) -> None:
        # a resumed run: the decisions its checkpoint carries
        self.schedule.factors[:] = list(self.trainer.state.batch_factors)

    def before_epoch(self) -> None:
        t = self.trainer
        epoch = t.state.epoch
        if epoch < len(self.schedule.factors):
            return  # decided before the stop this run resumed from
        value = float(self.tracker.noise_scale()) if self.tracker.updates else math.nan
        value = t.backend.broadcast_object(value)  # rank 0's: the ranks' local estimates differ
        before = self.schedule.batch_at(epoch - 1) if epoch else self.schedule.base
        raised = self.schedule.decide(epoch, value, t.steps_per_epoch)
        t.state.batch_factors = list(self.schedule.factors)
        if self.is_main and epoch:
            shown = f"~{value:.0f} images" if math.isfinite(value) else "not resolved yet"
            verdict = (f"raised to {self.schedule.batch_at(epoch)}" if raised
                       else f"kept ({self.schedule.why_kept(before // self.schedule.base, value, t.steps_per_epoch)})")
            log.info("epoch %d/%d: gradient noise scale %s, global batch %d: %s", epoch + 1, t.settings.epochs,
                     shown, before, verdict)
