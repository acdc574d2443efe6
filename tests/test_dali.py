"""The DALI pipeline against the torchvision path: samples, shards, crops, exact evaluation."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

pytest.importorskip("nvidia.dali")

from largebatch.data.check import check_dataset, require_checked  # noqa: E402
from largebatch.data.contract import LoaderSpec  # noqa: E402
from largebatch.data.pipelines.dali_files import build_dali_loaders  # noqa: E402
from largebatch.data.pipelines.dali_graph import TRAIN_ASPECT_RATIO, dali_available, decode_random_crop  # noqa: E402
from largebatch.data.pipelines.torchvision import DataError, build_loaders  # noqa: E402
from largebatch.data.samplers import exact_part_bounds  # noqa: E402
from largebatch.data.synthetic import make_synthetic_imagenet  # noqa: E402

SIZE = 16  # output pixels: small keeps DALI and Pillow fast


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """4 classes x 13 train (with grayscale, CMYK and PNG-named-.JPEG files) + 4 x 7 val, checked."""
    root = make_synthetic_imagenet(tmp_path_factory.mktemp("dali") / "set", num_classes=4,
                                   train_per_class=13, val_per_class=7, image_size=32)
    assert check_dataset(root, workers=2).ok
    return root


@pytest.fixture(scope="module")
def lists(dataset: Path) -> dict[str, Path]:
    return {split: require_checked(dataset, split) for split in ("train", "val")}


def unique_label_list(root: Path, split: str, out: Path, count: int | None = None) -> Path:
    """A DALI file list of ``root/split`` whose label is each file's index: labels name samples."""
    files = sorted(p.relative_to(root).as_posix() for p in (root / split).rglob("*.JPEG"))[:count]
    out.write_text("".join(f"{rel} {i}\n" for i, rel in enumerate(files)))
    return out


def labels_of(loader) -> list[list[int]]:
    return [labels.tolist() for _, labels, *_ in loader]


def test_dali_available() -> None:
    assert dali_available()


@pytest.mark.parametrize("world_size", [1, 2])
def test_same_samples_labels_and_val_pixels_as_torchvision(dataset: Path, lists, world_size: int) -> None:
    for rank in range(world_size):
        spec = LoaderSpec(image_size=SIZE, batch_size=4, workers=1, rank=rank, world_size=world_size, seed=3)
        d_train, d_val, d_classes = build_dali_loaders(dataset, spec, file_list=lists)
        t_train, t_val, t_classes = build_loaders(dataset, replace(spec, workers=0))
        assert d_classes == t_classes == 4
        assert len(d_train) == len(t_train) and len(d_val) == len(t_val)
        for epoch in (0, 1):  # same sampler: the same images, in the same order, every epoch
            d_train.set_epoch(epoch)
            t_train.set_epoch(epoch)
            assert labels_of(d_train) == labels_of(t_train)
        d_batches, t_batches = list(d_val), list(t_val)
        assert [b[1].tolist() for b in d_batches] == [b[1].tolist() for b in t_batches]
        d_images = torch.cat([b[0] for b in d_batches])
        t_images = torch.cat([b[0] for b in t_batches])
        # Same decoder (libjpeg-turbo), both antialiased bilinear: near pixel-identical, which
        # also pins mean/std, channel order and the centre crop. 0.0175 = one uint8 step.
        assert d_images.shape == t_images.shape == (len(t_images), 3, SIZE, SIZE)
        assert (d_images - t_images).abs().mean() < 0.01
        assert (d_images - t_images).abs().max() < 0.1


def test_train_batches_are_typed_and_change_every_epoch(dataset: Path, lists) -> None:
    train, _, _ = build_dali_loaders(dataset, LoaderSpec(image_size=SIZE, batch_size=4, workers=1), file_list=lists)
    epochs = []
    for epoch in range(2):
        train.set_epoch(epoch)
        batches = list(train)
        images, labels = batches[0]
        assert images.shape == (4, 3, SIZE, SIZE) and images.dtype == torch.float32
        assert labels.dtype == torch.int64 and labels.shape == (4,)
        assert images.device.type == "cpu"
        assert len(batches) == len(train) == 52 // 4
        epochs.append([lab for _, labs in batches for lab in labs.tolist()])
    assert epochs[0] != epochs[1]
    assert sorted(epochs[0]) == sorted(epochs[1])


@pytest.mark.parametrize("world_size", [1, 3])
def test_train_shards_disjoint_and_reshuffled(dataset: Path, tmp_path: Path, world_size: int) -> None:
    flist = unique_label_list(dataset, "train", tmp_path / "train.txt")
    n, batch = 52, 4
    per_rank = (n // world_size) // batch * batch
    seen: dict[int, list[list[int]]] = {}
    for rank in range(world_size):
        spec = LoaderSpec(image_size=SIZE, batch_size=batch, workers=1, rank=rank, world_size=world_size)
        train, _, _ = build_dali_loaders(dataset, spec, file_list={"train": flist})
        for epoch in (0, 1):
            train.set_epoch(epoch)
            ids = [i for labs in labels_of(train) for i in labs]
            assert len(ids) == per_rank == len(set(ids))
            seen.setdefault(epoch, []).append(ids)
    for epoch, shards in seen.items():
        union = [i for ids in shards for i in ids]
        assert len(set(union)) == len(union) == per_rank * world_size  # disjoint
        assert set(union) <= set(range(n))
    assert seen[0] != seen[1]  # a new order every epoch
    if world_size == 1:
        assert sorted(seen[0][0]) != seen[0][0]  # shuffled, not file order


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_val_counts_every_image_exactly_once(dataset: Path, tmp_path: Path, world_size: int) -> None:
    for count in (28, 3):  # 28 % 3 == 1 and batches of 5 leave partial batches; 3 < 4 ranks
        flist = unique_label_list(dataset, "val", tmp_path / f"val{count}.txt", count)
        ids, batches = [], 0
        for rank in range(world_size):
            spec = LoaderSpec(image_size=SIZE, batch_size=5, workers=1, rank=rank, world_size=world_size)
            _, val, _ = build_dali_loaders(dataset, spec, file_list={"val": flist})
            for _ in range(2):  # evaluating twice gives the same batches
                got = labels_of(val)
                assert len(got) == len(val)
            ids += [i for labs in got for i in labs]
            batches += len(got)
        assert sorted(ids) == list(range(count))  # every image once, no padding counted
        part_lens = [end - begin for begin, end in
                      (exact_part_bounds(count, r, world_size) for r in range(world_size))]
        assert batches == sum(math.ceil(k / 5) for k in part_lens)


def test_set_epoch_skip_batches_resumes_mid_epoch(dataset: Path, lists) -> None:
    train, _, _ = build_dali_loaders(dataset, LoaderSpec(image_size=SIZE, batch_size=4, workers=1), file_list=lists)
    train.set_epoch(2)
    full = labels_of(train)
    train.set_epoch(2, skip_batches=5)
    assert labels_of(train) == full[5:]
    assert len(labels_of(train)) == len(full)  # the skip applies to one pass only
    with pytest.raises(ValueError, match="skip_batches"):
        train.set_epoch(0, skip_batches=len(train) + 1)


def test_an_epoch_left_half_read_does_not_leak_into_the_next(dataset: Path, lists) -> None:
    train, _, _ = build_dali_loaders(dataset, LoaderSpec(image_size=SIZE, batch_size=4, workers=1), file_list=lists)
    train.set_epoch(4)
    expected = labels_of(train)
    train.set_epoch(3)
    it = iter(train)
    next(it)
    next(it)  # stop after two batches (a run stopped mid-epoch)
    train.set_epoch(4)
    assert labels_of(train) == expected


def test_nhwc_and_float16_outputs(dataset: Path, lists) -> None:
    spec = LoaderSpec(image_size=SIZE, batch_size=8, workers=1)
    _, nchw, _ = build_dali_loaders(dataset, spec, file_list=lists)
    _, nhwc, _ = build_dali_loaders(dataset, replace(spec, channels_last=True), file_list=lists)
    _, half, _ = build_dali_loaders(dataset, spec, dtype=torch.float16, file_list=lists)
    a, b, c = next(iter(nchw))[0], next(iter(nhwc))[0], next(iter(half))[0]
    assert b.shape == a.shape and b.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(a, b)
    assert c.dtype == torch.float16 and torch.allclose(c.float(), a, atol=1e-2)


def test_bad_arguments_raise_one_clear_error(dataset: Path, tmp_path: Path) -> None:
    spec = LoaderSpec(image_size=SIZE, batch_size=4, workers=1)
    with pytest.raises(ValueError, match="bfloat16"):
        build_dali_loaders(dataset, spec, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="rank must be in 0..1"):
        build_dali_loaders(dataset, replace(spec, rank=2, world_size=2))
    with pytest.raises(DataError, match="does not exist"):
        build_dali_loaders(tmp_path / "missing", spec)
    with pytest.raises(DataError, match="largebatch-check-data"):
        build_dali_loaders(dataset, spec, file_list=tmp_path / "nope.txt")


def _coordinate_png(path: Path, width: int, height: int) -> None:
    """Red = x, green = y: the top-left pixel of a crop tells where it starts (lossless PNG)."""
    x, y = np.meshgrid(np.arange(width), np.arange(height))
    Image.fromarray(np.stack([x, y, np.zeros_like(x)], -1).astype(np.uint8)).save(path)


def test_crop_area_and_aspect_statistics_match_torchvision(tmp_path: Path) -> None:
    """Area fraction, log aspect ratio and crop centre of DALI's crop vs RandomResizedCrop.

    2,000 crops each of a 256x192 image; two-sample Kolmogorov-Smirnov distance < 0.07 (the
    5% critical value for n = m = 2,000 is 0.043, 0.1% is 0.062), means within 0.02.
    """
    import nvidia.dali as dali
    from torchvision.transforms import v2

    width, height, n, batch = 256, 192, 2000, 250
    _coordinate_png(tmp_path / "coords.png", width, height)
    data = np.fromfile(tmp_path / "coords.png", dtype=np.uint8)

    @dali.pipeline_def(batch_size=batch, num_threads=2, device_id=None, seed=7)
    def crops():
        encoded = dali.fn.external_source(source=lambda: [data] * batch, batch=True)
        return decode_random_crop(encoded, gpu=False)

    pipe = crops()
    pipe.build()
    boxes = []  # (x0, y0, w, h)
    for _ in range(n // batch):
        for crop in pipe.run()[0]:
            crop = np.asarray(crop)
            boxes.append((crop[0, 0, 0], crop[0, 0, 1], crop.shape[1], crop.shape[0]))
    dali_boxes = np.array(boxes, dtype=np.float64)
    torch.manual_seed(0)
    image = torch.zeros(3, height, width)
    ref = np.array([(j, i, w, h) for i, j, h, w in (
        v2.RandomResizedCrop.get_params(image, scale=[0.08, 1.0], ratio=list(TRAIN_ASPECT_RATIO))
        for _ in range(n))], dtype=np.float64)

    def stats(b: np.ndarray) -> dict[str, np.ndarray]:
        return {"area": b[:, 2] * b[:, 3] / (width * height), "log_ratio": np.log(b[:, 2] / b[:, 3]),
                "centre_x": (b[:, 0] + b[:, 2] / 2) / width, "centre_y": (b[:, 1] + b[:, 3] / 2) / height}

    def ks(a: np.ndarray, b: np.ndarray) -> float:
        grid = np.sort(np.concatenate([a, b]))
        cdf = lambda s: np.searchsorted(np.sort(s), grid, side="right") / len(s)  # noqa: E731
        return float(np.abs(cdf(a) - cdf(b)).max())

    got, want = stats(dali_boxes), stats(ref)
    assert got["area"].min() >= 0.08 - 0.01 and got["area"].max() <= 1.0
    assert np.all(np.abs(got["log_ratio"]) <= math.log(4 / 3) + 0.02)
    for key in got:
        assert ks(got[key], want[key]) < 0.07, key
        assert abs(got[key].mean() - want[key].mean()) < 0.02, key


@pytest.mark.gpu
def test_gpu_mixed_decode_matches_cpu(dataset: Path, lists) -> None:
    spec = LoaderSpec(image_size=SIZE, batch_size=8, workers=2)
    gpu_train, gpu_val, _ = build_dali_loaders(dataset, replace(spec, device="cuda:0"), file_list=lists)
    cpu_train, cpu_val, _ = build_dali_loaders(dataset, spec, file_list=lists)
    images, labels = next(iter(gpu_train))
    assert images.is_cuda and labels.is_cuda and labels.dtype == torch.int64
    assert labels_of(gpu_train) == labels_of(cpu_train)  # grayscale, CMYK and PNG files included
    g = torch.cat([b[0].cpu() for b in gpu_val])
    c = torch.cat([b[0] for b in cpu_val])
    assert g.shape == c.shape
    # nvJPEG upsamples chroma unlike libjpeg-turbo's "fancy" filter: on these noisy images the
    # decoded pixels differ by ~2.3 levels on average (measured on an H100); 0.15 ~ 8 levels.
    assert (g - c).abs().mean() < 0.15


def test_a_failed_allocation_in_the_pipeline_is_out_of_memory_not_a_broken_file() -> None:
    """DALI's ``std::bad_alloc`` (the CPU) or CUDA out of memory was reported as "could not read or
    decode an image ... a file changed or broke" (exit 2); it is a MemoryError, which the step or
    the evaluation reading the batch reports as out of memory (exit 4). A decoder error stays a
    DataError naming the data check."""
    from largebatch.data.pipelines.dali_graph import _decode_error
    from largebatch.engine.out_of_memory import allocation_text, is_allocation_failure

    alloc = _decode_error(RuntimeError("Critical error in pipeline:\nError in CPU operator "
                                       "`nvidia.dali.fn.crop_mirror_normalize`,\nencountered:\nstd::bad_alloc"), "/d")
    assert isinstance(alloc, MemoryError) and is_allocation_failure(alloc)
    assert allocation_text(alloc) == "DALI could not allocate memory (Error in CPU operator " \
                                     "`nvidia.dali.fn.crop_mirror_normalize`)"
    broken = _decode_error(RuntimeError("Error in CPU operator `decoders.image`,\nencountered:\nbad JPEG"), "/d")
    assert isinstance(broken, DataError) and "run largebatch-check-data /d again" in str(broken)
