"""Run an iterator in a background thread, a few items ahead of its consumer."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import queue
import threading
import time
from typing import Any, Callable, Generator, Iterator, Optional, TypeVar

import torch

from largebatch.data.stage_times import StageTimes

__all__ = ["cuda_device_index", "in_background", "one_intraop_thread_here"]

T = TypeVar("T")


def _record_stream(item: Any, stream: "torch.cuda.Stream") -> None:
    """Tell the caching allocator that ``stream`` uses each CUDA tensor of ``item``."""
    if isinstance(item, torch.Tensor):
        if item.is_cuda:
            item.record_stream(stream)  # gpu-only
    elif isinstance(item, (tuple, list)):
        for part in item:
            _record_stream(part, stream)
    elif isinstance(item, dict):
        for part in item.values():
            _record_stream(part, stream)


def cuda_device_index(device: Any) -> int:
    """The CUDA device ``device`` names; the current one for ``"cuda"`` without an index."""
    index = torch.device(device).index
    return torch.cuda.current_device() if index is None else index  # gpu-only


@functools.lru_cache(maxsize=1)
def _openmp_runtimes() -> tuple[ctypes.CDLL, ...]:
    """The OpenMP runtimes mapped into this process (torch's libgomp; libiomp5 or libomp in
    other builds), found in ``/proc/self/maps``; none off Linux."""
    try:
        with open("/proc/self/maps", encoding="utf-8") as maps:
            paths = {line.split(None, 5)[-1].strip() for line in maps if "/lib" in line}
    except OSError:
        return ()
    runtimes = []
    for path in sorted(paths):
        if os.path.basename(path).startswith(("libgomp", "libiomp5", "libomp")):
            try:
                runtime = ctypes.CDLL(path)
                runtime.omp_set_num_threads.argtypes = [ctypes.c_int]
            except (OSError, AttributeError):
                continue
            runtimes.append(runtime)
    return tuple(runtimes)


def one_intraop_thread_here() -> bool:
    """Run this thread's torch CPU operators on one thread, every other thread's count unchanged;
    True where that took (torch's intra-op parallelism is OpenMP's, whose thread count is kept
    per calling thread).

    Why: a loader thread augmenting batches beside the training step would open OpenMP teams of
    its own while the step's run: on a host with few cores the two teams' threads wait on each
    other (each parallel region ends only when all its threads were scheduled), and the step
    slows by more than the augmentation costs. A batch's augmentation is small; its parallelism
    is the loader's threads. Not ``torch.set_num_threads(1)``: torch also keeps that count
    process-wide, for every thread started later (a checkpoint writer, the next pass's threads)."""
    torch.get_num_threads()  # torch's per-thread set-up first: it would set this thread's count back
    for runtime in _openmp_runtimes():
        runtime.omp_set_num_threads(1)
    return torch.get_num_threads() == 1


_DONE = object()  # the producer's last item


class _Producer:
    """The thread's side of :func:`in_background`: runs ``produce()`` (on a stream of its own on a
    CUDA ``device``) and puts ``(item, ready event, error)`` on a queue of ``depth`` until told to
    stop; the end is ``(_DONE, None, None)``, an error ``(None, None, error)``."""

    def __init__(self, produce: Callable[[], Iterator[Any]], depth: int, device: Optional[torch.device],
                 times: Optional[StageTimes] = None) -> None:
        self.produce = produce
        self.times = times
        self.items: queue.Queue = queue.Queue(maxsize=max(1, depth))
        self.stop = threading.Event()
        self.cuda = device is not None and torch.device(device).type == "cuda"
        self.stream = torch.cuda.Stream(device) if self.cuda else None
        # torch.cuda.set_device refuses a device without an index (torch.device("cuda")): the index
        # is resolved here, in the consumer's thread, whose current device that is.
        self.index = cuda_device_index(device) if self.cuda else None

    def put(self, item: Any) -> bool:
        """Queue ``item``, waiting while the queue is full; False once told to stop."""
        start = time.perf_counter()
        try:
            while not self.stop.is_set():
                try:
                    self.items.put(item, timeout=0.05)
                    return True
                except queue.Full:
                    continue
            return False
        finally:
            if self.times is not None:
                self.times.add("ahead", time.perf_counter() - start)

    def run(self) -> None:
        # Everything the thread does is inside the try, its start-up included: an error that
        # escaped would end the thread silently and leave the consumer waiting forever.
        source = None
        try:
            if self.cuda:
                torch.cuda.set_device(self.index)  # a new thread starts on device 0  # gpu-only
            with torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext():
                source = self.produce()
                for item in source:
                    ready = None
                    if self.stream is not None:
                        ready = torch.cuda.Event()  # gpu-only
                        ready.record(self.stream)  # gpu-only
                    if not self.put((item, ready, None)):
                        return
            self.put((_DONE, None, None))
        except BaseException as err:  # noqa: BLE001 - handed to the consumer
            self.put((None, None, err))
        finally:
            getattr(source, "close", lambda: None)()


def _handed_over(item: T, ready: Any, device: Optional[torch.device]) -> T:
    """``item`` on the consumer's side: its current stream waits (on the device) for the event
    the producer recorded, and its CUDA tensors are ``record_stream``-ed on that stream."""
    consumer = torch.cuda.current_stream(device)  # gpu-only
    consumer.wait_event(ready)  # gpu-only
    _record_stream(item, consumer)  # gpu-only
    return item


def in_background(produce: Callable[[], Iterator[T]], depth: int, *, device: Optional[torch.device] = None,
                  name: str = "background-iterator", times: Optional[StageTimes] = None) -> Generator[T, None, None]:
    """Iterate ``produce()`` in a thread that runs up to ``depth`` items ahead of the consumer.

    Why: torchvision's GPU decode blocks the calling thread until nvJPEG has finished (it
    synchronises its own stream); in a thread of its own, the training thread keeps queueing
    the step's kernels meanwhile. An exception in the thread is raised in the consumer;
    closing the iterator stops the thread.

    On a CUDA ``device`` the thread queues its work on a stream of its own, never the
    consumer's, and hands each item over with an event: the consumer's current stream waits
    on it (on the device, not the host) and each CUDA tensor of the item is
    ``record_stream``-ed on that stream, so the allocator does not hand its memory back to the
    producer before the consumer's queued kernels have read it. Blocks the training stream
    frees are never given to the producer's stream (the caching allocator keeps them per
    stream), which is what nvJPEG's own stream needs (see ``nvjpeg.decode_images``).

    ``times``: where the thread's time blocked on a full queue goes (``ahead``) and the
    consumer's blocked on an empty one (``data_wait``), see :mod:`largebatch.data.stage_times`.
    """
    producer = _Producer(produce, depth, device, times)
    thread = threading.Thread(target=producer.run, name=name, daemon=True)
    thread.start()
    try:
        while True:
            start = time.perf_counter()
            item, ready, err = producer.items.get()
            if times is not None and err is None and item is not _DONE:
                times.add("data_wait", time.perf_counter() - start)
            if err is not None:
                raise err
            if item is _DONE:
                return
            yield _handed_over(item, ready, device) if ready is not None else item
    finally:
        producer.stop.set()
        thread.join()
