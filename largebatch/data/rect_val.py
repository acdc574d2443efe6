"""Rectangular validation: the validation images in batches of like aspect ratio, each batch
centre-cropped to one rectangle instead of a square, so the model sees (nearly) the whole image.

fast.ai's DAWNBench 2018 ImageNet run evaluated its last phase this way (``rect_val``). Our own
code after the one in diux-dev/imagenet18 (cybertronai/imagenet18_old) at commit 5534ba1,
``training/dataloader.py`` (``sort_ar``, ``map_idx2ar``, ``CropArTfm``, ``DistValSampler``):

* each image's width / height is read once from its header (PIL opens a file without decoding
  it) and kept in memory per split folder (:func:`aspect_ratios`; ~30-70 us a file from the page
  cache, so 1.5-3.5 s for ImageNet's 50,000 on each rank, once per process);
* the images are ordered by that ratio, ties by index (the same order on every rank and run),
  and cut into batches of ``batch_size`` consecutive images (:func:`plan_rect_batches`);
* each batch gets one ``(height, width)`` (:func:`rect_shape`): the short side the evaluation
  side, the long side the side times the batch's mean ratio (below 1: its inverse), rounded
  down to a multiple of 8 as the source does, and never below the side;
* every rank reads whole batches of that order
  (:class:`~largebatch.data.samplers.ExactShardSampler` with ``order`` and ``whole_batches``):
  every image once over all ranks, so top-1/top-5 stay exact; a rank may get fewer batches or
  none (the source gives every rank the same count, padding with empty batches).

fast.ai turned it on for the last phase only; with ``data.resolution.rect_val_from_epoch`` (and
an evaluation side that follows the training side's phase) the crops change with the epoch:
:class:`EvalCrops` gives each epoch's plan and transforms.

Each image is resized as for square evaluation (the shorter side to ``side / val_crop_ratio``),
then centre-cropped to its batch's shape; where that leaves an image of another ratio than its
batch's mean smaller than the shape, it is scaled up to cover it (the source pads it with black).
"""

from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import dataclass
from typing import Callable, Sequence

from PIL import Image

from largebatch.data.augment import build_val_transform
from largebatch.defaults import VAL_CROP_RATIO

__all__ = ["EvalCrops", "RectPlan", "RectTransforms", "aspect_ratios", "plan_rect_batches", "read_aspect_ratio", "rect_shape"]

logger = logging.getLogger(__name__)

SHAPE_MULTIPLE = 8  # the long side is rounded down to a multiple of this (the source's //8*8)

# split folder -> (its files, their ratios): read once per process
_RATIOS: dict[str, tuple[tuple[str, ...], tuple[float, ...]]] = {}


def read_aspect_ratio(path: str | os.PathLike) -> float:
    """Width / height from the file's header; 1.0 for a file PIL cannot open (the data set skips
    it when it reads it, and counts it)."""
    try:
        with Image.open(path) as image:
            width, height = image.size
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError):
        return 1.0
    return width / height if width > 0 and height > 0 else 1.0


def aspect_ratios(folder: str | os.PathLike, paths: Sequence[str]) -> tuple[float, ...]:
    """The width / height of each of ``paths`` (the files of split ``folder``), read from the
    headers on the first call for that folder and list, from memory after."""
    key, files = os.path.realpath(folder), tuple(paths)
    cached = _RATIOS.get(key)
    if cached is not None and cached[0] == files:
        return cached[1]
    start = time.perf_counter()
    ratios = tuple(read_aspect_ratio(p) for p in files)
    logger.debug("rect_val: read the sizes of %d images in %s in %.2f s", len(files), folder,
                 time.perf_counter() - start)
    _RATIOS[key] = (files, ratios)
    return ratios


def rect_shape(ratio: float, side: int, multiple: int = SHAPE_MULTIPLE) -> tuple[int, int]:
    """``(height, width)`` of a batch of mean width / height ``ratio``: short side ``side``, long
    side ``side x ratio`` (below 1: ``side / ratio``) rounded down to ``multiple``, at least ``side``."""
    long_side = side * ratio if ratio >= 1 else side / ratio
    long_side = max(side, int(long_side) // multiple * multiple)
    return (side, long_side) if ratio >= 1 else (long_side, side)


@dataclass(frozen=True)
class RectPlan:
    """The validation set in aspect-ratio order and each batch's shape.

    ``order``: the indices, sorted by ratio; batch ``b`` is ``order[b * batch_size:(b + 1) *
    batch_size]`` and is cropped to ``shapes[b]`` ``(height, width)``.
    """

    order: tuple[int, ...]
    shapes: tuple[tuple[int, int], ...]
    batch_size: int

    def batches(self) -> list[tuple[tuple[int, ...], tuple[int, int]]]:
        """``(indices, shape)`` of every batch, in order."""
        b = self.batch_size
        return [(self.order[i * b:(i + 1) * b], shape) for i, shape in enumerate(self.shapes)]

    def shape_by_index(self) -> list[tuple[int, int]]:
        """The shape of each sample's batch, by sample index."""
        out: list[tuple[int, int]] = [(0, 0)] * len(self.order)
        for position, index in enumerate(self.order):
            out[index] = self.shapes[position // self.batch_size]
        return out


def plan_rect_batches(ratios: Sequence[float], *, batch_size: int, side: int,
                      multiple: int = SHAPE_MULTIPLE) -> RectPlan:
    """Sort ``ratios`` (width / height per sample), cut into batches of ``batch_size``, one
    :func:`rect_shape` per batch from its mean ratio."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    order = tuple(sorted(range(len(ratios)), key=lambda i: (ratios[i], i)))
    shapes = tuple(
        rect_shape(math.fsum(ratios[i] for i in chunk) / len(chunk), side, multiple)
        for chunk in (order[b:b + batch_size] for b in range(0, len(order), batch_size))
    )
    return RectPlan(order, shapes, batch_size)


class RectTransforms:
    """The evaluation transform of each sample: :func:`build_val_transform` cropping to its
    batch's shape, built once per shape in each process that uses it."""

    def __init__(self, plan: RectPlan, *, side: int, crop_ratio: float = VAL_CROP_RATIO) -> None:
        self.side, self.crop_ratio = side, crop_ratio
        self.shape_of = plan.shape_by_index()
        self._by_shape: dict[tuple[int, int], Callable] = {}

    def __call__(self, index: int, epoch: int | None = None) -> Callable:
        """The transform of sample ``index`` (``epoch``: unused, the data set's key)."""
        shape = self.shape_of[index]
        if shape not in self._by_shape:
            self._by_shape[shape] = build_val_transform(self.side, crop_ratio=self.crop_ratio, shape=shape)
        return self._by_shape[shape]


class EvalCrops:
    """The evaluation crops of each epoch, where they change with it: after epoch ``e`` the side
    ``side_at(e)`` and rectangles when ``rect_at(e)`` (``LoaderSpec.val_size_at``,
    ``LoaderSpec.rect_val_at``), else the centre square. ``ratios`` (each sample's width /
    height) are needed only for rectangles. Plans and transforms are built once per (side,
    rectangles) in each process that uses them: the loader's for the order, each worker's for
    the pixels (the data set's ``transform_of``: ``crops(index, epoch)``)."""

    def __init__(self, *, side_at: Callable[[int], int], rect_at: Callable[[int], bool], batch_size: int,
                 crop_ratio: float = VAL_CROP_RATIO, ratios: Sequence[float] | None = None) -> None:
        self.side_at, self.rect_at, self.batch_size = side_at, rect_at, batch_size
        self.crop_ratio, self.ratios = crop_ratio, ratios
        self._plans: dict[int, RectPlan] = {}
        self._squares: dict[int, Callable] = {}
        self._rects: dict[int, RectTransforms] = {}

    def phase(self, epoch: int) -> tuple[int, bool]:
        """``(side, rectangles)`` of the evaluation after epoch ``epoch``."""
        return self.side_at(epoch), self.rect_at(epoch)

    def plan(self, epoch: int) -> RectPlan | None:
        """The rectangular plan of epoch ``epoch``'s evaluation; None for centre squares."""
        side, rect = self.phase(epoch)
        if not rect:
            return None
        if self.ratios is None:
            raise ValueError("rectangular validation needs the samples' aspect ratios")
        if side not in self._plans:
            self._plans[side] = plan_rect_batches(self.ratios, batch_size=self.batch_size, side=side)
        return self._plans[side]

    def __call__(self, index: int, epoch: int | None) -> Callable:
        side, rect = self.phase(0 if epoch is None else epoch)
        if not rect:
            if side not in self._squares:
                self._squares[side] = build_val_transform(side, crop_ratio=self.crop_ratio)
            return self._squares[side]
        if side not in self._rects:
            plan = self.plan(0 if epoch is None else epoch)
            assert plan is not None  # rect: a plan
            self._rects[side] = RectTransforms(plan, side=side, crop_ratio=self.crop_ratio)
        return self._rects[side](index)
