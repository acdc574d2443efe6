"""What the loaders that wrap a ``torch.utils.data.DataLoader`` share (torchvision, nvjpeg).

:class:`LoaderView` is their base: the members of the :class:`~largebatch.data.contract.Loader`
contract read from the wrapped DataLoader and its sampler (``len()``, ``batch_size``,
``evaluation``, ``total_samples``, ``set_epoch``, ``close``). :class:`UnreadableTally` counts the
unreadable files such a loader meets (its ``skipped``), each once, and stops training on a class
left without a readable image. DALI's loaders wrap no DataLoader and skip no file: neither is
theirs.
"""

from __future__ import annotations

import os
from typing import Any, Iterator, Protocol, Sequence, runtime_checkable

from torch.utils.data import DataLoader

from largebatch.data.samplers import ExactShardSampler, ShardedSampler
from largebatch.data.worker_signals import shutdown_workers, stop_signals_blocked
from largebatch.errors import DataError

__all__ = ["LoaderView", "UnreadableTally"]


@runtime_checkable
class _EpochSampler(Protocol):
    """A sampler whose order depends on the epoch (``ShardedSampler``, ``ExactShardSampler``,
    torch's ``DistributedSampler``): what :meth:`LoaderView.set_epoch` forwards to."""

    def set_epoch(self, epoch: int) -> None: ...


class LoaderView:
    """What every loader wrapper shows of the DataLoader ``self.loader`` it wraps: ``len()``,
    ``sampler``, ``dataset``, ``batch_size``, and ``set_epoch`` for the sampler (shared by
    :class:`largebatch.data.pipelines.torchvision.SkipCountingLoader` and
    :class:`largebatch.data.pipelines.nvjpeg.NvjpegLoader`)."""

    loader: DataLoader

    @property
    def sampler(self) -> Any:
        return self.loader.sampler

    @property
    def dataset(self) -> Any:
        return self.loader.dataset

    @property
    def batch_size(self) -> int | None:
        return self.loader.batch_size

    @property
    def evaluation(self) -> bool:
        """An evaluation loader reads with the exact sampler (every sample once over the ranks)."""
        return isinstance(self.loader.sampler, ExactShardSampler)

    @property
    def total_samples(self) -> int:
        return len(self.loader.dataset)

    def set_epoch(self, epoch: int, skip_batches: int = 0) -> None:
        """Use epoch ``epoch``'s shuffle and skip its first ``skip_batches`` batches (resume).

        The same call as :class:`largebatch.data.pipelines.dali_files.DaliLoader`'s; a skip needs a
        :class:`ShardedSampler` (it becomes ``set_start(skip_batches x batch_size)``).
        """
        sampler = self.loader.sampler
        if not isinstance(sampler, _EpochSampler):
            raise TypeError(f"set_epoch needs a sampler with set_epoch, not {type(sampler).__name__}")
        sampler.set_epoch(epoch)
        if isinstance(sampler, ShardedSampler):
            sampler.set_start(skip_batches * (self.batch_size or 1))
        elif skip_batches:
            raise ValueError(f"skip_batches needs a ShardedSampler, not {type(sampler).__name__}")

    def __len__(self) -> int:
        return len(self.loader)

    def close(self) -> None:
        """End the worker processes now (the run is over); a later pass starts new ones."""
        shutdown_workers(self.loader)

    def _loader_pass(self) -> Iterator[Any]:
        """``iter(self.loader)``, which starts its worker processes (the first pass only, when
        persistent), with SIGTERM/SIGINT held until each worker ignores them
        (:mod:`largebatch.data.worker_signals`)."""
        with stop_signals_blocked():
            return iter(self.loader)


class UnreadableTally:
    """The unreadable files one loader has met, each counted once, and the rule every loader
    applies to them: a training class whose every file is unreadable stops the run.

    ``classes`` and ``targets`` are the data set's (ImageFolder's attributes), ``root`` its
    folder. :meth:`add` returns True the first time a sample index is added.
    """

    def __init__(self, classes: Sequence[str], targets: Sequence[int], root: str, *,
                 require_every_class: bool) -> None:
        self.classes, self.root = list(classes), root
        self.require_every_class = require_every_class
        self._targets = targets
        self._sizes: list[int] | None = None
        self._seen: set[int] = set()
        self._per_class: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self._seen)

    def add(self, index: int, target: int) -> bool:
        if index in self._seen:
            return False
        self._seen.add(index)
        self._per_class[target] = self._per_class.get(target, 0) + 1
        if self.require_every_class:
            self._check_class(target)
        return True

    def _check_class(self, target: int) -> None:
        if self._sizes is None:
            self._sizes = [0] * len(self.classes)
            for t in self._targets:
                self._sizes[t] += 1
        if self._per_class[target] == self._sizes[target]:
            name = self.classes[target]
            raise DataError(
                f"class {name!r} has no readable training image: all {self._sizes[target]} "
                f"file(s) in {os.path.join(self.root, name)} are unreadable (named above in the "
                f"log); replace them or remove the class folder from train/ and val/"
            )
