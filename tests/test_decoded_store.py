"""The decoded store (largebatch.data.decoded_store, issue 72): an image folder decoded once,
in memory or memory-mapped, round-trips pixels and labels and refuses a source that changed."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageOps

from largebatch.data.decoded_store import (
    HEADER_NAME,
    PIXELS_NAME,
    SOURCES_NAME,
    build_decoded_store,
    decode_split,
    open_decoded_store,
    store_bytes,
)
from largebatch.data.images import list_split, load_rgb
from largebatch.data.synthetic import make_synthetic_imagenet
from largebatch.errors import DataError


@pytest.fixture(scope="module")
def embedded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small embedded set: 36 px JPEGs with a grayscale, a CMYK and a PNG-named-JPEG file."""
    return make_synthetic_imagenet(tmp_path_factory.mktemp("data") / "set", num_classes=4, train_per_class=8,
                                   val_per_class=2, image_size=36)


def test_memory_store_holds_each_image_as_every_loader_decodes_it(embedded: Path) -> None:
    store = decode_split(embedded, "train", side=36, workers=2)
    classes, paths, labels = list_split(embedded, "train")
    assert len(store) == len(paths) == 32 and store.header["skipped"] == []
    assert store.labels.tolist() == labels and store.header["classes"] == classes
    for k, path in enumerate(paths):
        assert np.array_equal(store.images[k], np.asarray(load_rgb(path)).transpose(2, 0, 1)), path


def test_disk_store_round_trips_pixels_and_labels(embedded: Path, tmp_path: Path) -> None:
    in_memory = decode_split(embedded, "train", side=24)
    built = build_decoded_store(embedded, tmp_path / "store", "train", side=24, workers=2)
    opened = open_decoded_store(tmp_path / "store", source=embedded, side=24)
    assert isinstance(opened.images, np.memmap)
    for store in (built, opened, opened.in_memory()):
        assert np.array_equal(store.images, in_memory.images)
        assert np.array_equal(store.labels, in_memory.labels)
    assert os.path.getsize(tmp_path / "store" / PIXELS_NAME) == store_bytes(32, 24) == opened.header["bytes"]
    images, labels = opened.batch([5, 0, 31, 5])
    assert images.shape == (4, 3, 24, 24) and labels.tolist() == opened.labels[[5, 0, 31, 5]].tolist()
    assert np.array_equal(images.numpy()[2], in_memory.images[31])


def _tree(root: Path, images: dict[str, Image.Image | bytes]) -> Path:
    for rel, image in images.items():
        path = root / "train" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(image, bytes):
            path.write_bytes(image)
        else:
            image.save(path, format="PNG")
    return root


def test_fits_and_unreadable_files(tmp_path: Path) -> None:
    """``crop`` keeps the centre square, ``squash`` the whole image (PIL bilinear either way);
    an unreadable file is left out and named, the labels of the rest kept in step."""
    rng = np.random.default_rng(0)
    wide = Image.fromarray(rng.integers(0, 256, (20, 40, 3), dtype=np.uint8))
    tall = Image.fromarray(rng.integers(0, 256, (30, 10, 3), dtype=np.uint8))
    root = _tree(tmp_path / "set", {"a/0.png": wide, "a/1.png": b"not an image", "b/2.png": tall})
    for fit in ("crop", "squash"):
        store = decode_split(root, "train", side=16, fit=fit)
        assert store.header["skipped"] == ["train/a/1.png"] and store.labels.tolist() == [0, 1]
        for row, image in enumerate((wide, tall)):
            expected = (ImageOps.fit(image, (16, 16), Image.Resampling.BILINEAR) if fit == "crop"
                        else image.resize((16, 16), Image.Resampling.BILINEAR))
            assert np.array_equal(store.images[row], np.asarray(expected).transpose(2, 0, 1)), (fit, row)
    built = build_decoded_store(root, tmp_path / "store", side=16)
    assert len(built) == 2 and os.path.getsize(tmp_path / "store" / PIXELS_NAME) == store_bytes(2, 16)


def _one_line(err: pytest.ExceptionInfo) -> str:
    text = str(err.value)
    assert "\n" not in text
    return text


def test_refusals_are_one_line(tmp_path: Path) -> None:
    source = tmp_path / "set"
    _tree(source, {"a/0.png": Image.new("RGB", (12, 12), "red"), "b/1.png": Image.new("RGB", (12, 12), "blue")})
    store = tmp_path / "store"
    build_decoded_store(source, store, side=8)
    open_decoded_store(store, source=source)  # unchanged: accepted

    Image.new("RGB", (12, 12), "green").save(source / "train" / "a" / "0.png", format="PNG")  # rewritten
    with pytest.raises(DataError) as err:
        open_decoded_store(store, source=source)
    assert "its files changed since" in _one_line(err) and "rebuild it" in str(err.value)

    with pytest.raises(DataError) as err:
        open_decoded_store(store, side=16)
    assert "holds images at 8 px, not 16" in _one_line(err)
    with pytest.raises(DataError) as err:
        build_decoded_store(source, store, side=8)
    assert "exists already" in _one_line(err)
    with pytest.raises(DataError) as err:
        decode_split(source, side=8, fit="stretch")
    assert "unknown fit 'stretch'" in _one_line(err)
    with pytest.raises(DataError) as err:
        open_decoded_store(tmp_path)
    assert f"no {HEADER_NAME}" in _one_line(err)
    os.truncate(store / PIXELS_NAME, store_bytes(1, 8))
    with pytest.raises(DataError) as err:
        open_decoded_store(store)
    assert f"holds {store_bytes(1, 8)} bytes" in _one_line(err)


def test_a_corrupted_store_or_a_source_changed_in_place_is_refused_in_one_line(
        embedded: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 90 item 4: random bytes written over the pixels trained silently, and so did a
    source image rewritten with its size and modification time kept. The store now carries a
    CRC-32 per block of its pixels, one of its labels and a digest of each source file's bytes;
    opening checks a sample of them (verify="sample"), ``verify="full"`` all."""
    from largebatch.data import decoded_store

    monkeypatch.setattr(decoded_store, "CHECK_BLOCK_BYTES", 1024)  # 54 blocks in 55.3 kB
    monkeypatch.setattr(decoded_store, "_OPEN_CHECK_BYTES", 4 * 1024)  # opening checks 4 of them
    source = tmp_path / "set"
    shutil.copytree(embedded, source)
    store = tmp_path / "store"
    build_decoded_store(source, store, side=24)
    header = json.loads((store / HEADER_NAME).read_text())
    assert len(header["checksum"]["crc32"]) == 54 and header["sources"]["files"] == 32
    assert os.path.getsize(store / SOURCES_NAME) == 32 * 16
    open_decoded_store(store, source=source, verify="full")  # intact: accepted

    pixels = bytearray((store / PIXELS_NAME).read_bytes())
    middle = 20 * 1024 + 7  # block 20: only the full check is sure to read it
    (store / PIXELS_NAME).write_bytes(pixels[:middle] + b"\x00\x01\x02" + pixels[middle + 3:])
    with pytest.raises(DataError) as err:
        open_decoded_store(store, verify="full")
    assert _one_line(err) == (f"decoded store {store} is corrupted: bytes 20,480 to 21,504 of {PIXELS_NAME} differ "
                              "from what was written: rebuild it with largebatch.data.decoded_store.build_decoded_store")
    last = len(pixels) - 5  # the last block: every check reads it
    (store / PIXELS_NAME).write_bytes(pixels[:last] + bytes(5))
    with pytest.raises(DataError) as err:
        open_decoded_store(store, fix="FIX")
    assert _one_line(err).startswith(f"decoded store {store} is corrupted: bytes 54,272 to 55,296 of {PIXELS_NAME}")
    assert str(err.value).endswith(": FIX")
    (store / PIXELS_NAME).write_bytes(pixels)

    changed = dict(header, labels=[(label + 1) % 4 for label in header["labels"]])
    (store / HEADER_NAME).write_text(json.dumps(changed))
    with pytest.raises(DataError) as err:
        open_decoded_store(store)
    assert "is corrupted: its labels differ from what was written" in _one_line(err)
    for bad, named in (([1, 2], "is not a decoded store's header (a JSON object)"),
                       ({k: v for k, v in header.items() if k != "count"}, "has no valid 'count'"),
                       (dict(header, labels=header["labels"][:-1]), "says 32 images at 24 px and holds 31 labels")):
        (store / HEADER_NAME).write_text(json.dumps(bad))
        with pytest.raises(DataError) as err:
            open_decoded_store(store)
        assert named in _one_line(err), bad
    (store / HEADER_NAME).write_text(json.dumps(header))

    _, paths, _ = list_split(source, "train")
    victim = Path(paths[17])
    stat = victim.stat()
    data = bytearray(victim.read_bytes())
    data[-3] ^= 0xFF  # the same size, and the same modification time put back
    victim.write_bytes(bytes(data))
    os.utime(victim, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    open_decoded_store(store, source=source, verify="none")  # the listing alone cannot see it
    with pytest.raises(DataError) as err:
        open_decoded_store(store, source=source)  # 32 files: the sample is every one
    assert _one_line(err).startswith(f"decoded store {store} was built from {victim} as it was then, its content "
                                     "changed since (its size and modification time did not): ")
