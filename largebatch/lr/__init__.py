"""Learning-rate scaling rules and schedules (pure functions)."""

from largebatch.lr.scaling import SCALING_RULES, scale_lr
from largebatch.lr.schedules import (
    build_lr_scheduler,
    cosine_decay,
    long_warmup_warning,
    lr_multiplier,
    poly_decay,
    schedule_factors,
    step_decay,
    warmup_factor,
)

__all__ = [
    "SCALING_RULES",
    "scale_lr",
    "build_lr_scheduler",
    "cosine_decay",
    "long_warmup_warning",
    "lr_multiplier",
    "poly_decay",
    "schedule_factors",
    "step_decay",
    "warmup_factor",
]
