"""Run an iterator in a background thread, a few items ahead of its consumer."""

from __future__ import annotations

import queue
import threading
from typing import Any, Callable, Iterator, Optional, TypeVar

import torch

__all__ = ["in_background"]

T = TypeVar("T")


def in_background(produce: Callable[[], Iterator[T]], depth: int, *, device: Optional[torch.device] = None,
                  name: str = "background-iterator") -> Iterator[T]:
    """Iterate ``produce()`` in a thread that runs up to ``depth`` items ahead of the consumer.

    Why: torchvision's GPU decode blocks the calling thread until nvJPEG has finished (it
    synchronises its own stream); in a thread of its own, the training thread keeps queueing
    the step's kernels meanwhile. Work the thread queues goes to the device's current stream
    (the training thread's too), so stream order keeps each batch ready before its step. An
    exception in the thread is raised in the consumer; closing the iterator stops the thread.
    """
    items: queue.Queue = queue.Queue(maxsize=max(1, depth))
    stop = threading.Event()
    done = object()

    def put(item: Any) -> bool:
        while not stop.is_set():
            try:
                items.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def work() -> None:
        if device is not None and device.type != "cpu" and device.index is not None:
            torch.accelerator.set_device_index(device.index)  # a new thread starts on device 0
        source = produce()
        try:
            for item in source:
                if not put((item, None)):
                    return
            put((done, None))
        except BaseException as err:  # noqa: BLE001 - handed to the consumer
            put((None, err))
        finally:
            getattr(source, "close", lambda: None)()

    thread = threading.Thread(target=work, name=name, daemon=True)
    thread.start()
    try:
        while True:
            item, err = items.get()
            if err is not None:
                raise err
            if item is done:
                return
            yield item
    finally:
        stop.set()
        thread.join()
