"""The batched crop-resize-flip (largebatch.data.batched_resize) against the per-image path it
replaced: the same crops drawn from the same generator, the same pixels up to rounding, and no
work per image but views (the host time of a batch of 256 stays a few milliseconds)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from largebatch.data.augment import (
    CropRecipe,
    augment_batch,
    augment_each,
    centre_crop_box,
    crop_table,
)
from largebatch.data.batched_resize import group_by_area, resize_group, resize_weights
from largebatch.data.crop_boxes import draw_flips, random_resized_crop_boxes

SIZES = [(30, 40), (40, 30), (375, 500), (500, 375), (17, 9), (100, 100), (1, 7), (224, 224), (600, 120)]
TOLERANCE = 0.001  # on the 0..255 scale; what the module docstring states


def _images() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.randint(0, 256, (3, h, w), dtype=torch.uint8, generator=g) for h, w in SIZES]


def _generator(seed: int = 5) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_the_crop_table_is_the_batched_draws_in_order_and_the_centre_crops() -> None:
    """Training: the boxes of all samples, then their flips, from one generator (bit for bit);
    evaluation: torchvision's resize-then-centre-crop geometry, no draw."""
    sizes = torch.tensor(SIZES * 20)
    table = crop_table(sizes, CropRecipe(24, crop_scale=(0.25, 1.0)), train=True, generator=_generator(7))
    g = _generator(7)
    boxes = random_resized_crop_boxes(len(sizes), sizes[:, 0], sizes[:, 1], generator=g, scale=(0.25, 1.0))
    flips = draw_flips(len(sizes), generator=g)
    top, height, virtual_h, offset_h, flip_h, left, width, virtual_w, offset_w, flip_w = table.T
    assert torch.equal(torch.stack([top, left, height, width], 1), boxes) and torch.equal(flip_w, flips.long())
    assert (virtual_h == 24).all() and (virtual_w == 24).all() and not (offset_h | offset_w | flip_h).any()
    val = crop_table(sizes[: len(SIZES)], CropRecipe(24), train=False).tolist()
    for (h, w), row in zip(SIZES, val):
        (rh, rw), ctop, cleft = centre_crop_box(h, w, 24, 0.875)
        assert row == [0, h, rh, ctop, 0, 0, w, rw, cleft, 0]


@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize("size", [24, 224])
def test_batched_equals_image_by_image(train: bool, size: int) -> None:
    images = _images()
    kw = dict(recipe=CropRecipe(size), train=train)
    reference = augment_each(images, generator=_generator(), **kw)
    batched = augment_batch(images, generator=_generator(), **kw)
    assert batched.shape == reference.shape == (len(images), 3, size, size) and batched.dtype == torch.float32
    assert (batched - reference).abs().max() < TOLERANCE
    grouped = augment_batch(images, generator=_generator(), max_pixels=50_000, **kw)  # several groups, back in order
    assert (grouped - reference).abs().max() < TOLERANCE


def test_an_outsized_image_gets_each_groups_weights_at_its_own_sides(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past WEIGHT_ELEMENTS the weights are built per group (not at the batch's largest sides):
    the same pixels."""
    import largebatch.data.augment as augment

    images = _images()
    kw = dict(recipe=CropRecipe(24), train=True, max_pixels=50_000)
    whole = augment_batch(images, generator=_generator(), **kw)
    monkeypatch.setattr(augment, "WEIGHT_ELEMENTS", 1)
    assert torch.equal(augment_batch(images, generator=_generator(), **kw), whole)


def test_a_flip_reverses_the_columns_and_nothing_else() -> None:
    image = _images()[2]
    rows = torch.tensor([[10, 200, 32, 0, 0]])
    cols = torch.tensor([[30, 300, 32, 0, 0]])
    wy, plain_x = resize_weights(rows, 32, 375), resize_weights(cols, 32, 500)
    flipped_x = resize_weights(cols + torch.tensor([0, 0, 0, 0, 1]), 32, 500)
    plain, flipped = resize_group([image], wy, plain_x), resize_group([image], wy, flipped_x)
    assert torch.allclose(flipped, plain.flip(-1), atol=1e-3)
    assert not torch.allclose(flipped, plain, atol=1.0)


def _kernel_count() -> TorchDispatchMode:
    """benchmarks/augment.py's counter of the aten operators run that are not views (each a
    kernel on a device): the one its --host table prints."""
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "augment.py"
    spec = importlib.util.spec_from_file_location("augment_benchmark", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module.KernelCount()


# Kernels per batch of augment_batch in one group (measured: 164 training, 120 evaluation), and
# per group after the first (measured: 9); a per-image copy costs one more per image (291 at 128).
KERNELS_ONE_GROUP, KERNELS_PER_MORE_GROUP = 170, 10


@pytest.mark.parametrize("train", [True, False])
def test_a_batch_costs_the_same_kernels_at_16_and_at_128_images(train: bool) -> None:
    """No per-image copy (or any other per-image kernel) creeps back into the batched path:
    the count of non-view operators is the same for 16 and for 128 images, within a ceiling."""
    counts = {}
    for n in (16, 128):
        images = [torch.randint(0, 256, (3, 20, 15) if k % 4 == 3 else (3, 15, 20), dtype=torch.uint8,
                                generator=_generator(k)) for k in range(n)]
        for groups, max_pixels in ((1, 10**9), (4, 300 * n // 4)):
            with _kernel_count() as count:
                augment_batch(images, CropRecipe(8), train=train, generator=_generator(), max_pixels=max_pixels)
            counts[n, groups] = count.kernels
    assert counts[16, 1] == counts[128, 1] <= KERNELS_ONE_GROUP
    assert counts[16, 4] == counts[128, 4] <= KERNELS_ONE_GROUP + 3 * KERNELS_PER_MORE_GROUP


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
