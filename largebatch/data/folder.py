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
* Val batches drop skipped images (so nothing is counted twice); a batch that loses every
  image is not yielded. A rank whose exact shard is empty yields no batch at all.
"""

from __future__ import annotations

import functools
import logging
import os
import warnings
from typing import Any, Callable, Iterator, NamedTuple, Sequence

import torch
from PIL import Image
from torch.utils.data import DataLoader
from torchvision.datasets import ImageFolder
from torchvision.datasets.folder import IMG_EXTENSIONS

from largebatch.data.augment import (  # noqa: F401  (re-exported: tests and monkeypatches use folder's names)
    IMAGENET_DEFAULT_MEAN,
    IMAGENET_DEFAULT_STD,
    TRAIN_CROP_RATIO,
    TRAIN_CROP_SCALE,
    VAL_CROP_RATIO,
    build_train_transform,
    build_val_transform,
)
from largebatch.data.samplers import ExactShardSampler, ShardedSampler, sample_seed
from largebatch.data.worker_signals import ignoring_stop_signals, stop_signals_blocked
from largebatch.errors import DataError, UsageError

__all__ = [
    "IMAGENET_DEFAULT_MEAN",
    "IMAGENET_DEFAULT_STD",
    "DataError",
    "RobustImageFolder",
    "LoaderView",
    "SkipCountingLoader",
    "build_loaders",
    "build_train_transform",
    "build_val_transform",
    "UnreadableTally",
    "collate_skipping",
    "decompression_bomb_limit",
    "list_class_images",
    "load_rgb",
    "sample_seed",
]

logger = logging.getLogger(__name__)

# ---------------------------------------------------------------------------------------
# data set


class Unreadable(NamedTuple):
    """What the data set returns for a file it cannot decode (the collate function counts it)."""

    index: int
    target: int


def load_rgb(path: str) -> Image.Image:
    """Decode any image Pillow reads (JPEG L/CMYK, PNG, palette, RGBA) into an RGB image.

    The content decides the format, not the name: ImageNet holds a PNG and CMYK JPEGs named
    ``.JPEG``. Raises ``OSError``/``ValueError`` for a file that is not a whole image.
    """
    with Image.open(path) as img:
        img.load()  # decode now, inside the caller's error handling (truncation shows here)
        if img.mode == "P" and "transparency" in img.info:
            img = img.convert("RGBA")  # avoids Pillow's palette-transparency warning
        return img.convert("RGB")


def list_class_images(
    split_dir: str | os.PathLike, class_to_idx: dict[str, int], extensions: tuple[str, ...] = IMG_EXTENSIONS
) -> list[tuple[str, int]]:
    """``(path, label)`` of every image under each class folder: torchvision's order and labels.

    Written here instead of torchvision's ``make_dataset`` because that one walks with
    ``os.walk(followlinks=True)`` and no guard: a link such as ``train/a/up -> ..`` is
    followed ~40 levels deep and lists every other class's images again, labelled ``a``,
    without a word. Here each directory is entered once (by its real path), and a directory
    link that loops back to a folder above it or leaves its class folder is refused with a
    ``DataError`` naming it; a folder that cannot be read is named too. Links to files and a
    class folder that is itself a link (datasets assembled from links) are followed.
    """
    split_dir = os.fspath(split_dir)
    samples: list[tuple[str, int]] = []
    for cls in sorted(class_to_idx):
        class_dir = os.path.join(split_dir, cls)
        class_real = os.path.realpath(class_dir)
        seen = {class_real}

        def unreadable(err: OSError) -> None:
            raise DataError(f"cannot read folder {err.filename}: {err.strerror}; make it readable "
                            f"or move it out of {split_dir}")

        found = []
        for here, dirs, files in os.walk(class_dir, onerror=unreadable, followlinks=True):
            here_real = os.path.realpath(here)
            for name in list(dirs):
                path = os.path.join(here, name)
                real = os.path.realpath(path)
                if os.path.islink(path):
                    if here_real == real or here_real.startswith(real + os.sep):
                        raise DataError(f"{path} links to {real}, a folder above it (a loop): "
                                        f"remove the link")
                    if real != class_real and not real.startswith(class_real + os.sep):
                        raise DataError(f"{path} links to {real}, outside its class folder "
                                        f"{class_dir}: its images would be labelled {cls!r}; "
                                        f"remove the link or link the files one by one")
                if real in seen:
                    dirs.remove(name)  # reached twice (two links, or a link and the folder)
                else:
                    seen.add(real)
            found.append((here, sorted(files)))
        for here, files in sorted(found):
            for name in files:
                if name.lower().endswith(extensions):  # a broken link is listed, then reported unreadable
                    samples.append((os.path.join(here, name), class_to_idx[cls]))
    return samples


class RobustImageFolder(ImageFolder):
    """ImageFolder that decodes every image to RGB and skips unreadable files.

    ``dataset[i]`` is ``(image, label)``, or :class:`Unreadable` when file ``i`` cannot be
    decoded (the path and the reason are logged once per process); :func:`collate_skipping`
    removes it and reports it. ``dataset[(i, epoch)]`` (what ``ShardedSampler(with_epoch=
    True)`` yields) runs the transform under a torch generator seeded by
    :func:`sample_seed` ``(seed, epoch, i)``, so the augmentation does not depend on the
    process or the order in which samples are decoded. Raises :class:`DataError` for a
    missing root or a class folder without images, instead of torchvision's generic errors.
    """

    def __init__(self, root: str | os.PathLike, transform: Callable | None = None, *, seed: int = 0) -> None:
        root = os.fspath(root)
        if not os.path.isdir(root):
            raise DataError(f"data folder {root} does not exist: point data.root at an "
                            f"ImageFolder tree (<root>/<class>/*.JPEG)")
        try:
            super().__init__(root, transform=transform, loader=load_rgb, allow_empty=True)
        except FileNotFoundError as err:  # no class folder at all
            raise DataError(f"data folder {root} has no class sub-folders ({err})") from None
        counts = [0] * len(self.classes)
        for target in self.targets:
            counts[target] += 1
        empty = [c for c, n in zip(self.classes, counts) if n == 0]
        if empty:
            raise DataError(
                f"class folder {os.path.join(root, empty[0])} holds no image "
                f"({len(empty)} empty class folder(s); extensions read: {', '.join(IMG_EXTENSIONS)}): "
                f"add images or remove the folder"
            )
        self._reported: set[str] = set()
        self.seed = seed

    @staticmethod
    def make_dataset(directory: str, class_to_idx: dict[str, int], extensions: Any = None,
                     is_valid_file: Any = None, allow_empty: bool = False) -> list[tuple[str, int]]:
        """torchvision's hook for the sample list: :func:`list_class_images` (loop-safe)."""
        return list_class_images(directory, class_to_idx)

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
                with torch.random.fork_rng(devices=[]):
                    torch.default_generator.manual_seed(sample_seed(self.seed, epoch, index))
                    image = self.transform(image)
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


class LoaderView:
    """What every loader wrapper shows of the DataLoader ``self.loader`` it wraps: ``len()``,
    ``sampler``, ``dataset``, ``batch_size``, and ``set_epoch`` for the sampler (shared by
    :class:`SkipCountingLoader` and :class:`largebatch.data.nvjpeg.NvjpegLoader`)."""

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

    def set_epoch(self, epoch: int, skip_batches: int = 0) -> None:
        """Use epoch ``epoch``'s shuffle and skip its first ``skip_batches`` batches (resume).

        The same call as :class:`largebatch.data.dali.DaliLoader`'s; a skip needs a
        :class:`ShardedSampler` (it becomes ``set_start(skip_batches x batch_size)``).
        """
        sampler = self.loader.sampler
        sampler.set_epoch(epoch)
        if isinstance(sampler, ShardedSampler):
            sampler.set_start(skip_batches * (self.batch_size or 1))
        elif skip_batches:
            raise ValueError(f"skip_batches needs a ShardedSampler, not {type(sampler).__name__}")

    def __len__(self) -> int:
        return len(self.loader)

    def _loader_pass(self) -> Iterator[Any]:
        """``iter(self.loader)``, which starts its worker processes (the first pass only, when
        persistent), with SIGTERM/SIGINT held until each worker ignores them
        (:mod:`largebatch.data.worker_signals`)."""
        with stop_signals_blocked():
            return iter(self.loader)


def decompression_bomb_limit() -> int | None:
    """The most pixels an image may have: Pillow's ``Image.open`` refuses more than twice
    ``Image.MAX_IMAGE_PIXELS`` (a 600-byte JPEG can claim 30000x30000); None if unlimited."""
    return None if Image.MAX_IMAGE_PIXELS is None else 2 * Image.MAX_IMAGE_PIXELS


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


def _check_same_classes(train: RobustImageFolder, val: RobustImageFolder) -> None:
    if train.classes != val.classes:
        only_train = sorted(set(train.classes) - set(val.classes))
        only_val = sorted(set(val.classes) - set(train.classes))
        raise DataError(
            f"train ({train.root}) and val ({val.root}) class folders differ: "
            f"{len(only_train)} only in train {only_train[:3]}, {len(only_val)} only in val "
            f"{only_val[:3]}; both splits need the same class folders"
        )


def _split_folder(root: str, split: str) -> str:
    path = os.path.join(root, split)
    if not os.path.isdir(root):
        raise DataError(f"data root {root} does not exist: set data.root to a folder holding "
                        f"train/ and val/, or leave it unset for the embedded data set")
    if not os.path.isdir(path):
        raise DataError(f"data root {root} has no {split}/ folder: expected "
                        f"{root}/{split}/<class>/*.JPEG")
    return path


def build_loaders(
    root: str | os.PathLike,
    *,
    image_size: int,
    batch_size: int,
    workers: int,
    rank: int = 0,
    world_size: int = 1,
    seed: int = 0,
    crop_scale: Sequence[float] = TRAIN_CROP_SCALE,
    val_crop_ratio: float = VAL_CROP_RATIO,
    pin_memory: bool = False,
    val_batch_size: int | None = None,
) -> tuple[SkipCountingLoader, SkipCountingLoader, int]:
    """Train and val loaders of ``root/train`` and ``root/val`` for one rank.

    Args:
        root: folder holding ``train/<class>/`` and ``val/<class>/``.
        image_size: side of the training crop and of the val centre crop, pixels.
        batch_size: per-device batch size (the global batch is this x world size).
        workers: DataLoader worker processes per rank (persistent when > 0).
        rank, world_size: this rank's place; train uses :class:`ShardedSampler` (drop_last,
            whole batches, reshuffled per epoch via ``set_epoch``), val
            :class:`ExactShardSampler` (every image once over all ranks).
        seed: seed of the shard permutation and of the augmentation: each training sample's
            crop and flip come from a generator seeded by (``seed``, epoch, sample index),
            independent of rank, worker count and stop point.
        crop_scale: RandomResizedCrop area range.
        val_crop_ratio: val centre crop / resized shorter side.
        pin_memory: pin batches for faster host-to-device copies.
        val_batch_size: per-device val batch (default ``batch_size``).

    Returns ``(train_loader, val_loader, num_classes)``; see the module docstring for the
    batch and skip contract.
    """
    root = os.fspath(root)
    train_set = RobustImageFolder(
        _split_folder(root, "train"), build_train_transform(image_size, scale=crop_scale), seed=seed
    )
    val_set = RobustImageFolder(
        _split_folder(root, "val"), build_val_transform(image_size, crop_ratio=val_crop_ratio)
    )
    _check_same_classes(train_set, val_set)
    train_sampler = ShardedSampler(
        len(train_set), rank=rank, world_size=world_size, batch_size=batch_size, seed=seed, with_epoch=True
    )
    val_sampler = ExactShardSampler(len(val_set), rank=rank, world_size=world_size)
    common: dict[str, Any] = dict(num_workers=workers, pin_memory=pin_memory,
                                  persistent_workers=workers > 0)
    if workers > 0:
        # Workers outlive a SIGTERM/SIGINT sent to the whole job until this process has saved.
        common.update(prefetch_factor=2, worker_init_fn=ignoring_stop_signals())
    train = DataLoader(
        train_set, batch_size=batch_size, sampler=train_sampler, drop_last=True,
        collate_fn=functools.partial(collate_skipping, refill=True),
        generator=torch.Generator().manual_seed(seed + rank), **common,
    )
    val = DataLoader(
        val_set, batch_size=val_batch_size or batch_size, sampler=val_sampler, drop_last=False,
        collate_fn=functools.partial(collate_skipping, refill=False), **common,
    )
    return SkipCountingLoader(train, require_every_class=True), SkipCountingLoader(val), len(train_set.classes)
