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
geometry of a :class:`CropRecipe`. There the crops and flips of a whole batch are drawn on the
host at once (:func:`crop_table`) from a generator the loader keys by ``(seed, epoch, batch)``,
so a batch does not depend on how many workers made it or where a run was stopped; the pixels
are cut and resized on the images' device. DALI builds the same recipe as a graph of its own
operators (``largebatch.data.pipelines.dali_graph``) from these constants.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import torch
import torch.nn.functional as F
from torchvision.transforms import v2

from largebatch.data.batched_resize import AxisPlan, group_by_area, resize_group, resize_weights, to_device
from largebatch.data.crop_boxes import draw_flips, random_resized_crop_boxes
from largebatch.defaults import TRAIN_CROP_RATIO, TRAIN_CROP_SCALE, TRAIN_FLIP, VAL_CROP_RATIO, check_val_crop_ratio

__all__ = [
    "IMAGENET_DEFAULT_MEAN",
    "IMAGENET_DEFAULT_STD",
    "TRAIN_CROP_RATIO",
    "TRAIN_CROP_SCALE",
    "TRAIN_FLIP",
    "VAL_CROP_RATIO",
    "CropRecipe",
    "ResizeCovering",
    "PLAN_COLUMNS",
    "AxisPlan",
    "augment_batch",
    "augment_each",
    "build_train_transform",
    "build_val_transform",
    "centre_crop_box",
    "centre_crop_boxes",
    "check_val_crop_ratio",
    "crop_table",
    "image_sizes",
    "normalise",
    "normalise_cast",
]

# The same values as timm.data.IMAGENET_DEFAULT_MEAN/STD (not imported: timm is heavy).
IMAGENET_DEFAULT_MEAN = (0.485, 0.456, 0.406)
IMAGENET_DEFAULT_STD = (0.229, 0.224, 0.225)
# padded pixels per batched resize group (x 3 channels x 4 bytes: 192 MiB of float32)
GROUP_PIXELS = 2**24
# resize-weight elements (images x side x (height + width)) built for a whole batch at once (256 MiB
# of float32, a few times that while they are built); past it, each group's at its own sides
WEIGHT_ELEMENTS = 2**26


@dataclass(frozen=True)
class CropRecipe:
    """The crop geometry at one image size, for the tensor path (:func:`crop_table`):
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



# the columns of a crop table (crop_table): per axis, the AxisPlan fields; rows, then columns
PLAN_COLUMNS = ("row_start", "row_length", "row_virtual", "row_offset", "row_flip",
                "col_start", "col_length", "col_virtual", "col_offset", "col_flip")


def centre_crop_box(height: int, width: int, size: int, crop_ratio: float) -> tuple[tuple[int, int], int, int]:
    """Evaluation geometry, as torchvision's ``Resize(round(size / crop_ratio))`` + ``CenterCrop(size)``:
    ``((resized_h, resized_w), top, left)``."""
    short = round(size / crop_ratio)
    if height <= width:
        resized = (short, int(short * width / height))
    else:
        resized = (int(short * height / width), short)
    return resized, int(round((resized[0] - size) / 2.0)), int(round((resized[1] - size) / 2.0))


def centre_crop_boxes(sizes: torch.Tensor, size: int, crop_ratio: float) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`centre_crop_box` for every ``(h, w)`` row of ``sizes`` (int64 ``(N, 2)``) at once, in
    the same float64 arithmetic: ``(resized, offsets)``, two int64 ``(N, 2)`` tensors."""
    short = round(size / crop_ratio)
    h, w = sizes.to(torch.float64).unbind(1)
    # int(short * w / h): the exact product, one correctly rounded division, truncated (as Python)
    long_side = torch.where(h <= w, short * w / h, short * h / w).trunc()
    resized = torch.stack([torch.where(h <= w, float(short), long_side),
                           torch.where(h <= w, long_side, float(short))], dim=1)
    return resized.to(torch.int64), torch.round((resized - size) / 2.0).to(torch.int64)


def _resize(image: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """uint8/float ``(3, h, w)`` -> float32 ``(1, 3, *size)``, bilinear with antialiasing (as PIL)."""
    return F.interpolate(image.unsqueeze(0).float(), size=size, mode="bilinear", antialias=True, align_corners=False)


def image_sizes(images: Sequence[torch.Tensor]) -> torch.Tensor:
    """int64 ``(N, 2)`` ``(h, w)`` of ``(3, h, w)`` images (read from their shapes: no device access)."""
    return torch.tensor([image.shape[-2:] for image in images], dtype=torch.int64).view(-1, 2)


def crop_table(
    sizes: torch.Tensor,
    recipe: CropRecipe,
    *,
    train: bool,
    generator: Optional[torch.Generator] = None,
) -> torch.Tensor:
    """Every sample's crop, drawn on the host for the whole batch: int64 ``(N, 10)``, one row per
    image of ``sizes`` ``(h, w)``, the :data:`PLAN_COLUMNS` (an :class:`AxisPlan` for the rows,
    then one for the columns).

    ``train``: the recipe's random-resized crop (:func:`largebatch.data.crop_boxes.random_resized_crop_boxes`,
    torchvision's rule, all samples' tries at once), then its flip (:func:`~largebatch.data.crop_boxes.draw_flips`),
    both from ``generator`` in that order: a batch's crops are a function of the generator's seed,
    which the loader keys by ``(seed, epoch, batch)``. Else the evaluation crop (no draw): shorter
    side to ``size / val_crop_ratio``, centre ``size``.
    """
    r, size, n = recipe, recipe.size, len(sizes)
    zeros, sides = torch.zeros(n, dtype=torch.int64), torch.full((n,), size, dtype=torch.int64)
    if train:
        if generator is None:
            raise ValueError("a training crop table needs the generator its crops are drawn from")
        top, left, ch, cw = random_resized_crop_boxes(n, sizes[:, 0], sizes[:, 1], generator=generator,
                                                      scale=r.crop_scale, ratio=r.crop_ratio).unbind(1)
        flips = draw_flips(n, generator=generator, probability=r.hflip).to(torch.int64)
        columns = (top, ch, sides, zeros, zeros, left, cw, sides, zeros, flips)
    else:
        resized, offsets = centre_crop_boxes(sizes, size, r.val_crop_ratio)
        columns = (zeros, sizes[:, 0], resized[:, 0], offsets[:, 0], zeros,
                   zeros, sizes[:, 1], resized[:, 1], offsets[:, 1], zeros)
    return torch.stack(columns, dim=1)


def augment_batch(
    images: Sequence[torch.Tensor],
    recipe: CropRecipe,
    *,
    train: bool,
    generator: Optional[torch.Generator] = None,
    max_pixels: int = GROUP_PIXELS,
) -> torch.Tensor:
    """Crop and resize each image to the recipe's ``size``: float32 ``(N, 3, size, size)``, 0..255.

    The geometry of :func:`crop_table` (``generator``: the training crops' draws); the pixels are
    cut, resized (antialiased bilinear, as PIL) and flipped for a whole group of images at once
    (:mod:`largebatch.data.batched_resize`: two batched matrix multiplies per group of at most
    ``max_pixels`` padded pixels). Equal to :func:`augment_each` up to float rounding.

    No Python-level work per image but a view for the copy: the weights of the whole batch are
    built once (one copy of its crop table to the device), each group's images are copied into
    its padded tensor by one ``torch._foreach_copy_``, and the groups are put back in batch order
    by one ``index_select``; so the host time per batch stays a few milliseconds at 256 images.
    """
    sizes = image_sizes(images)
    groups = group_by_area(sizes.tolist(), max_pixels)
    if len(groups) == 1:  # the whole batch in one group: in batch order, nothing to put back
        groups = [list(range(len(images)))]
    order = [k for group in groups for k in group]
    table = crop_table(sizes, recipe, train=train, generator=generator)
    inverse = torch.empty(len(order), dtype=torch.int64)
    inverse[torch.tensor(order, dtype=torch.int64)] = torch.arange(len(order))
    # the plans in group order and the way back, in one small host-to-device copy (no host read back)
    plans = to_device(torch.cat([table[order], inverse[:, None]], dim=1), images[0].device)
    size, (height, width) = recipe.size, sizes.max(dim=0).values.tolist()
    whole = len(order) * size * (height + width) <= WEIGHT_ELEMENTS
    if whole:  # the weights of every image at once, at the batch's largest sides (group order)
        wy_all, wx_all = resize_weights(plans[:, 0:5], size, height), resize_weights(plans[:, 5:10], size, width)
    resized, first = [], 0
    for group in groups:
        last = first + len(group)
        if whole:
            wy, wx = wy_all[first:last], wx_all[first:last]
        else:  # an outsized image: each group's weights at its own sides
            gh, gw = (max(sizes[k, axis] for k in group).item() for axis in (0, 1))
            wy, wx = resize_weights(plans[first:last, 0:5], size, gh), resize_weights(plans[first:last, 5:10], size, gw)
        resized.append(resize_group([images[k] for k in group], wy, wx))
        first = last
    if len(groups) == 1:
        return resized[0]
    return torch.cat(resized).index_select(0, plans[:, 10])


def augment_each(
    images: Sequence[torch.Tensor],
    recipe: CropRecipe,
    *,
    train: bool,
    generator: Optional[torch.Generator] = None,
) -> torch.Tensor:
    """:func:`augment_batch` image by image with ``F.interpolate`` (the reference it is tested
    against, the CPU device's path, and the "before" of benchmarks/augment.py): a few kernels
    and some Python per image."""
    plans = crop_table(image_sizes(images), recipe, train=train, generator=generator).tolist()
    size = recipe.size
    out = []
    for image, (top, height, virtual_h, offset_h, _, left, width, virtual_w, offset_w, flip) in zip(images, plans):
        if train:
            crop = _resize(image[:, top : top + height, left : left + width], (size, size))
            if flip:
                crop = crop.flip(-1)
        else:
            crop = _resize(image, (virtual_h, virtual_w))[..., offset_h : offset_h + size, offset_w : offset_w + size]
        out.append(crop)
    return torch.cat(out)


@functools.lru_cache(maxsize=16)
def _normalise_constants(device: torch.device, mean: tuple[float, ...],
                         std: tuple[float, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """The per-channel scale and shift on ``device``, built once per device and statistics.

    Made on the device by one fill per channel (a kernel with the value as its argument), not
    copied from the host: ``torch.tensor(values).to(cuda)`` is a copy from pageable host memory,
    which waits for the device, in whichever thread builds them first (the decode thread). The
    cached tensors are only ever read, so any stream may use them.
    """
    scale = torch.empty(1, len(std), 1, 1, device=device)
    shift = torch.empty(1, len(std), 1, 1, device=device)
    for channel, (m, s) in enumerate(zip(mean, std)):
        scale[:, channel].fill_(1 / (255 * s))
        shift[:, channel].fill_(-m / s)
    return scale, shift


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
