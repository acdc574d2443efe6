"""A training step that cannot allocate its tensors: one error that says so, not a traceback.

torch reports a failed allocation as ``torch.OutOfMemoryError`` on CUDA ("CUDA out of memory.
Tried to allocate 2.00 GiB. GPU 0 has ...", a paragraph) and as a plain ``RuntimeError`` on the
CPU ("[enforce fail at alloc_cpu.cpp:127] ... DefaultCPUAllocator: can't allocate memory: you
tried to allocate 201326592 bytes ..."), also when a ``DataLoader`` worker's allocation failed
and the loader re-raised it. :func:`step_memory` turns either, raised while a step reads its
batch or runs it, into :class:`~largebatch.errors.StepOutOfMemoryError` (exit code 4) carrying
the step and the per-device batch; :func:`allocation_text` keeps the cause short enough for one line.
"""

from __future__ import annotations

import contextlib
import re
from typing import Iterator

import torch

from largebatch.errors import StepOutOfMemoryError

__all__ = ["allocation_text", "is_allocation_failure", "step_memory"]

_CPU = "can't allocate memory"


def is_allocation_failure(err: BaseException) -> bool:
    """Whether ``err`` is a failed allocation: CUDA out of memory, the CPU allocator's, or Python's ``MemoryError``."""
    if isinstance(err, (torch.OutOfMemoryError, MemoryError)):
        return True
    return isinstance(err, RuntimeError) and _CPU in str(err)


def allocation_text(err: BaseException) -> str:
    """The failed allocation in a few words: ``CUDA out of memory (tried to allocate 2.00 GiB)``,
    ``the CPU allocator could not allocate 192 MiB``."""
    text = str(err)
    cpu = re.search(r"you tried to allocate (\d+) bytes", text)
    if _CPU in text:
        size = f" {int(cpu.group(1)) / 2**20:,.0f} MiB" if cpu else " memory"
        return f"the CPU allocator could not allocate{size}"
    cuda = re.search(r"Tried to allocate ([\d.]+ [KMGT]?i?B)", text)
    if isinstance(err, torch.OutOfMemoryError):
        return f"out of device memory (tried to allocate {cuda.group(1)})" if cuda else "out of device memory"
    first = text.strip().splitlines()[0] if text.strip() else type(err).__name__
    return first[:160]


@contextlib.contextmanager
def step_memory(*, step: int, epoch: int, per_device_batch: int) -> Iterator[None]:
    """Around one training step (reading its batch included): a failed allocation becomes
    :class:`StepOutOfMemoryError` naming ``step`` (1-based), ``epoch`` (0-based) and
    ``per_device_batch``; any other error passes unchanged."""
    try:
        yield
    except (RuntimeError, MemoryError) as err:  # torch.OutOfMemoryError is a RuntimeError
        if not is_allocation_failure(err):
            raise
        cause = allocation_text(err)
        raise StepOutOfMemoryError(
            f"step {step} (epoch {epoch + 1}) ran out of memory with {per_device_batch} images per device ({cause})",
            step=step, epoch=epoch, per_device_batch=per_device_batch, cause=cause,
        ) from None
