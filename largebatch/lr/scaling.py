"""Learning-rate scaling rules for large batches.

The learning rate is given per ``base_batch_size`` images and scaled to the global batch:

* ``linear`` (Goyal et al. 2017, "Accurate, Large Minibatch SGD", arXiv 1706.02677, sec. 2.1):
  ``lr = lr_base * global / base``;
* ``sqrt`` (Krizhevsky 2014, arXiv 1404.5997; You et al. 2019 for LAMB):
  ``lr = lr_base * sqrt(global / base)``;
* ``none``: ``lr = lr_base``.
"""

from __future__ import annotations

import math

from largebatch.errors import UsageError

__all__ = ["scale_lr", "SCALING_RULES"]

SCALING_RULES = ("linear", "sqrt", "none")


def scale_lr(lr: float, global_batch_size: int, base_batch_size: int, rule: str) -> float:
    """Return the learning rate for ``global_batch_size`` given ``lr`` for ``base_batch_size``."""
    if global_batch_size <= 0 or base_batch_size <= 0:
        raise UsageError(
            f"batch sizes must be positive, got global_batch_size={global_batch_size}, "
            f"base_batch_size={base_batch_size}"
        )
    ratio = global_batch_size / base_batch_size
    if rule == "linear":
        return lr * ratio
    if rule == "sqrt":
        return lr * math.sqrt(ratio)
    if rule == "none":
        return lr
    raise UsageError(f"unknown lr_scaling {rule!r}; choose one of {', '.join(SCALING_RULES)}")
