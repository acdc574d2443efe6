"""Gradient compression by casting: the wire format of a gradient bucket.

``fp16`` / ``bf16`` halve the bytes every collective moves (Jia et al. 2018, arXiv 1807.11205,
all-reduce fp16 gradients; Ying et al. 2018, arXiv 1811.06992, sum in bf16 on the TPU
torus). The bucket is divided by the world size *before* the cast, in the gradient's own
precision: the average is what travels, so an fp16 sum of ``n`` values cannot overflow where
the fp32 average would not (torch's ``fp16_compress_hook`` casts first, then divides). The
result is cast back into the bucket, which DDP copies into ``.grad``.
"""

from __future__ import annotations

import torch

from largebatch.errors import UsageError

__all__ = ["COMPRESSIONS", "wire_dtype", "padded_numel", "pack", "unpack"]

COMPRESSIONS: dict[str, torch.dtype | None] = {
    "none": None,
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
}


def wire_dtype(compress: str, grad_dtype: torch.dtype) -> torch.dtype:
    """The dtype a bucket of ``grad_dtype`` travels in under ``compress``."""
    if compress not in COMPRESSIONS:
        raise UsageError(
            f"unknown comm.compress {compress!r}; expected one of {sorted(COMPRESSIONS)}"
        )
    return COMPRESSIONS[compress] or grad_dtype


def padded_numel(numel: int, multiple: int) -> int:
    return -(-numel // multiple) * multiple


def pack(
    buffer: torch.Tensor,
    *,
    divisor: int,
    dtype: torch.dtype,
    multiple: int,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``buffer / divisor`` in ``dtype``, zero-padded to a multiple of ``multiple`` elements.

    Works in place on ``buffer`` (as DDP's own all-reduce does) when no cast and no padding
    is needed; otherwise writes ``out`` (or a new tensor) and leaves ``buffer`` untouched.
    """
    numel = buffer.numel()
    padded = padded_numel(numel, multiple)
    if padded == numel and dtype == buffer.dtype:
        return buffer.div_(divisor)
    wire = buffer.new_empty(padded, dtype=dtype) if out is None else out
    # Division in the buffer's precision, rounding to ``dtype`` once on the way out.
    torch.div(buffer, divisor, out=wire[:numel])
    wire[numel:].zero_()
    return wire


def unpack(buffer: torch.Tensor, wire: torch.Tensor) -> torch.Tensor:
    """Copy the reduced ``wire`` (cast back, padding dropped) into ``buffer``; return it."""
    if wire is not buffer:
        buffer.copy_(wire[: buffer.numel()])
    return buffer
