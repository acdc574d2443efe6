"""The torchvision pipeline: transforms, RGB decoding, skip-and-count, clear errors, loaders."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from PIL import Image

from largebatch.data.augment import build_train_transform, build_val_transform
from largebatch.data.contract import LoaderSpec
from largebatch.data.image_folder import RobustImageFolder
from largebatch.data.pipelines.torchvision import build_loaders, collate_skipping
from largebatch.data.images import Unreadable, load_rgb
from largebatch.data.synthetic import make_synthetic_imagenet, oddity_positions
from largebatch.errors import DataError

SMALL = dict(num_classes=3, train_per_class=6, val_per_class=3, image_size=32)


@pytest.fixture(scope="module")
def data_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_synthetic_imagenet(tmp_path_factory.mktemp("folder") / "ds", **SMALL)


@pytest.fixture
def copy_root(data_root: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(data_root, tmp_path / "ds"))


def test_transform_shapes() -> None:
    img = Image.new("RGB", (50, 37), (10, 200, 30))
    x = build_train_transform(24, scale=(0.25, 1.0))(img)
    assert x.shape == (3, 24, 24) and x.dtype == torch.float32
    y = build_val_transform(24, crop_ratio=0.875)(img)
    assert y.shape == (3, 24, 24)
    # normalised: a constant colour maps to (c/255 - mean) / std on every pixel
    assert torch.allclose(y[1], torch.full((24, 24), (200 / 255 - 0.456) / 0.224), atol=1e-4)
    assert build_train_transform(8, hflip=0.0)(img).shape == (3, 8, 8)


def test_odd_files_load_as_rgb_through_the_pipeline(data_root: Path) -> None:
    ds = RobustImageFolder(data_root / "train", build_val_transform(16))
    for (c, i), kind in oddity_positions(3, 6).items():
        path = str(data_root / "train" / f"n{c:04d}" / f"n{c:04d}_train_{i:06d}.JPEG")
        index = [p for p, _ in ds.samples].index(path)
        image, label = ds[index]
        assert image.shape == (3, 16, 16) and label == c, kind


@pytest.mark.parametrize("mode", ["L", "CMYK", "P", "RGBA", "LA", "I;16"])
def test_load_rgb_any_mode(tmp_path: Path, mode: str) -> None:
    path = tmp_path / "x.JPEG"
    img = Image.new("RGB", (8, 8), (100, 50, 25)).convert(mode)
    img.save(path, format="JPEG" if mode in ("L", "CMYK") else "PNG")
    assert load_rgb(str(path)).mode == "RGB"


def _break_files(root: Path) -> list[Path]:
    cls = root / "train" / "n0001"
    bad = [cls / "zero.JPEG", cls / "text.JPEG", cls / "truncated.JPEG"]
    bad[0].write_bytes(b"")
    bad[1].write_text("this is not an image\n")
    good = next(cls.glob("n0001_train_*.JPEG")).read_bytes()
    bad[2].write_bytes(good[: len(good) // 2])
    return bad


def test_unreadable_files_are_skipped_and_counted(copy_root: Path) -> None:
    bad = _break_files(copy_root)
    ds = RobustImageFolder(copy_root / "train", build_val_transform(16))
    paths = [p for p, _ in ds.samples]
    for path in bad:
        i = paths.index(str(path))
        assert ds[i] == Unreadable(i, 1)
    images, labels, skipped = collate_skipping([ds[i] for i in range(len(ds))], refill=False)
    assert len(skipped) == 3 and images.shape == (18, 3, 16, 16) and labels.shape == (18,)
    images, labels, skipped = collate_skipping([ds[i] for i in range(len(ds))], refill=True)
    assert len(skipped) == 3 and images.shape == (21, 3, 16, 16)
    with pytest.raises(DataError, match="unreadable"):
        collate_skipping([Unreadable(0, 0), Unreadable(1, 0)], refill=True)
    assert collate_skipping([Unreadable(4, 2)], refill=False) == (None, None, (Unreadable(4, 2),))


@pytest.mark.parametrize("workers", [0, 2])
def test_loaders_count_skips_and_keep_train_batch_size(copy_root: Path, workers: int) -> None:
    _break_files(copy_root)
    (copy_root / "val" / "n0002" / "zero.JPEG").write_bytes(b"")
    train, val, num_classes = build_loaders(
        copy_root, LoaderSpec(image_size=16, batch_size=7, workers=workers, crop_scale=(0.25, 1.0))
    )
    assert num_classes == 3 and len(train) == 3  # 21 files, batch 7, 1 rank
    for epoch in range(2):
        train.set_epoch(epoch)
        shapes = [(x.shape, y.shape) for x, y in train]
        assert shapes == [((7, 3, 16, 16), (7,))] * 3
    assert train.skipped == 3  # 3 bad files, read in each of 2 epochs: counted once each
    seen = sum(len(y) for _, y in val)
    assert seen == 9 and val.skipped == 1  # 10 files, the empty one skipped


def test_loaders_shard_val_exactly(data_root: Path) -> None:
    labels = []
    for rank in range(4):
        _, val, _ = build_loaders(data_root, LoaderSpec(image_size=16, batch_size=2, workers=0, rank=rank,
                                                        world_size=4))
        labels.append(torch.cat([y for _, y in val]) if len(val) else torch.empty(0))
    assert [len(y) for y in labels] == [3, 2, 2, 2]
    assert sorted(torch.cat(labels).tolist()) == [0] * 3 + [1] * 3 + [2] * 3


def test_missing_root_and_split(tmp_path: Path, copy_root: Path) -> None:
    with pytest.raises(DataError, match="does not exist"):
        build_loaders(tmp_path / "nope", LoaderSpec(image_size=16, batch_size=2, workers=0))
    shutil.rmtree(copy_root / "val")
    with pytest.raises(DataError, match="no val/ folder"):
        build_loaders(copy_root, LoaderSpec(image_size=16, batch_size=2, workers=0))
    with pytest.raises(DataError, match="does not exist"):
        RobustImageFolder(tmp_path / "nope")


def test_empty_class_folder(copy_root: Path) -> None:
    (copy_root / "train" / "n0009").mkdir()
    (copy_root / "train" / "n0009" / "readme.txt").write_text("no images here")
    with pytest.raises(DataError, match="n0009 holds no image"):
        RobustImageFolder(copy_root / "train")


def test_no_class_folders(tmp_path: Path) -> None:
    (tmp_path / "flat").mkdir()
    with pytest.raises(DataError, match="no class sub-folders"):
        RobustImageFolder(tmp_path / "flat")


def test_train_and_val_classes_differ(copy_root: Path) -> None:
    shutil.rmtree(copy_root / "val" / "n0002")
    with pytest.raises(DataError, match=r"class folders differ.*1 only in train \['n0002'\]"):
        build_loaders(copy_root, LoaderSpec(image_size=16, batch_size=2, workers=0))


def test_data_error_is_a_value_error() -> None:
    assert issubclass(DataError, ValueError)


def _epoch_batches(loader, epoch: int, skip_batches: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:  # type: ignore[no-untyped-def]
    loader.set_epoch(epoch, skip_batches=skip_batches)
    return [(x.clone(), y.clone()) for x, y in loader]


def test_augmentation_is_the_same_with_0_and_2_workers_and_after_a_mid_epoch_start(data_root: Path) -> None:
    """Crops are a function of (seed, epoch, index): not of the worker process or stop point."""
    spec = LoaderSpec(image_size=16, batch_size=3, workers=0, crop_scale=(0.08, 1.0), seed=7)
    zero, _, _ = build_loaders(data_root, spec)
    two, _, _ = build_loaders(data_root, replace(spec, workers=2))
    for epoch in (0, 1):
        a, b = _epoch_batches(zero, epoch), _epoch_batches(two, epoch)
        assert len(a) == len(b) == 6
        assert all(torch.equal(xa, xb) and torch.equal(ya, yb) for (xa, ya), (xb, yb) in zip(a, b))
        resumed = _epoch_batches(two, epoch, skip_batches=4)  # a run resumed after 4 batches
        assert all(torch.equal(xa, xr) for (xa, _), (xr, _) in zip(a[4:], resumed))
    assert not torch.equal(_epoch_batches(zero, 0)[0][0], _epoch_batches(zero, 1)[0][0])
    torch.manual_seed(123)  # the global stream plays no part
    assert torch.equal(_epoch_batches(zero, 0)[2][0], _epoch_batches(two, 0)[2][0])


@pytest.mark.parametrize("workers", [0, 2])
def test_a_class_without_one_readable_image_stops_the_run(copy_root: Path, workers: int) -> None:
    cls = copy_root / "train" / "n0002"
    for f in cls.iterdir():
        f.write_bytes(b"not an image")
    train, _, _ = build_loaders(copy_root, LoaderSpec(image_size=16, batch_size=6, workers=workers))
    train.set_epoch(0)
    with pytest.raises(DataError, match="class 'n0002' has no readable training image: all 6 file"):
        for _ in train:
            pass


@pytest.mark.parametrize("workers", [0, 2])
def test_train_augmentation_follows_the_seed(data_root: Path, workers: int) -> None:
    """``seed`` drives the random crops/flips (not only the order): one batch holds the whole
    train split, so its pixel sum ignores the order and changes only with the augmentation.
    The same seed gives the same batch (with worker processes too), another seed other crops."""

    def whole_split(seed: int) -> torch.Tensor:
        if workers == 0:
            torch.manual_seed(seed)  # the CLI seeds the global generator: workers=0 draws from it
        train, _, _ = build_loaders(data_root, LoaderSpec(image_size=16, batch_size=18, workers=workers,
                                                          seed=seed, crop_scale=(0.25, 1.0)))
        x, _ = next(iter(train))
        return x

    a, b, c = whole_split(0), whole_split(0), whole_split(1)
    assert torch.equal(a, b)
    assert not torch.isclose(a.sum(), c.sum(), rtol=1e-4)
