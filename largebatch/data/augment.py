"""The ImageNet augmentation recipe, twice side by side: PIL transforms and tensor ops.

One recipe, its constants written once (timm's and torchvision's defaults): below, but for the
two crop defaults every ``LoaderSpec`` takes, ``TRAIN_CROP_SCALE`` and ``VAL_CROP_RATIO``, which
are in :mod:`largebatch.defaults` (re-exported here):

* training: a random-resized crop of area ``TRAIN_CROP_SCALE`` (``data.crop_scale``) and aspect
  ratio ``TRAIN_CROP_RATIO`` (torchvision's ``RandomResizedCrop`` sampling rule), a horizontal
  flip with probability ``TRAIN_FLIP`` (1/2), the ImageNet mean/std;
* evaluation: the shorter side resized to ``image_size / VAL_CROP_RATIO`` (0.875: 256 -> 224)
  and the centre ``image_size`` square.

:func:`build_train_transform` / :func:`build_val_transform` apply it to PIL images in loader
workers (``data.loader=torchvision``); :func:`augment_batch` and :func:`normalise` to decoded
uint8 ``(3, H, W)`` tensors of different sizes where they lie (a GPU after nvJPEG), with the
geometry of a :class:`CropRecipe`. There the
crop and flip are drawn on the host from :func:`sample_rng` ``(seed, epoch, index)``, so a
batch does not depend on how many workers made it or where a run was stopped; the pixels are
cut and resized on the images' device. DALI builds the same recipe as a graph of its own
operators (``largebatch.data.pipelines.dali_graph``) from these constants.
"""

from __future__ import annotations

import functools
import math
import random
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F
from torchvision.transforms import v2

from largebatch.data.batched_resize import AxisPlan, group_by_area, resize_group
from largebatch.data.samplers import sample_seed
from largebatch.defaults import TRAIN_CROP_SCALE, VAL_CROP_RATIO, check_val_crop_ratio

__all__ = [
    "IMAGENET_DEFAULT_MEAN",
    "IMAGENET_DEFAULT_STD",
    "TRAIN_CROP_RATIO",
    "TRAIN_CROP_SCALE",
    "TRAIN_FLIP",
    "VAL_CROP_RATIO",
    "CropRecipe",
    "ResizeCovering",
    "augment_batch",
    "augment_each",
    "build_train_transform",
    "build_val_transform",
    "centre_crop_box",
    "check_val_crop_ratio",
    "crop_plans",
    "normalise",
    "normalise_cast",
    "random_resized_crop_box",
    "sample_rng",
]

# The same values as timm.data.IMAGENET_DEFAULT_MEAN/STD (not imported: timm is heavy).
IMAGENET_DEFAULT_MEAN = (0.485, 0.456, 0.406)
IMAGENET_DEFAULT_STD = (0.229, 0.224, 0.225)
TRAIN_CROP_RATIO = (3 / 4, 4 / 3)  # aspect ratio of a training crop (RandomResizedCrop's default)
TRAIN_FLIP = 0.5  # probability of a training crop's horizontal flip (RandomHorizontalFlip's default)
# padded pixels per batched resize group (x 3 channels x 4 bytes: 192 MiB of float32)
GROUP_PIXELS = 2**24


@dataclass(frozen=True)
class CropRecipe:
    """The crop geometry at one image size, for the tensor path (:func:`crop_plans`):
    training's random-resized crop (area ``crop_scale``, aspect ``crop_ratio``) and flip (with
    probability ``hflip``), evaluation's centre ``size`` crop of the image resized to
    ``size / val_crop_ratio``. The defaults are the recipe's constants above."""

    size: int
    crop_scale: tuple[float, float] = TRAIN_CROP_SCALE
    crop_ratio: tuple[float, float] = TRAIN_CROP_RATIO
    hflip: float = TRAIN_FLIP
    val_crop_ratio: float = VAL_CROP_RATIO

    def __post_init__(self) -> None:
        object.__setattr__(self, "crop_scale", tuple(self.crop_scale))
        object.__setattr__(self, "crop_ratio", tuple(self.crop_ratio))
        check_val_crop_ratio(self.val_crop_ratio)


# ---------------------------------------------------------------------------------------
# PIL images, in loader workers (data.loader=torchvision)


def build_train_transform(
    image_size: int,
    *,
    scale: Sequence[float] = TRAIN_CROP_SCALE,
    ratio: Sequence[float] = TRAIN_CROP_RATIO,
    hflip: float = TRAIN_FLIP,
    mean: Sequence[float] = IMAGENET_DEFAULT_MEAN,
    std: Sequence[float] = IMAGENET_DEFAULT_STD,
) -> v2.Compose:
    """RandomResizedCrop to ``image_size`` + horizontal flip (probability ``hflip``) + normalise."""
    steps: list[Callable] = [
        v2.RandomResizedCrop(image_size, scale=tuple(scale), ratio=tuple(ratio), antialias=True)
    ]
    if hflip > 0:
        steps.append(v2.RandomHorizontalFlip(hflip))
    steps += [v2.PILToTensor(), v2.ToDtype(torch.float32, scale=True), v2.Normalize(mean, std)]
    return v2.Compose(steps)


def build_val_transform(
    image_size: int,
    *,
    crop_ratio: float = VAL_CROP_RATIO,
    mean: Sequence[float] = IMAGENET_DEFAULT_MEAN,
    std: Sequence[float] = IMAGENET_DEFAULT_STD,
    shape: tuple[int, int] | None = None,
) -> v2.Compose:
    """Resize the shorter side to ``image_size / crop_ratio``, centre-crop ``image_size``.

    ``shape`` (rectangular validation, :mod:`largebatch.data.rect_val`): centre-crop that
    ``(height, width)`` instead, of an image resized the same way but, where that leaves it
    smaller than ``shape``, just enough more to cover it (:class:`ResizeCovering`).
    """
    check_val_crop_ratio(crop_ratio)
    short = round(image_size / crop_ratio)
    resize: Callable = v2.Resize(short, antialias=True) if shape is None else ResizeCovering(short, shape)
    return v2.Compose([
        resize,
        v2.CenterCrop(image_size if shape is None else list(shape)),
        v2.PILToTensor(),
        v2.ToDtype(torch.float32, scale=True),
        v2.Normalize(mean, std),
    ])


class ResizeCovering:
    """Resize a PIL image, aspect kept, so its shorter side is ``short`` and it covers ``box``
    (``(height, width)``): the scale is the larger of the two. (fast.ai's rectangular validation
    centre-crops without the second condition and pads the image with black where it is smaller
    than the box; an image of another aspect ratio than its batch's mean is scaled up instead.)"""

    def __init__(self, short: int, box: tuple[int, int]) -> None:
        self.short, self.box = short, (int(box[0]), int(box[1]))

    def __call__(self, image: Any) -> Any:
        width, height = image.size
        scale = max(self.short / min(width, height), self.box[0] / height, self.box[1] / width)
        size = [max(self.box[0], round(height * scale)), max(self.box[1], round(width * scale))]
        return v2.functional.resize(image, size, antialias=True)


# ---------------------------------------------------------------------------------------
# tensors, where they lie (data.loader=nvjpeg)



def sample_rng(seed: int, epoch: int, index: int) -> random.Random:
    """The generator of one sample's augmentation in one epoch, seeded by the same per-sample
    hash as the torchvision path (:func:`largebatch.data.samplers.sample_seed`)."""
    return random.Random(sample_seed(seed, epoch, index))


def random_resized_crop_box(
    height: int, width: int, scale: Sequence[float], ratio: Sequence[float], rng: random.Random
) -> tuple[int, int, int, int]:
    """``(top, left, h, w)`` of a random crop: torchvision's ``RandomResizedCrop.get_params`` rule
    (10 tries of area in ``scale`` and log-uniform aspect ratio in ``ratio``, then a centre crop)."""
    area = height * width
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target_area = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(*log_ratio))
        w = int(round(math.sqrt(target_area * aspect)))
        h = int(round(math.sqrt(target_area / aspect)))
        if 0 < w <= width and 0 < h <= height:
            return rng.randint(0, height - h), rng.randint(0, width - w), h, w
    in_ratio = width / height
    if in_ratio < min(ratio):
        w, h = width, int(round(width / min(ratio)))
    elif in_ratio > max(ratio):
        h, w = height, int(round(height * max(ratio)))
    else:
        h, w = height, width
    return (height - h) // 2, (width - w) // 2, h, w


def centre_crop_box(height: int, width: int, size: int, crop_ratio: float) -> tuple[tuple[int, int], int, int]:
    """Evaluation geometry, as torchvision's ``Resize(round(size / crop_ratio))`` + ``CenterCrop(size)``:
    ``((resized_h, resized_w), top, left)``."""
    short = round(size / crop_ratio)
    if height <= width:
        resized = (short, int(short * width / height))
    else:
        resized = (int(short * height / width), short)
    return resized, int(round((resized[0] - size) / 2.0)), int(round((resized[1] - size) / 2.0))


def _resize(image: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """uint8/float ``(3, h, w)`` -> float32 ``(1, 3, *size)``, bilinear with antialiasing (as PIL)."""
    return F.interpolate(image.unsqueeze(0).float(), size=size, mode="bilinear", antialias=True, align_corners=False)


def crop_plans(
    sizes: Sequence[tuple[int, int]],
    indices: Sequence[int],
    recipe: CropRecipe,
    *,
    train: bool,
    epoch: int = 0,
    seed: int = 0,
) -> list[tuple[AxisPlan, AxisPlan]]:
    """Each sample's ``(rows, columns)`` plan for images of ``sizes`` ``(h, w)``, drawn on the host.

    ``train``: the recipe's random-resized crop, then its flip, both from
    ``sample_rng(seed, epoch, indices[i])`` in that order. Else the evaluation crop: shorter
    side to ``size / val_crop_ratio``, centre ``size``.
    """
    r, size = recipe, recipe.size
    plans = []
    for index, (h, w) in zip(indices, sizes):
        if train:
            rng = sample_rng(seed, epoch, index)
            top, left, ch, cw = random_resized_crop_box(h, w, r.crop_scale, r.crop_ratio, rng)
            flip = rng.random() < r.hflip
            plans.append((AxisPlan(top, ch, size), AxisPlan(left, cw, size, 0, flip)))
        else:
            (rh, rw), top, left = centre_crop_box(h, w, size, r.val_crop_ratio)
            plans.append((AxisPlan(0, h, rh, top), AxisPlan(0, w, rw, left)))
    return plans


def augment_batch(
    images: Sequence[torch.Tensor],
    indices: Sequence[int],
    recipe: CropRecipe,
    *,
    train: bool,
    epoch: int = 0,
    seed: int = 0,
    max_pixels: int = GROUP_PIXELS,
) -> torch.Tensor:
    """Crop and resize each image to the recipe's ``size``: float32 ``(N, 3, size, size)``, 0..255.

    The geometry of :func:`crop_plans`; the pixels are cut, resized (antialiased bilinear, as
    PIL) and flipped for a whole group of images at once (:mod:`largebatch.data.batched_resize`:
    two batched matrix multiplies per group of at most ``max_pixels`` padded pixels). Equal to
    :func:`augment_each` up to float rounding.
    """
    plans = crop_plans([tuple(image.shape[-2:]) for image in images], indices, recipe, train=train, epoch=epoch,
                       seed=seed)
    size = recipe.size
    spans = [image[:, r.start : r.start + r.length, c.start : c.start + c.length]
             for image, (r, c) in zip(images, plans)]
    groups = group_by_area([tuple(s.shape[-2:]) for s in spans], max_pixels)
    if len(groups) == 1:  # the whole batch in one group: already in batch order
        return resize_group(spans, [r for r, _ in plans], [c for _, c in plans], size)
    out = torch.empty(len(images), 3, size, size, dtype=torch.float32, device=images[0].device)
    for group in groups:
        resized = resize_group([spans[k] for k in group], [plans[k][0] for k in group],
                               [plans[k][1] for k in group], size)
        for row, k in enumerate(group):  # contiguous slices, not an index tensor: no host copy
            out[k] = resized[row]
    return out


def augment_each(
    images: Sequence[torch.Tensor],
    indices: Sequence[int],
    recipe: CropRecipe,
    *,
    train: bool,
    epoch: int = 0,
    seed: int = 0,
) -> torch.Tensor:
    """:func:`augment_batch` image by image with ``F.interpolate`` (the reference it is tested
    against, and the "before" of benchmarks/augment.py): a few kernels and some Python
    per image."""
    plans = crop_plans([tuple(image.shape[-2:]) for image in images], indices, recipe, train=train, epoch=epoch,
                       seed=seed)
    size = recipe.size
    out = []
    for image, (r, c) in zip(images, plans):
        if train:
            crop = _resize(image[:, r.start : r.start + r.length, c.start : c.start + c.length], (size, size))
            if c.flip:
                crop = crop.flip(-1)
        else:
            crop = _resize(image, (r.virtual, c.virtual))[..., r.offset : r.offset + size, c.offset : c.offset + size]
        out.append(crop)
    return torch.cat(out)


@functools.lru_cache(maxsize=16)
def _normalise_constants(device: torch.device, mean: tuple[float, ...],
                         std: tuple[float, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """The per-channel scale and shift on ``device``, built once per device and statistics.

    ``torch.tensor(values, device=cuda)`` is a copy from pageable host memory, which waits for
    the device: made every batch it would keep the decode thread from running ahead of the
    step. The cached tensors are only ever read, so any stream may use them.
    """
    scale = torch.tensor([1 / (255 * s) for s in std]).view(1, -1, 1, 1)
    shift = torch.tensor([-m / s for m, s in zip(mean, std)]).view(1, -1, 1, 1)
    return scale.to(device), shift.to(device)


def normalise(images: torch.Tensor, mean: Sequence[float], std: Sequence[float]) -> torch.Tensor:
    """``(images / 255 - mean) / std`` per channel, in place, as one multiply and one add."""
    scale, shift = _normalise_constants(images.device, tuple(map(float, mean)), tuple(map(float, std)))
    return images.mul_(scale).add_(shift)


def normalise_cast(images: torch.Tensor, mean: Sequence[float], std: Sequence[float], dtype: torch.dtype,
                   channels_last: bool = False) -> torch.Tensor:
    """:func:`normalise`, the cast to ``dtype`` and the layout in one kernel: ``images * scale +
    shift`` written straight into a ``dtype`` tensor (NHWC-strided if ``channels_last``)."""
    scale, shift = _normalise_constants(images.device, tuple(map(float, mean)), tuple(map(float, std)))
    layout = torch.channels_last if channels_last else torch.contiguous_format
    out = torch.empty(images.shape, dtype=dtype, device=images.device, memory_format=layout)
    return torch.addcmul(shift, images, scale, out=out)
