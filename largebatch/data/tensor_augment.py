"""ImageNet augmentation as tensor ops on any device, one generator per sample.

The recipe of :mod:`largebatch.data.folder` (torchvision's ``RandomResizedCrop`` sampling
rule, horizontal flip, ``Resize`` + ``CenterCrop`` for evaluation, ImageNet mean/std), applied
to decoded uint8 ``(3, H, W)`` images of different sizes where they lie (a GPU after nvJPEG).
Crop and flip parameters are drawn on the host from :func:`sample_rng` ``(seed, epoch,
index)``, so a batch does not depend on how many workers made it or on where a run was
stopped; the pixels are then cut and resized on the images' device.
"""

from __future__ import annotations

import functools
import math
import random
from typing import Sequence

import torch
import torch.nn.functional as F

from largebatch.data.samplers import sample_seed

__all__ = ["augment_batch", "centre_crop_box", "normalise", "random_resized_crop_box", "sample_rng"]


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


def augment_batch(
    images: Sequence[torch.Tensor],
    indices: Sequence[int],
    *,
    train: bool,
    size: int,
    epoch: int = 0,
    seed: int = 0,
    crop_scale: Sequence[float] = (0.08, 1.0),
    crop_ratio: Sequence[float] = (3 / 4, 4 / 3),
    hflip: float = 0.5,
    val_crop_ratio: float = 0.875,
) -> torch.Tensor:
    """Crop and resize each image to ``size`` x ``size``: float32 ``(N, 3, size, size)``, 0..255.

    ``train``: random-resized crop (area ``crop_scale``, aspect ``crop_ratio``) and a flip
    with probability ``hflip``, drawn from ``sample_rng(seed, epoch, indices[i])``. Else the
    evaluation crop: shorter side to ``size / val_crop_ratio``, centre ``size`` x ``size``.
    """
    out = []
    for index, image in zip(indices, images):
        h, w = image.shape[-2:]
        if train:
            rng = sample_rng(seed, epoch, index)
            top, left, ch, cw = random_resized_crop_box(h, w, crop_scale, crop_ratio, rng)
            crop = _resize(image[:, top : top + ch, left : left + cw], (size, size))
            if rng.random() < hflip:
                crop = crop.flip(-1)
        else:
            resized, top, left = centre_crop_box(h, w, size, val_crop_ratio)
            crop = _resize(image, resized)[..., top : top + size, left : left + size]
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
