"""The decode thread (largebatch.data.background): every error of the thread reaches its consumer.

Its start-up (``set_device``, ``produce()``) once ran outside the thread's ``try``: an error
there ended the thread silently and the consumer's ``next()`` waited forever (issue 53). The
CUDA case runs here with only ``torch.cuda``'s stream and device calls stood in.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
import torch

from largebatch.data.background import in_background


def _consume(iterator: Iterator[Any], timeout_s: float = 20.0) -> tuple[list[Any], BaseException | None]:
    """Everything ``iterator`` yields and the error it ends with, or a failure if it hangs."""
    got: list[Any] = []
    error: list[BaseException] = []

    def run() -> None:
        try:
            for item in iterator:
                got.append(item)
        except BaseException as e:  # noqa: BLE001 - what the test checks
            error.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        pytest.fail(f"the consumer still waits after {timeout_s:.0f} s: the thread's error never reached it")
    return got, error[0] if error else None


def test_an_error_making_the_iterator_reaches_the_consumer() -> None:
    def produce() -> Iterator[int]:
        raise OSError("cannot open the shard list")

    got, error = _consume(in_background(produce, 2))
    assert got == [] and isinstance(error, OSError) and "shard list" in str(error)


def test_items_then_the_end_then_the_source_is_closed() -> None:
    closed: list[bool] = []

    def produce() -> Iterator[int]:
        try:
            yield from range(5)
        finally:
            closed.append(True)

    got, error = _consume(in_background(produce, 2))
    assert got == [0, 1, 2, 3, 4] and error is None and closed == [True]


class _Stream:
    """What the thread and its consumer use of a CUDA stream, on the CPU."""

    def __init__(self, device: Any = None) -> None:
        self.device = device
        self.waited: list[Any] = []

    def wait_event(self, event: Any) -> None:
        self.waited.append(event)


class _Event:
    def __init__(self) -> None:
        self.recorded_on: list[Any] = []

    def record(self, stream: Any) -> None:
        self.recorded_on.append(stream)


def _torch_checks(set_device: Callable[[Any], None]) -> Callable[[Any], None]:
    """``set_device`` behind torch's own check of its argument (``torch.cuda.set_device`` runs
    it before any CUDA call): torch.device("cuda") without an index is refused, as on a GPU."""
    from torch.cuda._utils import _get_device_index

    def checked(device: Any) -> None:
        _get_device_index(device)
        set_device(device)

    return checked


def _stand_in_cuda(monkeypatch: pytest.MonkeyPatch, set_device: Callable[[Any], None], current: int = 0) -> _Stream:
    consumer = _Stream("consumer")
    set_device = _torch_checks(set_device)
    monkeypatch.setattr(torch.cuda, "Stream", _Stream)
    monkeypatch.setattr(torch.cuda, "Event", _Event)
    monkeypatch.setattr(torch.cuda, "set_device", set_device)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: current)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: consumer)
    monkeypatch.setattr(torch.cuda, "stream", lambda stream: _NullContext())
    return consumer


class _NullContext:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


def test_a_failing_set_device_in_the_thread_reaches_the_consumer(monkeypatch: pytest.MonkeyPatch) -> None:
    def set_device(device: Any) -> None:
        raise RuntimeError("CUDA error: invalid device ordinal")

    _stand_in_cuda(monkeypatch, set_device)
    got, error = _consume(in_background(lambda: iter([1, 2]), 2, device=torch.device("cuda", 1)))
    assert got == [] and isinstance(error, RuntimeError) and "invalid device ordinal" in str(error)


def test_torchs_set_device_refuses_a_device_without_an_index() -> None:
    """What the stand-in above relies on, checked here without a GPU."""
    with pytest.raises(ValueError, match="specified index"):
        _torch_checks(lambda d: None)(torch.device("cuda"))


def test_a_cuda_device_without_an_index_means_the_consumers_current_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """``device="cuda"`` (what a script or a test passes) once reached ``torch.cuda.set_device``
    as it was, which refuses it: every nvJPEG batch failed on the first GPU run. The consumer's
    current device is the one meant."""
    chosen: list[Any] = []
    _stand_in_cuda(monkeypatch, chosen.append, current=2)
    monkeypatch.setattr(torch.Tensor, "record_stream", lambda self, s: None)
    got, error = _consume(in_background(lambda: iter([1, 2]), 1, device=torch.device("cuda")))
    assert error is None and got == [1, 2] and chosen == [2]


def test_the_thread_runs_on_the_consumers_device_and_hands_items_over_with_events(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    chosen: list[Any] = []
    consumer = _stand_in_cuda(monkeypatch, chosen.append)
    recorded: list[tuple[torch.Tensor, Any]] = []
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    monkeypatch.setattr(torch.Tensor, "record_stream", lambda self, s: recorded.append((self, s)))
    batches = [(torch.full((2,), float(i)), torch.tensor([i])) for i in range(3)]
    got, error = _consume(in_background(lambda: iter(batches), 1, device=torch.device("cuda", 1)))
    assert error is None and [b[1].item() for b in got] == [0, 1, 2]
    assert chosen == [1]  # a new thread starts on device 0
    # one event per item, recorded on the producer's stream, waited on by the consumer's
    assert len(consumer.waited) == 3 and all(isinstance(e, _Event) for e in consumer.waited)
    producer = {id(s) for e in consumer.waited for s in e.recorded_on}
    assert len(producer) == 1 and consumer not in [s for e in consumer.waited for s in e.recorded_on]
    # every tensor of every item is marked as used by the consumer's stream
    assert len(recorded) == 6 and all(s is consumer for _, s in recorded)


def test_one_intraop_thread_here_leaves_every_other_thread_its_count() -> None:
    """The decoded loader's augmenting threads run their operators on one intra-op thread
    (their OpenMP teams would contend with the step's on a host with few cores); the training
    thread, and a thread started afterwards, keep the process's count (torch.set_num_threads(1)
    would have set it for every later thread)."""
    from largebatch.data.background import one_intraop_thread_here

    main_count = torch.get_num_threads()
    seen: list[object] = []

    def augmenting() -> None:
        seen.append((one_intraop_thread_here(), torch.get_num_threads()))

    def later() -> None:
        seen.append(torch.get_num_threads())

    for target in (augmenting, later):
        thread = threading.Thread(target=target)
        thread.start()
        thread.join()
    assert seen == [(True, 1), main_count]
    assert torch.get_num_threads() == main_count


def test_the_decoded_loaders_threads_augment_on_one_intraop_thread(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Each augmenting thread of a pass (2 here, and the one background thread of data.workers=1)
    runs at one intra-op thread; the consumer's count is unchanged."""
    from largebatch.data.contract import LoaderSpec
    from largebatch.data.pipelines import decoded
    from largebatch.data.synthetic import make_synthetic_imagenet

    root = make_synthetic_imagenet(tmp_path / "ds", num_classes=2, train_per_class=8, val_per_class=2, image_size=24)
    main_count = torch.get_num_threads()
    counts: list[int] = []
    original = decoded.DecodedLoader.batch

    def batch(self: Any, *args: Any) -> Any:
        counts.append(torch.get_num_threads())
        return original(self, *args)

    monkeypatch.setattr(decoded.DecodedLoader, "batch", batch)
    for workers in (2, 1):
        counts.clear()
        spec = LoaderSpec(image_size=16, batch_size=4, workers=workers)
        decoded.ensure_decoded_stores(root, spec, cache=tmp_path / "cache", announce=False)
        train, _, _ = decoded.build_decoded_loaders(root, spec, cache=tmp_path / "cache")
        assert len(list(train)) == 4
        assert counts == [1] * 4, (workers, counts)
        assert torch.get_num_threads() == main_count
