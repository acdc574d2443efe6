"""The training augmentation of a batch of same-size images, per batch instead of per sample.

torchvision's transforms, v1 and v2 alike, crop, resize, flip and normalise one sample per
call: in a DataLoader worker that is a few kernels and some Python for every image, which on a
host with few cores per accelerator is where an epoch goes. Images that all have one size (a
decoded store holds every image at one stored side, :mod:`largebatch.data.decoded_store`) can
be augmented a batch at a time instead:

* **boxes**: :func:`random_resized_crop_boxes` (:mod:`largebatch.data.crop_boxes`, re-exported
  here) draws every sample's crop with the rule of torchvision's ``RandomResizedCrop.get_params``
  (area fraction uniform in ``scale``, log aspect ratio uniform in ``log(ratio)``, the first of 10
  tries that fits, else the centre crop of the nearest allowed aspect ratio), vectorised over the
  batch: the same distribution, not the same stream of numbers (tests/test_batched_crop.py holds
  the two equal by two-sample KS tests). It draws from a ``torch.Generator`` the caller passes,
  always the same amount per batch, so a batch is a function of the generator's state (what a
  resumable sampler needs);
* **pixels**: :func:`resized_crops`, one ``torchvision.ops.roi_align`` call for the whole batch
  (``aligned=True``: pixel ``k`` covers ``[k, k + 1)``, so a box is the crop's own edges);
* **flip**: the drawn half of the batch reversed along the width, by index;
* **normalise**: ``(x / 255 - mean) / std`` written straight into the model's dtype and layout
  (:func:`largebatch.data.augment.normalise_cast`).

``sampling_ratio=1`` (:data:`SAMPLING_RATIO`): one bilinear sample at the centre of each output
pixel's bin, which is exactly a bilinear resize without antialiasing (``F.interpolate(...,
align_corners=False)``, ``resized_crop(antialias=False)``). More samples per bin would average
(antialias) a crop larger than the output, at ``sampling_ratio**2`` times the cost (measured
~3x for 2 on these CPUs); a store's side is picked just above the training side (48 -> 32, 160
-> 128), so a crop shrinks by at most the ratio of the two (1.5x, 1.25x) and is enlarged for
most draws (the mean crop side is ~0.7 of the image's), where one sample per pixel loses
nothing. Two differences from the per-sample torchvision path remain, both in the pixels, not
the geometry: no antialiasing where a crop is shrunk (torchvision's PIL resize averages), and
at a crop's edge an enlarged crop's outermost output pixels blend in up to half a pixel of the
image just outside the box (``roi_align`` samples the image; ``resized_crop`` repeats the crop's
edge pixel); elsewhere the two agree to float rounding (tests/test_batched_crop.py).

The training path (:func:`augment_same_size`) resizes uint8 images with
:func:`resized_crops_each` instead: a per-image ``F.interpolate`` of the uint8 crop (torch's
vectorised antialiased kernel), torchvision's tensor ``resized_crop`` bit for bit, no edge blend.
On one core (benchmarks/cpu_input.py) it does 2.0-2.4x ``roi_align``'s work per CPU second at
128-224 px, whose CPU kernel is scalar; at the default run's 48 -> 32 px it is 0.8x, ~1% of a
step either way. There the roi_align pixels cost accuracy: the default run over 5 seeds ended
0.64 points below the torchvision loader (steps to 90%: 486 against 454), the antialiased
ones 0.12 below (454 steps). ``roi_align`` stays for float images and the evaluation boxes.

Why not the batched matrix resize of :mod:`largebatch.data.batched_resize` (antialiased, equal
to PIL): it reads every input pixel of the span for every output pixel row and column, a cost
that grows with the stored side; ``roi_align`` reads 4 input pixels per output pixel.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from torchvision.ops import roi_align

from largebatch.data.augment import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD, CropRecipe, normalise_cast
from largebatch.data.crop_boxes import TRIES, draw_flips, random_resized_crop_boxes

__all__ = ["SAMPLING_RATIO", "TRIES", "augment_same_size", "draw_flips", "flip_rows",
           "random_resized_crop_boxes", "resized_crops", "resized_crops_each"]

SAMPLING_RATIO = 1  # roi_align samples per output pixel and axis: bilinear, no antialiasing (see above)


def resized_crops(images: torch.Tensor, boxes: torch.Tensor, side: int,
                  *, sampling_ratio: int = SAMPLING_RATIO) -> torch.Tensor:
    """Crop ``boxes`` (``(N, 4)`` ``(top, left, h, w)``, one per image) out of ``images`` (``(N, C,
    H, W)``, uint8 or float) and resize each to ``side x side``: float32 ``(N, C, side, side)`` on
    the 0..255 scale, by one ``roi_align`` call (bilinear, see the module docstring)."""
    if images.dim() != 4 or boxes.shape != (images.shape[0], 4):
        raise ValueError(f"need (N, C, H, W) images and (N, 4) boxes, got {tuple(images.shape)} and "
                         f"{tuple(boxes.shape)}")
    pixels = images if images.dtype == torch.float32 else images.to(torch.float32)
    top, left, h, w = boxes.to(torch.float32).unbind(1)
    index = torch.arange(images.shape[0], dtype=torch.float32, device=images.device)
    rois = torch.stack([index, left, top, left + w, top + h], dim=1).to(images.device)  # (k, x1, y1, x2, y2)
    return roi_align(pixels, rois, (side, side), spatial_scale=1.0, sampling_ratio=sampling_ratio, aligned=True)


def resized_crops_each(images: torch.Tensor, boxes: torch.Tensor, side: int) -> torch.Tensor:
    """:func:`resized_crops` image by image: each uint8 crop resized by its own ``F.interpolate``
    call (bilinear, antialiased: torch's vectorised uint8 kernel, the one torchvision's tensor
    ``resized_crop`` runs, equal to it bit for bit), uint8 ``(N, C, side, side)`` out. Python per
    image, but above small sides the kernel outruns ``roi_align``'s scalar one by more than that
    costs, and it averages a shrunk crop as PIL and torchvision do."""
    if images.dim() != 4 or boxes.shape != (images.shape[0], 4):
        raise ValueError(f"need (N, C, H, W) images and (N, 4) boxes, got {tuple(images.shape)} and "
                         f"{tuple(boxes.shape)}")
    if images.dtype != torch.uint8:
        raise ValueError(f"need uint8 images, got {images.dtype}")
    out = torch.empty((images.shape[0], images.shape[1], side, side), dtype=torch.uint8, device=images.device)
    for k, (top, left, h, w) in enumerate(boxes.tolist()):
        out[k : k + 1] = F.interpolate(images[k : k + 1, :, top : top + h, left : left + w], size=(side, side),
                                       mode="bilinear", antialias=True)
    return out


def flip_rows(images: torch.Tensor, flips: torch.Tensor) -> torch.Tensor:
    """Reverse the width of the images ``flips`` marks, in place; returns ``images``."""
    rows = flips.nonzero().squeeze(1).to(images.device)
    # index_select + index_copy_: ~3x faster on the CPU than images[rows] = images[rows].flip(-1)
    # (indexed assignment, ~33 ms against ~10 for 64 of 128 crops of 128 px)
    return images.index_copy_(0, rows, images.index_select(0, rows).flip(-1))


def augment_same_size(
    images: torch.Tensor,
    recipe: CropRecipe,
    *,
    generator: torch.Generator,
    mean: Sequence[float] = IMAGENET_DEFAULT_MEAN,
    std: Sequence[float] = IMAGENET_DEFAULT_STD,
    dtype: torch.dtype = torch.float32,
    channels_last: bool = False,
) -> torch.Tensor:
    """The training augmentation of a batch of uint8 ``(N, 3, H, W)`` images: random-resized crop
    to ``recipe.size`` (torchvision's rule with ``recipe.crop_scale`` and ``recipe.crop_ratio``,
    drawn from ``generator``), horizontal flip with probability ``recipe.hflip``, normalised into
    ``dtype`` (NHWC-strided if ``channels_last``). ``recipe`` is the tensor path's
    :class:`~largebatch.data.augment.CropRecipe`, so the nvjpeg loader's settings serve here too.
    uint8 images are resized by :func:`resized_crops_each` (torchvision's pixels), float ones by
    one :func:`resized_crops` call; the boxes and flips are the same.

    Draws, in this order: :func:`random_resized_crop_boxes`, then :func:`draw_flips`.
    """
    count, _, height, width = images.shape
    boxes = random_resized_crop_boxes(count, height, width, generator=generator, scale=recipe.crop_scale,
                                      ratio=recipe.crop_ratio)
    flips = draw_flips(count, generator=generator, probability=recipe.hflip)
    if images.dtype == torch.uint8:
        crops = resized_crops_each(images, boxes, recipe.size)  # uint8: normalise_cast reads it as is
    else:
        crops = resized_crops(images, boxes, recipe.size)
    return normalise_cast(flip_rows(crops, flips), mean, std, dtype, channels_last)
