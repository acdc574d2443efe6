"""The per-batch augmentation of same-size images (largebatch.data.batched_crop, issue 72):
torchvision's crop distribution, a per-sample reference's pixels, exact flip and normalise.

The distribution tests are two-sample Kolmogorov-Smirnov tests (scipy) between our boxes and
``RandomResizedCrop.get_params``'s, on fixed seeds (deterministic: they cannot flake), each
beside a control that the same test, at the same sample size, rejects a slightly wrong rule.
"""

from __future__ import annotations

import functools
import math

import pytest
import torch
from scipy.stats import ks_2samp
from torchvision.transforms import InterpolationMode, RandomResizedCrop
from torchvision.transforms.v2 import functional as TF

from largebatch.data.augment import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD, CropRecipe, normalise_cast
from largebatch.data.batched_crop import (
    augment_same_size,
    draw_flips,
    flip_rows,
    random_resized_crop_boxes,
    resized_crops,
    resized_crops_each,
)

DRAWS = 20_000
SCALE, RATIO = (0.08, 1.0), (3 / 4, 4 / 3)
P_MIN = 1e-3  # a KS p-value below this fails (fixed seeds: the values are the same every run)
TOLERANCE = 0.001  # on the 0..255 scale: roi_align vs resized_crop where both sample inside the crop


@functools.lru_cache(maxsize=8)  # each shape's draws are shared by the tests below (a few seconds each)
def _torchvision_boxes(height: int, width: int, draws: int, seed: int, scale=SCALE, ratio=RATIO) -> torch.Tensor:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return torch.tensor([RandomResizedCrop.get_params(torch.empty(1, height, width), list(scale), list(ratio))
                             for _ in range(draws)], dtype=torch.int64)


def _ours(height: int, width: int, draws: int, seed: int, scale=SCALE, ratio=RATIO) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return random_resized_crop_boxes(draws, height, width, generator=g, scale=scale, ratio=ratio)


def _statistics(boxes: torch.Tensor, height: int, width: int) -> dict[str, torch.Tensor]:
    top, left, h, w = boxes.double().unbind(1)
    return {"scale": h * w / (height * width), "log_ratio": torch.log(w / h),
            "top": top / (height - h + 1), "left": left / (width - w + 1)}


@pytest.mark.parametrize("height,width", [(48, 48), (160, 160), (375, 500), (8, 64)])
def test_crop_distribution_is_torchvisions(height: int, width: int) -> None:
    """Area fraction, log aspect ratio and position: the same distributions (8x64 falls back to
    the centre crop in most draws, so the fallback's atom is in its distributions)."""
    ours = _statistics(_ours(height, width, DRAWS, seed=1), height, width)
    theirs = _statistics(_torchvision_boxes(height, width, DRAWS, seed=2), height, width)
    for name in ours:
        p = ks_2samp(ours[name].numpy(), theirs[name].numpy()).pvalue
        assert p > P_MIN, f"{name} of {height}x{width}: KS p = {p:.2e}"


def test_the_ks_test_rejects_a_slightly_wrong_rule() -> None:
    """Power at this sample size: the minimum area 0.12 instead of 0.08, and aspect ratios up
    to 1.45 instead of 4/3, are each rejected by the test above."""
    theirs = _statistics(_torchvision_boxes(160, 160, DRAWS, seed=2), 160, 160)
    wrong_scale = _statistics(_ours(160, 160, DRAWS, seed=1, scale=(0.12, 1.0)), 160, 160)
    wrong_ratio = _statistics(_ours(160, 160, DRAWS, seed=1, ratio=(1 / 1.45, 1.45)), 160, 160)
    assert ks_2samp(wrong_scale["scale"].numpy(), theirs["scale"].numpy()).pvalue < 1e-6
    assert ks_2samp(wrong_ratio["log_ratio"].numpy(), theirs["log_ratio"].numpy()).pvalue < 1e-6


def test_fallback_is_torchvisions_centre_crop() -> None:
    """Where no try fits, the box is get_params's fallback exactly: too wide (1x100), too tall
    (100x1); and on 8x64 the fallback is taken as often as get_params takes it."""
    for height, width in [(1, 100), (100, 1)]:
        expected = _torchvision_boxes(height, width, 1, seed=0)[0].tolist()
        assert (_ours(height, width, 50, seed=0) == torch.tensor(expected)).all(), (height, width, expected)
    ours, theirs = _ours(8, 64, DRAWS, seed=1), _torchvision_boxes(8, 64, DRAWS, seed=2)
    centre = torch.tensor([0, (64 - 11) // 2, 8, 11])  # h = 8, w = round(8 * 4/3)
    rate_ours = (ours == centre).all(1).double().mean().item()
    rate_theirs = (theirs == centre).all(1).double().mean().item()
    sigma = math.sqrt(rate_theirs * (1 - rate_theirs) / DRAWS)
    assert 0.3 < rate_theirs < 0.9 and abs(rate_ours - rate_theirs) < 5 * sigma, (rate_ours, rate_theirs)


def test_draws_consume_the_generator_the_same_whatever_is_accepted() -> None:
    """A batch is a function of the generator's state, and leaves the same state behind on any
    image shape (what a resumable sampler needs)."""
    states = []
    for height, width in [(48, 48), (1, 100), (8, 64)]:
        g = torch.Generator().manual_seed(5)
        random_resized_crop_boxes(128, height, width, generator=g)
        draw_flips(128, generator=g)
        states.append(g.get_state())
    assert all(torch.equal(states[0], s) for s in states[1:])
    a = random_resized_crop_boxes(64, 48, 48, generator=torch.Generator().manual_seed(9))
    b = random_resized_crop_boxes(64, 48, 48, generator=torch.Generator().manual_seed(9))
    assert torch.equal(a, b)


def _outside_weight(index: torch.Tensor, length: torch.Tensor, side: int) -> torch.Tensor:
    """Along one axis: how far (in crop pixels, < 0.5) the bilinear sample of each output pixel
    lies outside the crop's first and last pixel centres; 0 inside."""
    src = (index + 0.5) * length / side - 0.5
    return torch.clamp(-src, min=0) + torch.clamp(src - (length - 1), min=0)


@pytest.mark.parametrize("stored,side", [(48, 32), (160, 128)])
def test_pixels_equal_per_sample_resized_crop(stored: int, side: int) -> None:
    """Against ``resized_crop(bilinear, antialias=False)`` per sample, on the same boxes:
    within TOLERANCE wherever the sample point lies inside the crop; at an enlarged crop's edge
    roi_align blends in the image pixel just outside the box (resized_crop repeats the edge),
    by at most the sample's distance outside it; a whole-image box is equal everywhere."""
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (48, 3, stored, stored), dtype=torch.uint8, generator=g)
    boxes = random_resized_crop_boxes(48, stored, stored, generator=g)
    boxes[:4] = torch.tensor([0, 0, stored, stored])
    ours = resized_crops(images, boxes, side)
    reference = torch.stack([TF.resized_crop(images[k].float(), *boxes[k].tolist(), [side, side],
                                             interpolation=InterpolationMode.BILINEAR, antialias=False)
                             for k in range(len(images))])
    diff = (ours - reference).abs()
    i = torch.arange(side, dtype=torch.float64)
    wy = _outside_weight(i.view(1, -1), boxes[:, 2:3].double(), side)  # (N, side): per output row
    wx = _outside_weight(i.view(1, -1), boxes[:, 3:4].double(), side)  # per output column
    outside = (wy[:, :, None] + wx[:, None, :])[:, None]  # (N, 1, side, side)
    assert diff.masked_select(outside == 0).max() <= TOLERANCE
    assert (outside > 0).any()  # the edge case is exercised
    assert (diff <= 255 * outside + TOLERANCE).all()
    assert diff[:4].max() <= TOLERANCE


def test_flip_and_normalise_exact() -> None:
    """The flip reverses exactly the drawn rows; the whole path is crop -> flip -> normalise_cast
    bit for bit, the normalisation ``(x / 255 - mean) / std`` to float rounding, bf16 and
    channels_last its cast and layout."""
    g = torch.Generator().manual_seed(1)
    images = torch.randint(0, 256, (32, 3, 48, 48), dtype=torch.uint8, generator=g)
    crops = torch.rand(32, 3, 32, 32, generator=g) * 255
    flips = draw_flips(32, generator=g)
    assert 0 < int(flips.sum()) < 32
    expected = torch.where(flips.view(-1, 1, 1, 1), crops.flip(-1), crops)
    assert torch.equal(flip_rows(crops.clone(), flips), expected)

    state = g.get_state()
    out = augment_same_size(images, CropRecipe(32), generator=g)
    g.set_state(state)
    boxes = random_resized_crop_boxes(32, 48, 48, generator=g)
    flips = draw_flips(32, generator=g)
    manual = flip_rows(resized_crops_each(images, boxes, 32), flips)
    assert torch.equal(out, normalise_cast(manual.clone(), IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD, torch.float32))
    mean = torch.tensor(IMAGENET_DEFAULT_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_DEFAULT_STD).view(1, 3, 1, 1)
    torch.testing.assert_close(out, (manual / 255 - mean) / std, rtol=0, atol=2e-6)

    g.set_state(state)
    low = augment_same_size(images, CropRecipe(32), generator=g, dtype=torch.bfloat16, channels_last=True)
    assert low.dtype == torch.bfloat16 and low.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(low, out.to(torch.bfloat16))


def test_each_image_path_is_torchvisions_resized_crop_and_trains_uint8_images() -> None:
    """resized_crops_each is torchvision's tensor resized_crop (bilinear, antialiased) of every
    box bit for bit; augment_same_size takes it for uint8 images, roi_align for float ones, with
    the same draws (boxes, then flips) either way."""
    g = torch.Generator().manual_seed(2)
    images = torch.randint(0, 256, (24, 3, 80, 80), dtype=torch.uint8, generator=g)
    boxes = random_resized_crop_boxes(24, 80, 80, generator=g)
    boxes[0] = torch.tensor([0, 0, 80, 80])
    ours = resized_crops_each(images, boxes, 64)
    reference = torch.stack([TF.resized_crop(images[k], *boxes[k].tolist(), [64, 64],
                                             interpolation=InterpolationMode.BILINEAR, antialias=True)
                             for k in range(len(images))])
    assert ours.dtype == torch.uint8 and torch.equal(ours, reference)
    assert not torch.equal(ours.float(), resized_crops(images, boxes, 64).round())  # a different resize
    for pixels, resize in ((images, resized_crops_each), (images.float(), resized_crops)):
        state = g.get_state()
        out = augment_same_size(pixels, CropRecipe(32), generator=g)
        g.set_state(state)
        drawn = random_resized_crop_boxes(24, 80, 80, generator=g)
        flips = draw_flips(24, generator=g)
        manual = flip_rows(resize(pixels, drawn, 32), flips)
        assert torch.equal(out, normalise_cast(manual, IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD, torch.float32))
    with pytest.raises(ValueError, match="need uint8 images"):
        resized_crops_each(images.float(), boxes, 64)


def test_bad_arguments_are_named() -> None:
    g = torch.Generator()
    with pytest.raises(ValueError, match="increasing positive ranges"):
        random_resized_crop_boxes(4, 48, 48, generator=g, scale=(1.0, 0.5))
    with pytest.raises(ValueError, match=r"\(N, 4\) boxes"):
        resized_crops(torch.zeros(2, 3, 8, 8), torch.zeros(3, 4, dtype=torch.int64), 4)
