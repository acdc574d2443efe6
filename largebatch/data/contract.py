"""The loader contract: what the trainer, the evaluator and the backends use of a loader.

Every input pipeline (``data.loader=torchvision``, ``nvjpeg``, ``dali`` over files or packed
shards) returns loaders that satisfy :class:`Loader`; ``tests/test_loader_contract.py`` checks
all four. The contract, written once:

* iterating yields ``(images, labels)`` batches of the current epoch: ``(N, 3, S, S)`` float
  images (normalised; in the compute dtype and on the device where the pipeline decodes
  there) and int64 ``(N,)`` labels; training batches are full (``batch_size``), evaluation
  batches may be short and a rank may get none (every validation image once over all ranks);
* ``len(loader)`` is the number of batches of a whole epoch for this rank, the same on every
  rank for training;
* ``set_epoch(epoch, skip_batches=0)``, called before every pass, selects the epoch's order
  and augmentation and makes the pass skip the epoch's first ``skip_batches`` batches (a run
  resumed mid-epoch reads the batches the uninterrupted run would have read);
* ``skipped`` counts the distinct unreadable files this process met, each once however often
  it was read (:class:`UnreadableTally`, which also stops training on a class left without a
  readable image); DALI cannot skip a file, so the data check leaves them out and its
  ``skipped`` stays 0;
* ``batch_size`` is the batch size of this rank;
* ``evaluation`` is True for an evaluation loader (every sample of the split once over all
  ranks, the last batches short or none), False for a training loader (whole batches, the
  same count on every rank); a backend that needs equal batch counts (XLA) pads by it;
* ``total_samples`` is the number of samples of the split, all ranks together;
* ``close()`` releases the loader's workers (processes, DALI pipelines) now, when the run is
  over, so that a stopped run exits within seconds of its checkpoint; a later pass starts
  them again.

:class:`LoaderSpec` is what every builder is told (sizes, this rank's place, the device);
:class:`LoaderView` is the base of the loaders that wrap a ``torch.utils.data.DataLoader``
(torchvision, nvjpeg).

Words: a rank's *part* is the samples one data-parallel rank reads in an epoch; a *shard* is only
a packed WebDataset tar file of ``largebatch-make-shards`` (``data.shards``). DALI calls a rank's
part a "shard" (``shard_id``/``num_shards``): those are DALI's argument names, kept where passed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional, Protocol, Sequence, runtime_checkable

import torch
from torch import Tensor
from torch.utils.data import DataLoader

from largebatch.data.samplers import ExactShardSampler, ShardedSampler
from largebatch.data.worker_signals import shutdown_workers, stop_signals_blocked
from largebatch.defaults import SHUFFLE_BUFFER, TRAIN_CROP_SCALE, VAL_CROP_RATIO, check_val_crop_ratio
from largebatch.errors import DataError
from largebatch.resolution import ResolutionSchedule

__all__ = ["Loader", "LoaderSpec", "LoaderView", "UnreadableTally"]


@runtime_checkable
class Loader(Protocol):
    """A loader of one split for one rank (see the module docstring for each member's meaning)."""

    batch_size: Any
    skipped: int
    evaluation: bool
    total_samples: int

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]: ...

    def __len__(self) -> int: ...

    def set_epoch(self, epoch: int, skip_batches: int = 0) -> None: ...

    def close(self) -> None: ...


@runtime_checkable
class _EpochSampler(Protocol):
    """A sampler whose order depends on the epoch (``ShardedSampler``, ``ExactShardSampler``,
    torch's ``DistributedSampler``): what :meth:`LoaderView.set_epoch` forwards to."""

    def set_epoch(self, epoch: int) -> None: ...


@dataclass(frozen=True)
class LoaderSpec:
    """What every loader builder is told: one value per option, built once (``run._data``).

    Options only one pipeline reads (nvjpeg's ``prefetch_batches``, DALI's ``file_list`` ...)
    stay keyword arguments of that pipeline's builder. Change one with
    ``dataclasses.replace(spec, workers=2)``.

    Args:
        image_size: side of the training crop and of the val centre crop, pixels.
        train_sizes: progressive resizing: the training crop side per epoch
            (:class:`~largebatch.resolution.ResolutionSchedule`); None: ``image_size`` every epoch.
        val_image_size: the val centre crop side, pixels; None: ``image_size``.
        batch_size: per-device training batch (the global batch is this x world size).
        workers: DataLoader worker processes per rank (torchvision, nvjpeg); DALI's CPU threads.
        seed: seed of the epoch permutation and of the augmentation.
        crop_scale: random-resized-crop area range (fraction of the image).
        val_crop_ratio: val centre crop / resized shorter side, in (0, 1].
        val_batch_size: per-device val batch; None: ``batch_size``.
        rank: this rank's place among the data-parallel ranks (each reads its part).
        world_size: the number of data-parallel ranks.
        device: the ``torch.device`` of the run. A CUDA device pins host batches, decodes with
            nvJPEG (nvjpeg) and with DALI's mixed decoder on ``device.index``; the CPU decodes there.
        dtype: the compute dtype nvjpeg yields images in (DALI: its builders' own ``dtype``,
            as DALI has no bfloat16 output).
        channels_last: yield NCHW-shaped images in ``torch.channels_last`` memory (the model's).
        shuffle_buffer: samples DALI's webdataset reader mixes inside a rank's part (packed
            shards only, ``data.shuffle_buffer``).
        accumulation_steps: micro-batches per optimizer step. A training part is trimmed to
            whole steps (``batch_size x accumulation_steps`` samples), so a training pass
            yields only batches that are trained on: DALI's file pipeline, which cannot leave
            an epoch half read, is then never rebuilt between epochs.
    """

    image_size: int
    batch_size: int
    workers: int
    seed: int = 0
    crop_scale: tuple[float, float] = field(default=tuple(TRAIN_CROP_SCALE))  # type: ignore[assignment]
    val_crop_ratio: float = VAL_CROP_RATIO
    val_batch_size: Optional[int] = None
    rank: int = 0
    world_size: int = 1
    device: torch.device = field(default=torch.device("cpu"))
    dtype: torch.dtype = torch.float32
    channels_last: bool = False
    shuffle_buffer: int = SHUFFLE_BUFFER
    accumulation_steps: int = 1
    train_sizes: Optional[ResolutionSchedule] = None
    val_image_size: Optional[int] = None

    def __post_init__(self) -> None:  # accept "cpu"/"cuda:0" and a list crop_scale (the config's)
        object.__setattr__(self, "device", torch.device(self.device))
        object.__setattr__(self, "crop_scale", tuple(self.crop_scale))
        if self.accumulation_steps < 1:
            raise ValueError(f"accumulation_steps must be >= 1, got {self.accumulation_steps}")
        check_val_crop_ratio(self.val_crop_ratio)  # here, once for every pipeline

    def train_size_at(self, epoch: int) -> int:
        """The training crop side of epoch ``epoch`` (from 0), pixels."""
        return self.image_size if self.train_sizes is None else self.train_sizes.size_at(epoch)

    @property
    def val_size(self) -> int:
        """The val centre crop side, pixels."""
        return self.image_size if self.val_image_size is None else self.val_image_size

    @property
    def resized(self) -> bool:
        """Progressive resizing or an evaluation side of its own (``data.resolution``)."""
        return self.train_sizes is not None or self.val_image_size is not None

    @property
    def on_gpu(self) -> bool:
        """A CUDA device: pinned host memory, nvJPEG and DALI's mixed decode."""
        return self.device.type == "cuda"

    @property
    def pin_memory(self) -> bool:
        return self.on_gpu

    @property
    def layout(self) -> str:
        """DALI's output layout: ``NHWC`` for :attr:`channels_last`, else ``NCHW``."""
        return "NHWC" if self.channels_last else "NCHW"

    @property
    def val_batch(self) -> int:
        return self.val_batch_size or self.batch_size

    @property
    def step_samples(self) -> int:
        """Samples of one optimizer step on this rank: training parts are whole steps."""
        return self.batch_size * self.accumulation_steps


class LoaderView:
    """What every loader wrapper shows of the DataLoader ``self.loader`` it wraps: ``len()``,
    ``sampler``, ``dataset``, ``batch_size``, and ``set_epoch`` for the sampler (shared by
    :class:`SkipCountingLoader` and :class:`largebatch.data.pipelines.nvjpeg.NvjpegLoader`)."""

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
