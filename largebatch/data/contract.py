"""The loader contract: what the trainer, the evaluator and the backends use of a loader.

Every input pipeline (``data.loader=torchvision``, ``nvjpeg``, ``dali`` over files or packed
shards) returns loaders that satisfy :class:`Loader`; ``tests/test_loader_contract.py`` checks
all four. The contract, written once:

* iterating yields ``(images, labels)`` batches of the current epoch: ``(N, 3, S, S)`` float
  images (normalised; in the compute dtype and on the device where the pipeline decodes
  there) and int64 ``(N,)`` labels; training batches are full (``batch_size``), evaluation
  batches may be short and a rank may get none (every validation image once over all ranks);
  with :attr:`LoaderSpec.rect_val` an evaluation batch is ``(N, 3, H, W)``, its own rectangle;
* ``len(loader)`` is the number of batches of a whole epoch for this rank, the same on every
  rank for training;
* ``set_epoch(epoch, skip_batches=0)``, called before every pass, selects the epoch's order
  and augmentation and makes the pass skip the epoch's first ``skip_batches`` batches (a run
  resumed mid-epoch reads the batches the uninterrupted run would have read); on an evaluation
  loader (called before each evaluation with the epoch just trained) it selects that epoch's
  evaluation side and shape (:meth:`LoaderSpec.val_size_at`, :meth:`LoaderSpec.rect_val_at`);
* ``skipped`` counts the distinct unreadable files this process met, each once however often
  it was read (:class:`largebatch.data.loader_view.UnreadableTally`, which also stops training
  on a class left without a readable image); DALI cannot skip a file, so the data check leaves them out and its
  ``skipped`` stays 0;
* ``batch_size`` is the batch size of this rank;
* ``evaluation`` is True for an evaluation loader (every sample of the split once over all
  ranks, the last batches short or none), False for a training loader (whole batches, the
  same count on every rank); a backend that needs equal batch counts (XLA) pads by it;
* ``total_samples`` is the number of samples of the split, all ranks together;
* ``close()`` releases the loader's workers (processes, DALI pipelines) now, when the run is
  over, so that a stopped run exits within seconds of its checkpoint; a later pass starts
  them again.

:class:`LoaderSpec` is what every builder is told (sizes, this rank's place, the device).

This module is a leaf of ``largebatch.data``: the implementations import it, it imports none
of them (only the ground: :mod:`largebatch.defaults`, :mod:`largebatch.resolution`);
``tests/test_layers.py`` keeps it so. What the loaders wrapping a ``torch.utils.data.DataLoader``
(torchvision, nvjpeg) share is in :mod:`largebatch.data.loader_view`.

Words: a rank's *part* is the samples one data-parallel rank reads in an epoch; a *shard* is only
a packed WebDataset tar file of ``largebatch-make-shards`` (``data.shards``). DALI calls a rank's
part a "shard" (``shard_id``/``num_shards``): those are DALI's argument names, kept where passed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator, Optional, Protocol, runtime_checkable

import torch
from torch import Tensor

from largebatch.defaults import SHUFFLE_BUFFER, TRAIN_CROP_SCALE, VAL_CROP_RATIO, check_val_crop_ratio
from largebatch.resolution import ResolutionSchedule, min_scale_at

__all__ = ["Loader", "LoaderSpec"]


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
        eval_size: the val centre crop side, pixels (``data.resolution.eval_size``, as each
            ``data.resolution`` option here has its config key's name); None: ``image_size``.
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
        rect_val: rectangular validation (``data.resolution.rect_val``): val batches of like
            aspect ratio, each centre-cropped to one rectangle of short side ``val_size``
            (:mod:`largebatch.data.rect_val`); the torchvision pipeline only.
        crop_scale_steps: ``((epoch, min_scale), ...)``: from each epoch on, the training crop's
            minimum area fraction (``data.resolution.crop_scale_steps``); ``crop_scale[0]``
            before the first, ``crop_scale[1]`` its maximum throughout.
        eval_follows_train: evaluate after each epoch at that epoch's training side
            (``data.resolution.eval_follows_train``) instead of ``val_size``.
        rect_val_from_epoch: with ``rect_val``, the first epoch evaluated with rectangles
            (``data.resolution.rect_val_from_epoch``); earlier ones take the centre square.
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
    eval_size: Optional[int] = None
    rect_val: bool = False
    crop_scale_steps: tuple[tuple[int, float], ...] = ()
    eval_follows_train: bool = False
    rect_val_from_epoch: int = 0

    def __post_init__(self) -> None:  # accept "cpu"/"cuda:0" and a list crop_scale (the config's)
        object.__setattr__(self, "device", torch.device(self.device))
        object.__setattr__(self, "crop_scale", tuple(self.crop_scale))
        object.__setattr__(self, "crop_scale_steps", tuple((int(e), float(m)) for e, m in self.crop_scale_steps))
        if self.accumulation_steps < 1:
            raise ValueError(f"accumulation_steps must be >= 1, got {self.accumulation_steps}")
        check_val_crop_ratio(self.val_crop_ratio)  # here, once for every pipeline

    def train_size_at(self, epoch: int) -> int:
        """The training crop side of epoch ``epoch`` (from 0), pixels."""
        return self.image_size if self.train_sizes is None else self.train_sizes.size_at(epoch)

    def largest_train_size(self) -> int:
        """The largest training crop side of any epoch, pixels."""
        return self.image_size if self.train_sizes is None else self.train_sizes.largest

    def crop_scale_at(self, epoch: int) -> tuple[float, float]:
        """The training random-resized crop's area range of epoch ``epoch`` (from 0)."""
        if not self.crop_scale_steps:
            return self.crop_scale
        return (min_scale_at(self.crop_scale_steps, epoch, self.crop_scale[0]), self.crop_scale[1])

    @property
    def val_size(self) -> int:
        """The val centre crop side, pixels (with :attr:`eval_follows_train`: of a fresh loader,
        before any ``set_epoch``, which is epoch 0's)."""
        return self.val_size_at(0)

    def val_size_at(self, epoch: int) -> int:
        """The evaluation side after training epoch ``epoch`` (from 0), pixels."""
        if self.eval_follows_train:
            return self.train_size_at(epoch)
        return self.image_size if self.eval_size is None else self.eval_size

    def rect_val_at(self, epoch: int) -> bool:
        """Rectangular validation after training epoch ``epoch`` (from 0)."""
        return self.rect_val and epoch >= self.rect_val_from_epoch

    @property
    def eval_by_epoch(self) -> bool:
        """The evaluation crops change with the epoch (a side that follows the training side's
        phase, or rectangles from an epoch on): the evaluation loader's ``set_epoch`` picks them."""
        return (self.eval_follows_train and self.train_sizes is not None) or (
            self.rect_val and self.rect_val_from_epoch > 0)

    @property
    def resized(self) -> bool:
        """Progressive resizing, an evaluation side of its own or per-epoch crop scales
        (``data.resolution``)."""
        return (self.train_sizes is not None or self.eval_size is not None or self.eval_follows_train
                or bool(self.crop_scale_steps))

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
