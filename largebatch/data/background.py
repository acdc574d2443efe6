"""Run an iterator in a background thread, a few items ahead of its consumer."""

from __future__ import annotations

import contextlib
import queue
import threading
from typing import Any, Callable, Generator, Iterator, Optional, TypeVar

import torch

__all__ = ["cuda_device_index", "in_background"]

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


def in_background(produce: Callable[[], Iterator[T]], depth: int, *, device: Optional[torch.device] = None,
                  name: str = "background-iterator") -> Generator[T, None, None]:
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
    """
    items: queue.Queue = queue.Queue(maxsize=max(1, depth))
    stop = threading.Event()
    done = object()
    cuda = device is not None and torch.device(device).type == "cuda"
    stream = torch.cuda.Stream(device) if cuda else None
    # torch.cuda.set_device refuses a device without an index (torch.device("cuda")): the index
    # is resolved here, in the consumer's thread, whose current device that is.
    index = cuda_device_index(device) if cuda else None

    def put(item: Any) -> bool:
        while not stop.is_set():
            try:
                items.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def work() -> None:
        # Everything the thread does is inside the try, its start-up included: an error that
        # escaped would end the thread silently and leave the consumer waiting forever.
        source = None
        try:
            if cuda:
                torch.cuda.set_device(index)  # a new thread starts on device 0  # gpu-only
            with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
                source = produce()
                for item in source:
                    ready = None
                    if stream is not None:
                        ready = torch.cuda.Event()  # gpu-only
                        ready.record(stream)  # gpu-only
                    if not put((item, ready, None)):
                        return
            put((done, None, None))
        except BaseException as err:  # noqa: BLE001 - handed to the consumer
            put((None, None, err))
        finally:
            getattr(source, "close", lambda: None)()

    thread = threading.Thread(target=work, name=name, daemon=True)
    thread.start()
    try:
        while True:
            item, ready, err = items.get()
            if err is not None:
                raise err
            if item is done:
                return
            if ready is not None:
                consumer = torch.cuda.current_stream(device)  # gpu-only
                consumer.wait_event(ready)  # gpu-only
                _record_stream(item, consumer)  # gpu-only
            yield item
    finally:
        stop.set()
        thread.join()
