"""Precision policy: which autocast dtype to use, and whether a loss scaler is needed.

* ``fp32``: no autocast.
* ``bf16``: autocast to bfloat16 (Ying et al. 2018: bf16 convolutions and activations); BN
  statistics, the loss and gradient sums stay fp32 (autocast keeps BN and cross-entropy in
  fp32; parameters and optimizer state are fp32 master copies).
* ``fp16``: autocast to float16 with dynamic loss scaling (Jia et al. 2018; Micikevicius et
  al. 2018): a skipped overflow step does not advance the LR schedule.
* ``auto``: bf16 where the device computes it natively (Ampere+/Hopper GPUs, TPUs, CPUs with
  AVX512-BF16/AMX), else fp32.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

import torch

from largebatch.errors import UsageError

if TYPE_CHECKING:
    from largebatch.backends.base import Backend

__all__ = ["PrecisionPolicy", "resolve_precision"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PrecisionPolicy:
    name: str
    autocast_dtype: Optional[torch.dtype]
    loss_scaling: bool


def resolve_precision(name: str, backend: Backend) -> PrecisionPolicy:
    """Turn ``auto|fp32|bf16|fp16`` into a policy for ``backend``'s device."""
    if name == "auto":
        name = "bf16" if backend.supports_bf16() else "fp32"
    if name == "fp32":
        return PrecisionPolicy("fp32", None, False)
    if name == "bf16":
        return PrecisionPolicy("bf16", torch.bfloat16, False)
    if name == "fp16":
        if backend.device.type == "cpu":
            log.warning("precision=fp16 on a CPU is very slow; bf16 or fp32 are the CPU choices")
        if backend.name == "xla":
            raise UsageError("precision=fp16 is not supported on XLA; use bf16")
        return PrecisionPolicy("fp16", torch.float16, True)
    raise UsageError(f"unknown precision {name!r}; choose auto, fp32, bf16 or fp16")
