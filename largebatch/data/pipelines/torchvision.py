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
  and a run resumed inside an epoch gets the same side. Val crops are ``spec.val_size``.
* Val batches drop skipped images (so nothing is counted twice); a batch that loses every
  image is not yielded. A rank whose exact part is empty yields no batch at all.
"""

from __future__ import annotations

import functools
import logging
import os
import warnings
from typing import Any, Callable, Iterator, Sequence

import torch
from PIL import Image
from torch.utils.data import DataLoader
from torchvision.datasets import ImageFolder

from largebatch.data.augment import build_train_transform, build_val_transform
from largebatch.data.contract import LoaderSpec, LoaderView, UnreadableTally
from largebatch.data.images import Unreadable, check_same_classes, list_folder, load_rgb, split_folder
from largebatch.data.samplers import ExactShardSampler, ShardedSampler, sample_seed
from largebatch.data.worker_signals import ignoring_stop_signals
from largebatch.errors import DataError
from largebatch.resolution import ResolutionSchedule

__all__ = [
    "DataError",
    "EpochTransforms",
    "RobustImageFolder",
    "SkipCountingLoader",
    "build_loaders",
    "collate_skipping",
]

logger = logging.getLogger(__name__)

# ---------------------------------------------------------------------------------------
# data set


class EpochTransforms:
    """The training transform of each epoch (progressive resizing): :func:`build_train_transform`
    at ``schedule.size_at(epoch)``, built once per side in each process that uses it."""

    def __init__(self, schedule: ResolutionSchedule, *, scale: Sequence[float]) -> None:
        self.schedule, self.scale = schedule, tuple(scale)
        self._by_size: dict[int, Callable] = {}

    def at(self, epoch: int) -> Callable:
        size = self.schedule.size_at(epoch)
        if size not in self._by_size:
            self._by_size[size] = build_train_transform(size, scale=self.scale)
        return self._by_size[size]


class RobustImageFolder(ImageFolder):
    """ImageFolder that decodes every image to RGB and skips unreadable files.

    ``dataset[i]`` is ``(image, label)``, or :class:`Unreadable` when file ``i`` cannot be
    decoded (the path and the reason are logged once per process); :func:`collate_skipping`
    removes it and reports it. ``dataset[(i, epoch)]`` (what ``ShardedSampler(with_epoch=
    True)`` yields) runs the transform under a torch generator seeded by
    :func:`sample_seed` ``(seed, epoch, i)``, so the augmentation does not depend on the
    process or the order in which samples are decoded; with ``epoch_transforms`` (progressive
    resizing) the transform itself is the epoch's. Raises :class:`DataError` for a
    missing root or a class folder without images, instead of torchvision's generic errors.
    """

    def __init__(self, root: str | os.PathLike, transform: Callable | None = None, *, seed: int = 0,
                 epoch_transforms: EpochTransforms | None = None) -> None:
        self._listing: tuple[list[str], list[tuple[str, int]]] | None = None
        if epoch_transforms is not None and transform is None:
            transform = epoch_transforms.at(0)  # a key without an epoch: epoch 0's side
        super().__init__(os.fspath(root), transform=transform, loader=load_rgb, allow_empty=True)
        self._reported: set[str] = set()
        self.seed = seed
        self.epoch_transforms = epoch_transforms

    def find_classes(self, directory: str) -> tuple[list[str], dict[str, int]]:
        """torchvision's hook for the classes: :func:`list_folder` lists and checks the tree."""
        self._listing = list_folder(directory)
        classes = self._listing[0]
        return classes, {c: i for i, c in enumerate(classes)}

    def make_dataset(self, directory: str, class_to_idx: dict[str, int], extensions: Any = None,  # type: ignore[override]
                     is_valid_file: Any = None, allow_empty: bool = False) -> list[tuple[str, int]]:
        """torchvision's hook for the samples: those :meth:`find_classes` listed (loop-safe)."""
        assert self._listing is not None
        return self._listing[1]

    def __getitem__(self, key: int | tuple[int, int]) -> tuple[Any, int] | Unreadable:
        index, epoch = key if isinstance(key, tuple) else (key, None)
        path, target = self.samples[index]
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # e.g. Pillow's EXIF / decompression warnings
                image = self.loader(path)
        except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as err:
            if path not in self._reported:
                self._reported.add(path)
                logger.warning("skipping unreadable image %s: %s", path, err)
            return Unreadable(index, target)
        if self.transform is not None:
            if epoch is None:
                image = self.transform(image)
            else:
                # The transforms draw from torch's global generator: seed a private copy of
                # it for this sample (fork_rng restores the caller's stream afterwards).
                # (Only the CPU generator: torch.manual_seed also seeds every accelerator, ~1 ms.)
                transform = self.transform if self.epoch_transforms is None else self.epoch_transforms.at(epoch)
                with torch.random.fork_rng(devices=[]):
                    torch.default_generator.manual_seed(sample_seed(self.seed, epoch, index))
                    image = transform(image)
        return image, target


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
            and stop point; its side is ``spec.train_size_at(epoch)``, the val crops'
            ``spec.val_size``. Batches stay on the host, pinned for a CUDA ``spec.device``.

    Returns ``(train_loader, val_loader, num_classes)``; see the module docstring for the
    batch and skip contract.
    """
    root = os.fspath(root)
    if spec.train_sizes is None:
        train_set = RobustImageFolder(
            split_folder(root, "train"), build_train_transform(spec.image_size, scale=spec.crop_scale), seed=spec.seed
        )
    else:
        train_set = RobustImageFolder(split_folder(root, "train"), seed=spec.seed,
                                      epoch_transforms=EpochTransforms(spec.train_sizes, scale=spec.crop_scale))
    val_set = RobustImageFolder(
        split_folder(root, "val"), build_val_transform(spec.val_size, crop_ratio=spec.val_crop_ratio)
    )
    check_same_classes(train_set.root, train_set.classes, val_set.root, val_set.classes)
    train_sampler = ShardedSampler(len(train_set), rank=spec.rank, world_size=spec.world_size,
                                   batch_size=spec.step_samples, seed=spec.seed, with_epoch=True)
    val_sampler = ExactShardSampler(len(val_set), rank=spec.rank, world_size=spec.world_size)
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
