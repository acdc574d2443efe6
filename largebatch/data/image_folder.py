"""An image folder as a data set: decoded to RGB, unreadable files skipped, augmentation seeded per
sample and epoch, the training transform of each epoch (progressive resizing).

Shared by the pipelines that decode on the CPU from an image folder
(:mod:`largebatch.data.pipelines.torchvision`) and that read its files for a device decoder
(:mod:`largebatch.data.pipelines.nvjpeg`); listing and checking the folder is
:mod:`largebatch.data.images`'.
"""

from __future__ import annotations

import logging
import os
import warnings
from typing import Any, Callable, Sequence

import torch
from PIL import Image
from torchvision.datasets import ImageFolder

from largebatch.data.augment import build_train_transform
from largebatch.data.images import Unreadable, list_folder, load_rgb
from largebatch.data.samplers import sample_seed

__all__ = ["EpochTransforms", "RobustImageFolder"]

logger = logging.getLogger(__name__)


class EpochTransforms:
    """The training transform of each epoch (progressive resizing, a crop scale per phase):
    :func:`build_train_transform` at side ``size_at(epoch)`` and area range ``scale_at(epoch)``
    (``LoaderSpec.train_size_at``, ``LoaderSpec.crop_scale_at``), built once per pair in each
    process that uses it."""

    def __init__(self, size_at: Callable[[int], int], *, scale_at: Callable[[int], Sequence[float]]) -> None:
        self.size_at, self.scale_at = size_at, scale_at
        self._built: dict[tuple[int, tuple[float, ...]], Callable] = {}

    def at(self, epoch: int) -> Callable:
        key = (self.size_at(epoch), tuple(self.scale_at(epoch)))
        if key not in self._built:
            self._built[key] = build_train_transform(key[0], scale=key[1])
        return self._built[key]


class RobustImageFolder(ImageFolder):
    """ImageFolder that decodes every image to RGB and skips unreadable files.

    ``dataset[i]`` is ``(image, label)``, or :class:`Unreadable` when file ``i`` cannot be
    decoded (the path and the reason are logged once per process); :func:`collate_skipping`
    removes it and reports it. ``dataset[(i, epoch)]`` (what ``ShardedSampler(with_epoch=
    True)`` yields) runs the transform under a torch generator seeded by
    :func:`sample_seed` ``(seed, epoch, i)``, so the augmentation does not depend on the
    process or the order in which samples are decoded; with ``epoch_transforms`` (progressive
    resizing) the transform itself is the epoch's. With ``transform_of`` (evaluation crops that
    depend on the sample or the epoch: rectangular validation, an evaluation side per phase)
    ``dataset[i]``'s transform is ``transform_of(i, None)``, ``dataset[(i, epoch)]``'s
    ``transform_of(i, epoch)``, unseeded (evaluation draws nothing). Raises :class:`DataError` for a
    missing root or a class folder without images, instead of torchvision's generic errors.
    """

    def __init__(self, root: str | os.PathLike, transform: Callable | None = None, *, seed: int = 0,
                 epoch_transforms: EpochTransforms | None = None,
                 transform_of: Callable[[int, int | None], Callable] | None = None) -> None:
        self._listing: tuple[list[str], list[tuple[str, int]]] | None = None
        if epoch_transforms is not None and transform is None:
            transform = epoch_transforms.at(0)  # a key without an epoch: epoch 0's side
        super().__init__(os.fspath(root), transform=transform, loader=load_rgb, allow_empty=True)
        self._reported: set[str] = set()
        self.seed = seed
        self.epoch_transforms = epoch_transforms
        self.transform_of = transform_of

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
        if self.transform_of is not None:
            image = self.transform_of(index, epoch)(image)
        elif self.transform is not None:
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
