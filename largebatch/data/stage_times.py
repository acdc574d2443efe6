"""Where a loader's time goes, per batch: seconds summed per named stage, read by the benchmarks.

A loader whose batches are made in background threads (:func:`largebatch.data.background.in_background`)
can be slower than the step for reasons no img/s figure shows: its thread waits for the device,
blocks in a decoder, or spends its time in Python. :class:`StageTimes` sums, per stage name,
the wall seconds the loader's threads spent in it and how many times (once per batch), so a
benchmark prints milliseconds per batch per stage next to img/s. Each stage's mean is over the
batches that went through it since the last :meth:`StageTimes.reset`: threads that run ahead of
each other need not have handled the same batches in a window. The names the loaders use:

* ``device_wait``: the decode thread waiting (on the host) for its own stream to drain before
  nvJPEG may write into memory it allocates (``nvjpeg._finish_stream``);
* ``decode``: the batched decode call (nvJPEG on a GPU, libjpeg on the CPU);
* ``augment``: the host time of crop, resize, flip, normalise and the hand-over of one batch
  (the kernels are queued, not waited for);
* ``ahead``: a producer thread blocked because its queue is full (it is ahead of its consumer:
  slack, not cost);
* ``data_wait``: the consumer (the training thread) blocked waiting for a batch: the step's data
  wait, the one stage a step pays for.

Stages of different threads overlap, so their sum is no wall time. Timing costs two
``perf_counter`` calls and a lock per stage and batch (~1 microsecond).
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Iterator

__all__ = ["StageTimes"]


class StageTimes:
    """Seconds per stage and the batches that went through it, summed since the last :meth:`reset`
    (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.seconds: dict[str, float] = {}
        self.counts: dict[str, int] = {}

    def add(self, stage: str, seconds: float) -> None:
        """One batch's ``seconds`` in ``stage``."""
        with self._lock:
            self.seconds[stage] = self.seconds.get(stage, 0.0) + seconds
            self.counts[stage] = self.counts.get(stage, 0) + 1

    @contextlib.contextmanager
    def timing(self, stage: str) -> Iterator[None]:
        """Add the wall time of the ``with`` block to ``stage``."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add(stage, time.perf_counter() - start)

    def reset(self) -> None:
        with self._lock:
            self.seconds, self.counts = {}, {}

    def per_batch_ms(self) -> dict[str, float]:
        """Milliseconds per batch of each stage a batch went through since the last reset."""
        with self._lock:
            return {stage: 1e3 * seconds / self.counts[stage] for stage, seconds in self.seconds.items()}
