"""The ``resume`` setting: which checkpoint the run continues from (a restarted torchrun worker
group always resumes), and what it must share with this run before it is loaded into its parts."""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:
    from pathlib import Path

    from largebatch.backends.base import Backend
    from largebatch.config.schema import TrainConfig
    from largebatch.engine.batch_plan import BatchPlan
    from largebatch.engine.resume import RunParts

__all__ = ["resume_of", "resume_setting"]

log = logging.getLogger("largebatch")


def resume_setting(resume: Optional[str]) -> Optional[str]:
    """``resume``; a restarted torchrun worker group always resumes (``auto``)."""
    if resume is None and int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0) > 0:
        log.info("torchrun restart %s: resuming from the newest checkpoint (resume=auto)",
                 os.environ["TORCHELASTIC_RESTART_COUNT"])
        return "auto"
    return resume


def resume_of(cfg: TrainConfig, backend: Backend, plan: BatchPlan, run_dir: Path, *, steps_per_epoch: int,
              num_classes: int, config: Optional[dict[str, Any]], parts: RunParts, loader: Optional[str] = None) -> None:
    """Load the checkpoint ``resume`` names (:func:`resume_setting`) into ``parts``, once it is
    checked against this run's model, optimizer, batch, epoch length, classes, ``config`` and
    ``loader`` (the pipeline that reads: ``largebatch.data.build.pipeline_of``)
    (``largebatch.engine.resume.resume_run``); nothing without ``resume``."""
    resume = resume_setting(cfg.resume)
    if not resume:
        return
    from largebatch.engine.resume import ResumeCheck, resume_run

    resume_run(
        resume, run_dir / "checkpoints", backend=backend,
        check=ResumeCheck(model_name=cfg.model.name, optimizer_name=cfg.optimizer.name,
                          global_batch_size=plan.global_batch_size, per_device=plan.per_device,
                          steps_per_epoch=steps_per_epoch, num_classes=num_classes, config=config,
                          loader=loader, requested_loader=cfg.data.loader),
        parts=parts,
    )
