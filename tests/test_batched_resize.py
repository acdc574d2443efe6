"""The batched crop-resize-flip (largebatch.data.batched_resize) against the per-image path it
replaced: the same crops drawn from the same generators, and the same pixels up to rounding."""

from __future__ import annotations

import pytest
import torch

from largebatch.data.augment import (
    CropRecipe,
    augment_batch,
    augment_each,
    crop_plans,
    random_resized_crop_box,
    sample_rng,
)
from largebatch.data.batched_resize import AxisPlan, group_by_area, resize_group

SIZES = [(30, 40), (40, 30), (375, 500), (500, 375), (17, 9), (100, 100), (1, 7), (224, 224), (600, 120)]
TOLERANCE = 0.001  # on the 0..255 scale; what the module docstring states


def _images() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.randint(0, 256, (3, h, w), dtype=torch.uint8, generator=g) for h, w in SIZES]


def test_crop_plans_are_the_per_image_draws_bit_for_bit() -> None:
    """The rule the per-image loop followed: box, then one draw for the flip, per (seed, epoch, index)."""
    for index in range(500):
        h, w = SIZES[index % len(SIZES)]
        rng = sample_rng(7, 2, index)
        top, left, ch, cw = random_resized_crop_box(h, w, (0.08, 1.0), (3 / 4, 4 / 3), rng)
        flip = rng.random() < 0.5
        (rows, cols), = crop_plans([(h, w)], [index], CropRecipe(24), train=True, epoch=2, seed=7)
        assert (rows.start, cols.start, rows.length, cols.length, cols.flip) == (top, left, ch, cw, flip)
        assert not rows.flip and rows.virtual == cols.virtual == 24 and rows.offset == cols.offset == 0


@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize("size", [24, 224])
def test_batched_equals_image_by_image(train: bool, size: int) -> None:
    images = _images()
    indices = list(range(100, 100 + len(images)))
    kw = dict(recipe=CropRecipe(size), train=train, epoch=1, seed=3)
    reference = augment_each(images, indices, **kw)
    batched = augment_batch(images, indices, **kw)
    assert batched.shape == reference.shape == (len(images), 3, size, size) and batched.dtype == torch.float32
    assert (batched - reference).abs().max() < TOLERANCE
    grouped = augment_batch(images, indices, max_pixels=50_000, **kw)  # several groups, back in batch order
    assert (grouped - reference).abs().max() < TOLERANCE


def test_a_flip_reverses_the_columns_and_nothing_else() -> None:
    image = _images()[2]
    rows, cols = AxisPlan(10, 200, 32), AxisPlan(30, 300, 32)
    plain = resize_group([image[:, 10:210, 30:330]], [rows], [cols], 32)
    flipped = resize_group([image[:, 10:210, 30:330]], [rows], [cols._replace(flip=True)], 32)
    assert torch.allclose(flipped, plain.flip(-1), atol=1e-3)
    assert not torch.allclose(flipped, plain, atol=1.0)


def test_groups_cover_every_sample_once_within_the_pixel_budget() -> None:
    sizes = [(h, w) for h, w in SIZES * 5]
    groups = group_by_area(sizes, 100_000)
    assert sorted(k for g in groups for k in g) == list(range(len(sizes)))
    for g in groups:
        padded = len(g) * max(sizes[k][0] for k in g) * max(sizes[k][1] for k in g)
        assert len(g) == 1 or padded <= 100_000
    assert len(group_by_area(sizes, 10**9)) == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("channels_last", [False, True])
def test_normalise_and_cast_in_one_kernel_equal_the_two_steps(dtype: torch.dtype, channels_last: bool) -> None:
    from largebatch.data.augment import IMAGENET_DEFAULT_MEAN as MEAN, IMAGENET_DEFAULT_STD as STD, normalise
    from largebatch.data.augment import normalise_cast

    images = torch.rand(4, 3, 8, 8, generator=torch.Generator().manual_seed(1)) * 255
    fused = normalise_cast(images, MEAN, STD, dtype, channels_last)
    reference = normalise(images.clone(), MEAN, STD).to(dtype)
    assert fused.dtype == dtype and fused.is_contiguous(memory_format=torch.channels_last) == channels_last
    # the fp32 values may differ in their last bit (one fused multiply-add): one ulp of dtype after the cast
    assert torch.allclose(fused.float(), reference.float(), atol=1e-5, rtol=torch.finfo(dtype).eps)
