"""The training sections: optimizer (``optimizer.*``, the scaled lr), lr schedule (``schedule.*``),
weight EMA (``ema.*``) and how the loop runs a step (``StepSettings``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

import torch
from torch import nn

if TYPE_CHECKING:
    from largebatch.backends.base import Backend
    from largebatch.batch_schedule import BatchSchedule
    from largebatch.config.schema import OptimizerConfig, TrainConfig
    from largebatch.engine.batch_plan import BatchPlan
    from largebatch.engine.ema import EmaHook
    from largebatch.engine.loop import StepSettings

__all__ = ["ema_of", "optimizer_of", "optimizer_options", "scheduler_of", "step_settings_of"]


def optimizer_options(opt: OptimizerConfig) -> dict[str, Any]:
    """The optimizer-specific options the config sets (None = the optimizer's default)."""
    names = ("momentum", "nesterov", "trust_coefficient", "eps", "lr_in_momentum", "betas", "foreach")
    out = {n: getattr(opt, n) for n in names if getattr(opt, n) is not None}
    if "betas" in out:
        out["betas"] = tuple(out["betas"])
    return out


def optimizer_of(cfg: TrainConfig, model: nn.Module, lr: float) -> torch.optim.Optimizer:
    """``optimizer.*`` at the scaled ``lr`` (``largebatch.optim.build_optimizer``)."""
    from largebatch.optim import build_optimizer

    opt = cfg.optimizer
    return build_optimizer(opt.name, model, lr=lr, weight_decay=opt.weight_decay,
                           exclude_bn_bias=opt.exclude_bn_bias, decay_bias=opt.decay_bias, **optimizer_options(opt))


def scheduler_of(cfg: TrainConfig, optimizer: torch.optim.Optimizer, steps_per_epoch: int, lr: float,
                 batches: Optional[BatchSchedule]) -> torch.optim.lr_scheduler.LambdaLR:
    """Warmup + decay; ``warmup_start=base_lr`` and ``end_lr`` resolved against the scaled ``lr``."""
    from largebatch.lr import build_lr_scheduler, schedule_factors

    s = cfg.schedule
    start_factor, end_factor = schedule_factors(
        lr, base_lr=cfg.optimizer.lr, warmup_start=s.warmup_start,
        warmup_start_factor=s.warmup_start_factor, end_lr=s.end_lr, end_factor=s.end_factor,
    )
    return build_lr_scheduler(
        optimizer, name=s.name, steps_per_epoch=steps_per_epoch, epochs=cfg.epochs,
        warmup_epochs=s.warmup_epochs, warmup_start_factor=start_factor,
        milestones=s.milestones, gamma=s.gamma, power=s.power, end_factor=end_factor,
        points=[list(p) for p in s.points], batch_schedule=batches,
    )


def ema_of(cfg: TrainConfig, model: nn.Module) -> Optional[EmaHook]:
    """The weight EMA's hook (``ema.enabled``; ``largebatch.engine.ema.EmaSettings``), or None."""
    from largebatch.engine.ema import EmaSettings

    e = cfg.ema
    if not e.enabled:
        return None
    return EmaSettings(decay=e.decay, warmup=e.warmup, warmup_gamma=e.warmup_gamma, warmup_power=e.warmup_power,
                       min_decay=e.min_decay, update_after_step=e.update_after_step, every=e.every).hook(model)


def step_settings_of(cfg: TrainConfig, backend: Backend, plan: BatchPlan, autocast_dtype: Optional[torch.dtype],
                     batches: Optional[BatchSchedule]) -> StepSettings:
    """How the loop runs a step (``largebatch.engine.loop.StepSettings``) from the config."""
    from largebatch.engine.compile import uses_cuda_graphs
    from largebatch.engine.loop import StepSettings

    return StepSettings(
        epochs=cfg.epochs, global_batch_size=plan.global_batch_size, accumulation_steps=plan.accumulation_steps,
        label_smoothing=cfg.label_smoothing, autocast_dtype=autocast_dtype, log_every=cfg.log_every,
        max_steps=cfg.max_steps, non_finite=cfg.non_finite, max_skipped_steps=cfg.max_skipped_steps,
        cuda_graph_steps=uses_cuda_graphs(cfg.model.compile) and backend.device.type == "cuda",
        batch_schedule=batches,
    )
