"""The torchvision input pipeline: ImageFolder trees (ImageNet or the embedded set) to batches.

Augmentation is the standard ImageNet recipe of :mod:`largebatch.data.augment` as PIL
transforms in the workers (RandomResizedCrop + horizontal flip, as in Goyal et al. 2017 and
the torchvision references; evaluation resizes the shorter side to ``image_size /
crop_ratio`` and takes the centre crop, 0.875: 256 -> 224).

Batch contract of :func:`build_loaders`:

* Iterating a loader yields ``(images, labels)``: float32 ``(N, 3, H, W)`` normalised
  images and int64 ``(N,)`` labels.
* An unreadable file (empty, truncated, not an image) never stops a run: it is skipped and
  counted in ``loader.skipped`` (distinct files found unreadable in this process since the
  loader was built, however often they were read; sum it over ranks for a global count).
  The skipped files travel inside each batch from the worker, so the count is right with
  any number of DataLoader workers. Once every training file of a class has been found
  unreadable, the train loader raises ``DataError`` naming the class (a class the model
  could never see must not pass silently).
* Augmentation is a function of (seed, epoch, sample index): each training sample's crop and
  flip are drawn from a torch generator seeded by those three, whichever worker process
  decodes it. The batches are therefore the same with 0 or N workers, and a run stopped
  mid-epoch and resumed gets the crops the uninterrupted run would have had (bit-exact
  resume with any ``data.workers``).
* Train batches keep their full size ``batch_size`` (fixed shapes: no XLA recompile, no
  uneven DDP step): a skipped image's slot is refilled with a readable image of the same
  batch. If every image of a batch is unreadable, ``DataError`` is raised.
* Progressive resizing (``spec.train_sizes``): the training crop side is a function of the
  epoch (:class:`~largebatch.resolution.ResolutionSchedule`), which each sample key carries
  from the sampler to the worker (``(index, epoch)``), so persistent workers need no rebuild
  and a run resumed inside an epoch gets the same side; so does a crop scale per phase
  (``spec.crop_scale_at``). Val crops are ``spec.val_size``.
* Rectangular validation (``spec.rect_val``): val batches of like aspect ratio, each cropped to
  one ``(H, W)`` of short side ``spec.val_size``, every rank reading whole batches
  (:mod:`largebatch.data.rect_val`).
* Evaluation crops that change with the epoch (``spec.eval_by_epoch``: a side per phase,
  rectangles from an epoch on): the val loader's ``set_epoch(e)`` picks epoch ``e``'s order, and
  its keys ``(index, e)`` carry the epoch to the workers (:class:`~largebatch.data.rect_val.EvalCrops`).
* Val batches drop skipped images (so nothing is counted twice); a batch that loses every
  image is not yielded. A rank whose exact part is empty yields no batch at all.
"""

from __future__ import annotations

import functools
import logging
import os
from typing import Any, Iterator, Sequence

import torch
from torch.utils.data import DataLoader

from largebatch.data.augment import build_train_transform, build_val_transform
from largebatch.data.contract import LoaderSpec
from largebatch.data.image_folder import EpochTransforms, RobustImageFolder
from largebatch.data.images import Unreadable, check_same_classes, split_folder
from largebatch.data.loader_view import LoaderView, UnreadableTally
from largebatch.data.rect_val import EvalCrops, RectTransforms, aspect_ratios, plan_rect_batches
from largebatch.data.samplers import EpochExactSampler, ExactShardSampler, ShardedSampler
from largebatch.data.worker_signals import ignoring_stop_signals
from largebatch.errors import DataError

__all__ = [
    "DataError",
    "SkipCountingLoader",
    "build_loaders",
    "collate_skipping",
]

logger = logging.getLogger(__name__)

# ---------------------------------------------------------------------------------------
# batches (the data set: largebatch.data.image_folder)


def collate_skipping(
    batch: list[tuple[torch.Tensor, int] | Unreadable | None], *, refill: bool
) -> tuple[torch.Tensor | None, torch.Tensor | None, tuple[Unreadable | None, ...]]:
    """Stack a batch, leaving out unreadable files: ``(images, labels, skipped)``.

    ``skipped`` holds the :class:`Unreadable` record (or ``None``) of each file left out.
    ``refill=True`` (training) fills the left-out slots with the batch's readable samples,
    cyclically, so the batch keeps its size; it raises :class:`DataError` if none is
    readable. ``refill=False`` (evaluation) returns the smaller batch, or
    ``(None, None, skipped)`` if nothing is left.
    """
    good = [s for s in batch if s is not None and not isinstance(s, Unreadable)]
    skipped = tuple(s for s in batch if s is None or isinstance(s, Unreadable))
    if not good:
        if refill:
            raise DataError(f"all {len(batch)} images of a training batch are unreadable: "
                            f"check the data set (the log names each file)")
        return None, None, skipped
    if refill and skipped:
        good += [good[i % len(good)] for i in range(len(skipped))]
    images = torch.stack([s[0] for s in good])
    labels = torch.tensor([s[1] for s in good], dtype=torch.int64)
    return images, labels, skipped


class SkipCountingLoader(LoaderView):
    """A DataLoader whose batches are ``(images, labels)``; ``skipped`` counts bad files.

    Wraps a DataLoader built with :func:`collate_skipping`. ``len()``, ``sampler``,
    ``dataset`` and ``batch_size`` are the DataLoader's; ``set_epoch`` forwards to the sampler.
    ``skipped`` is the number of distinct unreadable files seen. With ``require_every_class``
    (training), a class whose every file has been found unreadable raises ``DataError``.
    """

    def __init__(self, loader: DataLoader, *, require_every_class: bool = False) -> None:
        self.loader = loader
        self.require_every_class = require_every_class
        self._unknown = 0  # skipped samples without a record (a dataset returning None)
        self._tally: UnreadableTally | None = None

    @property
    def skipped(self) -> int:
        """Distinct unreadable files seen by this process (each counted once)."""
        return (len(self._tally) if self._tally is not None else 0) + self._unknown

    def _record(self, skipped: Sequence[Unreadable | None]) -> None:
        for rec in skipped:
            if rec is None:
                self._unknown += 1
                continue
            if self._tally is None:
                dataset = self.loader.dataset
                self._tally = UnreadableTally(dataset.classes, dataset.targets, dataset.root,
                                              require_every_class=self.require_every_class)
            self._tally.add(rec.index, rec.target)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for images, labels, skipped in self._loader_pass():
            if skipped:
                self._record(skipped)
            if images is not None:
                yield images, labels


def _rect_val_sampler(val_set: RobustImageFolder, spec: LoaderSpec) -> ExactShardSampler:
    """Rectangular validation: ``val_set`` gets each sample's batch shape as its transform; the
    sampler reads whole batches of the aspect-ratio order (:mod:`largebatch.data.rect_val`)."""
    ratios = aspect_ratios(val_set.root, [path for path, _ in val_set.samples])
    plan = plan_rect_batches(ratios, batch_size=spec.val_batch, side=spec.val_size)
    val_set.transform_of = RectTransforms(plan, side=spec.val_size, crop_ratio=spec.val_crop_ratio)
    return ExactShardSampler(len(val_set), rank=spec.rank, world_size=spec.world_size, order=plan.order,
                             whole_batches=spec.val_batch)


def _epoch_val_sampler(val_set: RobustImageFolder, spec: LoaderSpec) -> EpochExactSampler:
    """Evaluation crops that change with the epoch: ``val_set`` crops each ``(index, epoch)`` key
    for that epoch, the sampler reads that epoch's order (rectangles: whole batches of the
    aspect-ratio order; squares: contiguous blocks)."""
    ratios = aspect_ratios(val_set.root, [path for path, _ in val_set.samples]) if spec.rect_val else None
    crops = EvalCrops(side_at=spec.val_size_at, rect_at=spec.rect_val_at, batch_size=spec.val_batch,
                      crop_ratio=spec.val_crop_ratio, ratios=ratios)
    val_set.transform_of = crops

    def sampler_of(epoch: int) -> ExactShardSampler:
        plan = crops.plan(epoch)
        if plan is None:
            return ExactShardSampler(len(val_set), rank=spec.rank, world_size=spec.world_size)
        return ExactShardSampler(len(val_set), rank=spec.rank, world_size=spec.world_size, order=plan.order,
                                 whole_batches=spec.val_batch)

    return EpochExactSampler(sampler_of)


def _val_sampler(val_set: RobustImageFolder, spec: LoaderSpec) -> ExactShardSampler:
    if spec.eval_by_epoch:
        return _epoch_val_sampler(val_set, spec)
    if spec.rect_val:
        return _rect_val_sampler(val_set, spec)
    return ExactShardSampler(len(val_set), rank=spec.rank, world_size=spec.world_size)


def build_loaders(root: str | os.PathLike, spec: LoaderSpec) -> tuple[SkipCountingLoader, SkipCountingLoader, int]:
    """Train and val loaders of ``root/train`` and ``root/val`` for one rank.

    Args:
        root: folder holding ``train/<class>/`` and ``val/<class>/``.
        spec: sizes, this rank's place, the device (:class:`LoaderSpec`). ``spec.workers``
            DataLoader worker processes per rank (persistent when > 0); training reads this
            rank's part with :class:`ShardedSampler` (drop_last, whole batches, reshuffled per
            epoch via ``set_epoch``), evaluation with :class:`ExactShardSampler` (every image
            once over all ranks). Each training sample's crop and flip come from a generator
            seeded by (``spec.seed``, epoch, sample index), independent of rank, worker count
            and stop point; its side is ``spec.train_size_at(epoch)``, its area range
            ``spec.crop_scale_at(epoch)``, the val crops' ``spec.val_size_at(epoch)``
            (``spec.rect_val_at(epoch)``: rectangles, batches of like aspect ratio).
            Batches stay on the host, pinned for a CUDA ``spec.device``.

    Returns ``(train_loader, val_loader, num_classes)``; see the module docstring for the
    batch and skip contract.
    """
    root = os.fspath(root)
    if spec.train_sizes is None and not spec.crop_scale_steps:
        train_set = RobustImageFolder(
            split_folder(root, "train"), build_train_transform(spec.image_size, scale=spec.crop_scale), seed=spec.seed
        )
    else:
        train_set = RobustImageFolder(split_folder(root, "train"), seed=spec.seed, epoch_transforms=EpochTransforms(
            spec.train_size_at, scale_at=spec.crop_scale_at))
    val_set = RobustImageFolder(
        split_folder(root, "val"), build_val_transform(spec.val_size, crop_ratio=spec.val_crop_ratio)
    )
    check_same_classes(train_set.root, train_set.classes, val_set.root, val_set.classes)
    train_sampler = ShardedSampler(len(train_set), rank=spec.rank, world_size=spec.world_size,
                                   batch_size=spec.step_samples, seed=spec.seed, with_epoch=True)
    val_sampler = _val_sampler(val_set, spec)
    workers = spec.workers
    common: dict[str, Any] = dict(num_workers=workers, pin_memory=spec.pin_memory,
                                  persistent_workers=workers > 0)
    if workers > 0:
        # Workers outlive a SIGTERM/SIGINT sent to the whole job until this process has saved.
        common.update(prefetch_factor=2, worker_init_fn=ignoring_stop_signals())
    train = DataLoader(
        train_set, batch_size=spec.batch_size, sampler=train_sampler, drop_last=True,
        collate_fn=functools.partial(collate_skipping, refill=True),
        generator=torch.Generator().manual_seed(spec.seed + spec.rank), **common,
    )
    val = DataLoader(
        val_set, batch_size=spec.val_batch, sampler=val_sampler, drop_last=False,
        collate_fn=functools.partial(collate_skipping, refill=False), **common,
    )
    return SkipCountingLoader(train, require_every_class=True), SkipCountingLoader(val), len(train_set.classes)
