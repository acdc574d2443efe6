"""Stand-ins for the few CUDA calls that need a GPU, so that our GPU-only lines run on a CPU.

Only CUDA's queries and device calls are replaced; the project's code runs as it is. Every
call the stand-ins take is written to ``log`` in order (streams and events by name), so a
test asserts what our code asked of CUDA and in what order, not merely that it ran:

* ``torch.cuda.Stream`` / ``Event`` / ``current_stream`` / ``stream`` (the current stream is
  per thread, as CUDA's is), ``torch.cuda.synchronize``, ``Tensor.record_stream``;
* pinned host memory (``Tensor.pin_memory`` / ``is_pinned``) and copies to a CUDA device
  (``Tensor.to(cuda)``, which yields a CPU copy and logs whether it was pinned and
  non-blocking).

Used by the ``tests/test_gpu_standins_*.py`` files, which ``tests/test_gpu_lines_gate.py``
runs under coverage to check that every line marked ``# gpu-only`` in largebatch/ ran.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import torch


class StandInStream:
    def __init__(self, cuda: CudaStandIn, name: str, device: Any = None) -> None:
        self.cuda, self.name, self.device = cuda, name, device

    def wait_event(self, event: StandInEvent) -> None:
        self.cuda.log.append(("wait", self.name, event.name))

    def __repr__(self) -> str:
        return f"<stream {self.name}>"


class StandInEvent:
    def __init__(self, cuda: CudaStandIn) -> None:
        self.cuda = cuda
        with cuda.lock:
            cuda.events += 1
            self.name = f"event{cuda.events}"
        self.recorded_on: str | None = None

    def record(self, stream: StandInStream | None = None) -> None:
        stream = stream or self.cuda.current_stream()
        self.recorded_on = stream.name
        self.cuda.log.append(("record", self.name, stream.name))

    def synchronize(self) -> None:
        assert self.recorded_on is not None, "an event synchronized before it was recorded"
        self.cuda.log.append(("synchronize", self.name))


class CudaStandIn:
    """Install the stand-ins with ``monkeypatch``; read ``log`` after the code ran."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, *, device_count: int = 1) -> None:
        self.log: list[tuple[Any, ...]] = []
        self.lock = threading.Lock()
        self.events = 0
        self.streams = 0
        self.default = StandInStream(self, "default")
        self._current = threading.local()
        self.pinned: set[int] = set()
        cuda = self
        real_to = torch.Tensor.to

        def stream_factory(device: Any = None, **_: Any) -> StandInStream:
            with cuda.lock:
                cuda.streams += 1
                return StandInStream(cuda, f"side{cuda.streams}", device)

        @contextlib.contextmanager
        def stream_context(stream: StandInStream | None) -> Iterator[None]:
            before = cuda.current_stream()
            cuda._current.stream = stream or before
            try:
                yield
            finally:
                cuda._current.stream = before

        def pin_memory(t: torch.Tensor, *args: Any) -> torch.Tensor:
            pinned = t.clone()
            cuda.pinned.add(pinned.data_ptr())
            cuda.log.append(("pin", tuple(t.shape)))
            return pinned

        def to(t: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
            target = kwargs.get("device", args[0] if args else None)
            if isinstance(target, (str, torch.device)) and torch.device(target).type == "cuda":
                cuda.log.append(("copy", tuple(t.shape), t.data_ptr() in cuda.pinned,
                                 bool(kwargs.get("non_blocking", False))))
                return t.clone()
            return real_to(t, *args, **kwargs)

        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: device_count)
        monkeypatch.setattr(torch.cuda, "Stream", stream_factory)
        monkeypatch.setattr(torch.cuda, "Event", lambda *a, **k: StandInEvent(cuda))
        monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: cuda.current_stream())
        monkeypatch.setattr(torch.cuda, "stream", stream_context)
        monkeypatch.setattr(torch.cuda, "synchronize",
                            lambda device=None: cuda.log.append(("synchronize device", device)))
        monkeypatch.setattr(torch.Tensor, "record_stream",
                            lambda t, stream: cuda.log.append(("record_stream", tuple(t.shape), stream.name)),
                            raising=False)
        monkeypatch.setattr(torch.Tensor, "pin_memory", pin_memory, raising=False)
        monkeypatch.setattr(torch.Tensor, "is_pinned", lambda t, *a: t.data_ptr() in cuda.pinned, raising=False)
        monkeypatch.setattr(torch.Tensor, "to", to, raising=False)

    def current_stream(self) -> StandInStream:
        return getattr(self._current, "stream", self.default)

    def calls(self, *kinds: str) -> list[tuple[Any, ...]]:
        """The log's entries of the given kinds, in order."""
        return [entry for entry in self.log if entry[0] in kinds]
