"""Training crops and flips drawn for a whole batch at once, images of one size or of many.

torchvision's ``RandomResizedCrop.get_params`` draws one sample's crop in a Python loop of up to
10 tries; a batch of 256 costs a few milliseconds of host time that way, and the batch depends on
one generator per sample. Here every sample's 10 tries are drawn as tensors and the first that
fits is picked by ``argmax``, for a batch whose images share one size (the decoded store's, see
:mod:`largebatch.data.batched_crop`) or each have their own (nvJPEG's decoded JPEGs, see
:func:`largebatch.data.augment.crop_table`): the same distribution as ``get_params``, not the
same stream of numbers (tests/test_batched_crop.py holds the two equal by two-sample KS tests).
Every call consumes the same amount of the generator whatever is accepted, so a batch is a
function of the generator's state, which a resumable loader keys by ``(seed, epoch, batch)``.
"""

from __future__ import annotations

from typing import Sequence

import torch

from largebatch.defaults import TRAIN_CROP_RATIO, TRAIN_CROP_SCALE, TRAIN_FLIP

__all__ = ["TRIES", "draw_flips", "fallback_boxes", "random_resized_crop_boxes"]

TRIES = 10  # RandomResizedCrop.get_params's tries before its centre-crop fallback
Side = int | torch.Tensor


def fallback_boxes(height: torch.Tensor, width: torch.Tensor, ratio: Sequence[float]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(h, w)`` (float64) of get_params's fallback per sample: the whole image cut to the nearest
    allowed aspect ratio (``int(round(width / min(ratio)))`` etc., in Python's float64 arithmetic)."""
    low, high = min(ratio), max(ratio)
    in_ratio = width / height
    narrow, wide = in_ratio < low, in_ratio > high
    h = torch.where(narrow, torch.round(width / low), height)
    w = torch.where(wide, torch.round(height * high), width)
    return h, w


def _sides(count: int, side: Side, name: str) -> torch.Tensor:
    """``side`` as a float64 ``(count,)`` tensor on the host, checked >= 1."""
    sides = torch.as_tensor(side, dtype=torch.float64).expand(count) if count else torch.zeros(0, dtype=torch.float64)
    if (sides < 1).any():
        raise ValueError(f"need non-empty images, got a {name} below 1: {side}")
    return sides


def random_resized_crop_boxes(
    count: int,
    height: Side,
    width: Side,
    *,
    generator: torch.Generator,
    scale: Sequence[float] = TRAIN_CROP_SCALE,
    ratio: Sequence[float] = TRAIN_CROP_RATIO,
) -> torch.Tensor:
    """``(count, 4)`` int64 ``(top, left, h, w)`` crops of images of ``height x width`` (ints, one
    size for all, or ``(count,)`` tensors, one per sample), drawn by
    ``RandomResizedCrop.get_params``'s rule for all ``count`` samples at once.

    Per sample and try: area ``height * width * U(scale)``, aspect ``exp(U(log ratio))``, ``w =
    round(sqrt(area * aspect))``, ``h = round(sqrt(area / aspect))``; the first try with ``0 < w
    <= width`` and ``0 < h <= height`` is kept, its top-left uniform over the positions that fit;
    a sample whose 10 tries all fail gets :func:`fallback_boxes`, centred. The draws are made in
    get_params's precision (float32 uniforms, float64 arithmetic); every call consumes the same
    amount of ``generator`` whatever is accepted. Host tensors in, a host tensor out.
    """
    if count < 0:
        raise ValueError(f"need count >= 0, got count={count}")
    if not 0 < scale[0] <= scale[1] or not 0 < ratio[0] <= ratio[1]:
        raise ValueError(f"scale and ratio must be increasing positive ranges, got scale={scale}, ratio={ratio}")
    heights, widths = _sides(count, height, "height"), _sides(count, width, "width")
    area = (heights * widths)[:, None]
    log_ratio = torch.log(torch.tensor([float(ratio[0]), float(ratio[1])]))  # float32, as get_params
    fraction = torch.empty(count, TRIES).uniform_(float(scale[0]), float(scale[1]), generator=generator)
    log_aspect = torch.empty(count, TRIES).uniform_(float(log_ratio[0]), float(log_ratio[1]), generator=generator)
    target = area * fraction.double()
    aspect = torch.exp(log_aspect).double()
    w = torch.round(torch.sqrt(target * aspect))  # round half to even, as Python's round
    h = torch.round(torch.sqrt(target / aspect))
    fits = (w > 0) & (w <= widths[:, None]) & (h > 0) & (h <= heights[:, None])
    first = fits.to(torch.uint8).argmax(dim=1, keepdim=True)  # the first try that fits (0 if none)
    accepted = fits.any(dim=1)
    fallback_h, fallback_w = fallback_boxes(heights, widths, ratio)
    h = torch.where(accepted, h.gather(1, first).squeeze(1), fallback_h)
    w = torch.where(accepted, w.gather(1, first).squeeze(1), fallback_w)
    # top-left: uniform over the integers 0..room (torch.randint(0, room + 1)); centred in the fallback
    room = torch.stack([heights - h, widths - w], dim=1)
    offset = torch.floor(torch.rand(count, 2, dtype=torch.float64, generator=generator) * (room + 1))
    offset = torch.where(accepted[:, None], torch.minimum(offset, room), torch.div(room, 2, rounding_mode="floor"))
    return torch.stack([offset[:, 0], offset[:, 1], h, w], dim=1).to(torch.int64)


def draw_flips(count: int, *, generator: torch.Generator, probability: float = TRAIN_FLIP) -> torch.Tensor:
    """``(count,)`` bool: which samples are flipped (each with ``probability``, one uniform each)."""
    return torch.rand(count, generator=generator) < probability
