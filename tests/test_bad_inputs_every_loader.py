"""One table of bad inputs, run against every loader: the same files are skipped (each counted
once over all epochs and workers), decoded, or refused with one line.

Loaders: ``data.loader=torchvision`` (Pillow in workers), ``nvjpeg`` (bytes in workers,
decode in the main process; here on the CPU), ``decoded`` (a store decoded once, which names the
files it could not decode) and ``dali`` (which reads the file lists the
data check writes: a file the check leaves out is DALI's "skip"). Links that loop are in
tests/test_data_links.py; they are refused by the same listing for all three. The tree-level
cases (hidden folders, ...) also run against DALI without file lists and packed shards.
"""

from __future__ import annotations

import io
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Callable

import pytest
from PIL import Image

from largebatch.data.contract import LoaderSpec
from largebatch.data.pipelines.torchvision import DataError, build_loaders
from largebatch.data.pipelines.nvjpeg import build_nvjpeg_loaders
from largebatch.data.synthetic import make_synthetic_imagenet
from tests.fifo_guard import watched_fifo

EPOCHS = 3
WORKERS = 2


def _jpeg(mode: str = "RGB", size: tuple[int, int] = (40, 32)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, (90, 160, 30)).convert(mode).save(buf, format="JPEG", quality=90)
    return buf.getvalue()


def _bomb() -> bytes:
    """A valid ~600-byte JPEG whose frame header claims 30000x30000 pixels."""
    data = bytearray(_jpeg(size=(8, 8)))
    i = 2
    while data[i + 1] not in (0xC0, 0xC2):
        i += 2 + int.from_bytes(data[i + 2 : i + 4], "big")
    data[i + 5 : i + 9] = (30000).to_bytes(2, "big") * 2
    return bytes(data)


def _png() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (40, 32), (10, 20, 30)).save(buf, format="PNG")
    return buf.getvalue()


# case -> (what to write into the first N training files, N, outcome)
SKIPPED, DECODED = "skipped", "decoded"
CASES: dict[str, tuple[Callable[[bytes], bytes], int, str]] = {
    "truncated": (lambda good: good[: len(good) // 2], 2, SKIPPED),
    "not-an-image": (lambda good: b"<html>404 Not Found</html>\n", 1, SKIPPED),
    "empty-file": (lambda good: b"", 2, SKIPPED),
    "decompression-bomb": (lambda good: _bomb(), 1, SKIPPED),
    "png-named-jpeg": (lambda good: _png(), 1, DECODED),
    "cmyk-jpeg": (lambda good: _jpeg("CMYK"), 1, DECODED),
    "grayscale-jpeg": (lambda good: _jpeg("L"), 1, DECODED),
}


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_synthetic_imagenet(tmp_path_factory.mktemp("bad") / "ds", num_classes=3, train_per_class=6,
                                   val_per_class=2, image_size=32)


@pytest.fixture
def data(clean: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(clean, tmp_path / "ds"))


def _train_files(root: Path) -> list[Path]:
    return sorted((root / "train").rglob("*.JPEG"))


def _epochs(loader) -> int:  # type: ignore[no-untyped-def]
    seen = 0
    for epoch in range(EPOCHS):
        loader.set_epoch(epoch)
        seen += sum(len(labels) for _, labels, *_ in loader)
    return seen


def _torchvision(root: Path) -> int:
    train, _, _ = build_loaders(root, LoaderSpec(image_size=16, batch_size=3, workers=WORKERS))
    _epochs(train)
    return train.skipped


def _nvjpeg(root: Path) -> int:
    train, _, _ = build_nvjpeg_loaders(root, LoaderSpec(image_size=16, batch_size=3, workers=WORKERS, device="cpu"))
    _epochs(train)
    return train.skipped


def _decoded(root: Path) -> int:
    from largebatch.data.pipelines.decoded import build_decoded_loaders

    train, _, _ = build_decoded_loaders(root, LoaderSpec(image_size=16, batch_size=3, workers=WORKERS),
                                        cache=root.parent / "cache")
    _epochs(train)
    return train.skipped


def _dali(root: Path) -> int:
    pytest.importorskip("nvidia.dali")
    from largebatch.data.check import check_dataset, require_checked
    from largebatch.data.pipelines.dali_files import build_dali_loaders

    report = check_dataset(root, workers=WORKERS, splits=("train", "val"))
    lists = {split: require_checked(root, split) for split in ("train", "val")}
    train, _, _ = build_dali_loaders(root, LoaderSpec(image_size=16, batch_size=3, workers=1), file_list=lists)
    _epochs(train)
    return len([p for p in report.problems if p.fatal])


LOADERS = {"torchvision": _torchvision, "nvjpeg": _nvjpeg, "decoded": _decoded, "dali": _dali}


@pytest.mark.parametrize("loader", LOADERS)
@pytest.mark.parametrize("case", CASES)
def test_every_loader_treats_a_bad_file_alike(data: Path, case: str, loader: str) -> None:
    make, count, outcome = CASES[case]
    for path in _train_files(data)[:count]:
        path.write_bytes(make(path.read_bytes()))
    skipped = LOADERS[loader](data)
    assert skipped == (count if outcome == SKIPPED else 0), f"{case} on {loader}: {skipped} skipped"


@pytest.mark.parametrize("loader", LOADERS)
def test_every_loader_refuses_a_class_without_one_readable_image(data: Path, loader: str) -> None:
    victim = sorted(p for p in (data / "train").iterdir() if p.is_dir())[1]
    for path in victim.glob("*.JPEG"):
        path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(DataError, match=f"^class '{victim.name}' has no readable training image: "):
        LOADERS[loader](data)


def _build(loader: str, root: Path, tmp: Path) -> tuple:  # type: ignore[type-arg]
    """``(train, val, num_classes)`` of ``root`` from ``loader``; DALI and shards from a fresh check."""
    spec = LoaderSpec(image_size=16, batch_size=3, workers=1)
    if loader == "torchvision":
        return build_loaders(root, spec)
    if loader == "nvjpeg":
        return build_nvjpeg_loaders(root, replace(spec, device="cpu"))
    if loader == "decoded":
        from largebatch.data.pipelines.decoded import build_decoded_loaders

        return build_decoded_loaders(root, spec, cache=tmp / "cache")
    pytest.importorskip("nvidia.dali")
    from largebatch.data.check import check_dataset, require_checked
    from largebatch.data.pipelines.dali_files import build_dali_loaders
    from largebatch.data.pipelines.dali_shards import build_dali_shard_loaders
    from largebatch.data.shards import make_shards

    if loader == "dali-tree":
        return build_dali_loaders(root, spec)
    check_dataset(root, workers=WORKERS)
    if loader == "dali":
        return build_dali_loaders(root, spec, file_list={s: require_checked(root, s) for s in ("train", "val")})
    make_shards(root, tmp / "shards", shard_size=5)
    return build_dali_shard_loaders(tmp / "shards", spec)


TREE_LOADERS = ["torchvision", "nvjpeg", "decoded", "dali", "dali-tree", "shards"]


@pytest.mark.parametrize("loader", TREE_LOADERS)
def test_every_loader_skips_hidden_folders_as_classes(data: Path, tmp_path: Path, loader: str) -> None:
    """Issue 54 item 6a: ``train/.ipynb_checkpoints/`` was a class: class 0, every label shifted
    by one (with an image in it) or the run stopped on an empty class (without)."""
    image = _train_files(data)[0].read_bytes()
    for split in ("train", "val"):
        (data / split / ".ipynb_checkpoints").mkdir()
        (data / split / ".ipynb_checkpoints" / "n0000-checkpoint.JPEG").write_bytes(image)
    (data / "train" / ".Trash-1000").mkdir()  # an empty one, too
    train, val, num_classes = _build(loader, data, tmp_path)
    assert num_classes == 3
    labels = sorted({int(t) for _, batch, *_ in val for t in batch})
    assert labels == [0, 1, 2], f"{loader}: val labels {labels}"


@pytest.mark.parametrize("loader", [*TREE_LOADERS, "check"])
def test_every_loader_and_the_check_refuse_a_class_only_in_val(data: Path, tmp_path: Path, loader: str) -> None:
    """Issue 54 item 3: the check passed such a tree and DALI (from its lists) trained a whole
    epoch, then stopped at the first evaluation with an IndexError (a val label out of range)."""
    def add_val_only_class() -> None:
        shutil.copytree(next((data / "val").iterdir()), data / "val" / "zzz")

    if loader in ("dali", "shards"):  # lists and shards made before the class appeared: the loader must see it
        pytest.importorskip("nvidia.dali")
        from largebatch.data.check import check_dataset, require_checked
        from largebatch.data.shards import make_shards

        check_dataset(data, workers=WORKERS)
        lists = {s: require_checked(data, s) for s in ("train", "val")}
        make_shards(data, tmp_path / "shards", shard_size=5)
        add_val_only_class()
        meta_path = tmp_path / "shards" / "val" / "meta.json"  # as make_shards wrote it for this tree
        meta_path.write_text(meta_path.read_text().replace('"n0002"', '"n0002", "zzz"'))
    else:
        add_val_only_class()
    with pytest.raises(DataError, match=r"class folders differ: 0 only in train \[\], 1 only in val \['zzz'\]"):
        if loader == "check":
            from largebatch.data.check import check_dataset

            check_dataset(data, workers=WORKERS)
        elif loader == "dali":
            from largebatch.data.pipelines.dali_files import build_dali_loaders

            build_dali_loaders(data, LoaderSpec(image_size=16, batch_size=3, workers=1), file_list=lists)
        elif loader == "shards":
            from largebatch.data.pipelines.dali_shards import build_dali_shard_loaders

            build_dali_shard_loaders(tmp_path / "shards", LoaderSpec(image_size=16, batch_size=3, workers=1))
        else:
            _build(loader, data, tmp_path)


@pytest.mark.parametrize("loader", LOADERS)
def test_every_loader_skips_a_fifo_without_opening_it(data: Path, loader: str) -> None:
    """Issue 54 item 4: a FIFO under train/ hung the check and the training forever, silently, in
    an open() that SIGTERM could not interrupt. Now it is skipped and counted (torchvision,
    nvjpeg) or left out by the check (DALI), and never opened."""
    victim = _train_files(data)[0]
    victim.unlink()
    with watched_fifo(victim) as opens:
        skipped = LOADERS[loader](data)
    assert opens.count == 0, f"{loader} opened the FIFO {opens.count} time(s)"
    assert skipped == 1


def test_dali_over_a_tree_refuses_a_fifo_in_one_line(data: Path) -> None:
    """DALI without the check's lists cannot skip a file: refused at build, not opened."""
    pytest.importorskip("nvidia.dali")
    from largebatch.data.pipelines.dali_files import build_dali_loaders

    victim = _train_files(data)[0]
    victim.unlink()
    with watched_fifo(victim) as opens, pytest.raises(DataError, match=f"^{victim} is a FIFO"):
        build_dali_loaders(data, LoaderSpec(image_size=16, batch_size=3, workers=1))
    assert opens.count == 0
