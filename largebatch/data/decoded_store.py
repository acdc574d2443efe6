"""A decoded store: one split of an image folder decoded once to uint8 at one stored side.

A per-sample loader decodes every JPEG again every epoch; FFCV's "raw" mode and DALI's
caching decoders decode once and keep pixels. :func:`decode_split` decodes ``ROOT/<split>``
(an ImageFolder tree: ImageNet or the embedded set, listed and checked as every loader lists
it, :func:`largebatch.data.images.list_split`) into an ``(N, 3, side, side)`` uint8 array held
in memory; :func:`build_decoded_store` writes the same array to a ``numpy.memmap`` file on
local disk with a small JSON header, for a set that does not fit in memory, and
:func:`open_decoded_store` maps it back. Batches are then cut from it by
:mod:`largebatch.data.batched_crop`.

Each image is decoded as every loader decodes it (:func:`largebatch.data.images.load_rgb`:
EXIF orientation, CMYK, grayscale and PNG to RGB), then brought to ``side x side`` with PIL's
bilinear resize (antialiased, as torchvision's ``Resize`` on a PIL image): ``fit="crop"``
(default) scales the shorter side to ``side`` and keeps the centre square (aspect ratio kept,
the ends of the longer side lost: 1/4 of a 4:3 image); ``fit="squash"`` scales the whole image
to the square (nothing lost, aspect ratio changed, as the downsampled ImageNet variants of
Chrabaszcz et al. 2017, arXiv 1707.08819, do). Files that cannot be decoded are left out and
named in the header (``skipped``).

Disk (and memory) cost: ``N x 3 x side**2`` bytes (:func:`store_bytes`), plus a header of a few
bytes per label: ImageNet's 1,281,167 training images take 98.4 GB at side 160, 15.7 GB at 64,
8.9 GB at 48; the embedded set's 5,200 at 48 px 35.9 MB. Pick the side just above the largest
training crop side. Layout on disk, in a folder ``OUT``:

* ``OUT/images.uint8``: the pixels, C order, NCHW (what ``roi_align`` reads), no header;
* ``OUT/store.json``: ``version``, ``split``, ``source`` (the folder's absolute path), ``side``,
  ``fit``, ``count``, ``classes``, ``labels`` (one int per image), ``skipped`` (paths relative
  to the source), ``bytes`` and ``fingerprint``: the source split's file names, sizes and
  modification times (the data check's rule, :mod:`largebatch.data.check`). :func:`open_decoded_store`
  given the source refuses a store whose source changed since, in one line.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
from PIL import Image, ImageOps

from largebatch.data.check import _fingerprint, _rel, _stat_key
from largebatch.data.images import list_split, load_rgb
from largebatch.errors import DataError

__all__ = ["FITS", "HEADER_NAME", "PIXELS_NAME", "STORE_VERSION", "DecodedStore", "build_decoded_store",
           "decode_split", "open_decoded_store", "source_fingerprint", "store_bytes"]

STORE_VERSION = 1
HEADER_NAME = "store.json"
PIXELS_NAME = "images.uint8"
FITS = ("crop", "squash")
_CHUNK = 256  # images decoded per round of the thread pool (bounds the decoded images in flight)


@dataclass(frozen=True)
class DecodedStore:
    """Decoded images of one split: ``images`` uint8 ``(N, 3, side, side)`` (a ``numpy.memmap``
    when on disk), ``labels`` int64 ``(N,)``, and the ``header`` (module docstring)."""

    images: np.ndarray
    labels: np.ndarray
    header: dict[str, Any]

    def __len__(self) -> int:
        return int(self.images.shape[0])

    @property
    def side(self) -> int:
        return int(self.header["side"])

    def batch(self, indices: Sequence[int] | np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """``(images, labels)`` of ``indices``, in that order: uint8 ``(B, 3, side, side)`` and
        int64 ``(B,)`` tensors, copies (a memmap is read here)."""
        rows = np.asarray(indices, dtype=np.int64)
        return torch.from_numpy(self.images[rows]), torch.from_numpy(self.labels[rows])

    def in_memory(self) -> DecodedStore:
        """This store with its pixels read into memory (a copy of a memmap; itself otherwise)."""
        if not isinstance(self.images, np.memmap):
            return self
        return DecodedStore(np.array(self.images), self.labels, self.header)


def store_bytes(count: int, side: int) -> int:
    """The pixels' size of a store of ``count`` images at ``side``, bytes (disk or memory)."""
    return count * 3 * side * side


def source_fingerprint(root: str | os.PathLike, split: str, paths: Sequence[str] | None = None) -> str:
    """The data check's fingerprint of ``root/split`` (names, sizes, modification times)."""
    root = str(Path(root).expanduser().absolute())
    if paths is None:
        _, paths, _ = list_split(root, split)
    return _fingerprint([(_rel(p, root), _stat_key(p)) for p in paths])


def _decode_one(path: str, side: int, fit: str) -> np.ndarray | None:
    """``(3, side, side)`` uint8 of one file, or None if it cannot be decoded."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Pillow's EXIF / decompression warnings
            image = load_rgb(path)
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError):
        return None
    if image.size != (side, side):
        if fit == "crop":
            image = ImageOps.fit(image, (side, side), Image.Resampling.BILINEAR)
        else:
            image = image.resize((side, side), Image.Resampling.BILINEAR)
    return np.asarray(image).transpose(2, 0, 1)


def _decode_into(out: np.ndarray, paths: Sequence[str], side: int, fit: str, workers: int) -> list[int]:
    """Decode ``paths`` into the first rows of ``out``, unreadable ones left out; their indices."""
    skipped, kept = [], 0
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:  # Pillow decodes without the GIL
        for begin in range(0, len(paths), _CHUNK):
            chunk = paths[begin : begin + _CHUNK]
            for k, pixels in enumerate(pool.map(_decode_one, chunk, [side] * len(chunk), [fit] * len(chunk))):
                if pixels is None:
                    skipped.append(begin + k)
                else:
                    out[kept] = pixels
                    kept += 1
    return skipped


def _kept(labels: Sequence[int], skipped: Sequence[int]) -> list[int]:
    left_out = set(skipped)
    return [label for k, label in enumerate(labels) if k not in left_out]


def _check_args(side: int, fit: str) -> None:
    if side < 1:
        raise DataError(f"a decoded store's side must be >= 1 pixel, got {side}: pick one just above the "
                        f"training side (e.g. 48 for 32 px crops)")
    if fit not in FITS:
        raise DataError(f"unknown fit {fit!r} for a decoded store: use one of {', '.join(FITS)}")


def _header(root: str, split: str, side: int, fit: str, classes: list[str], labels: list[int],
            skipped: list[str], fingerprint: str) -> dict[str, Any]:
    return {"version": STORE_VERSION, "split": split, "source": root, "side": side, "fit": fit,
            "count": len(labels), "bytes": store_bytes(len(labels), side), "fingerprint": fingerprint,
            "classes": classes, "skipped": skipped, "labels": labels}


def decode_split(root: str | os.PathLike, split: str = "train", *, side: int, fit: str = "crop",
                 workers: int = 1) -> DecodedStore:
    """Decode ``root/split`` into a store held in memory (``store_bytes(N, side)`` of it)."""
    _check_args(side, fit)
    root = str(Path(root).expanduser().absolute())
    classes, paths, labels = list_split(root, split)
    fingerprint = source_fingerprint(root, split, paths)  # before decoding: a later change shows
    images = np.empty((len(paths), 3, side, side), dtype=np.uint8)
    skipped = _decode_into(images, paths, side, fit, workers)
    kept = _kept(labels, skipped)
    header = _header(root, split, side, fit, classes, kept, [_rel(paths[k], root) for k in skipped], fingerprint)
    return DecodedStore(images[: len(kept)], np.asarray(kept, dtype=np.int64), header)


def build_decoded_store(root: str | os.PathLike, out: str | os.PathLike, split: str = "train", *, side: int,
                        fit: str = "crop", workers: int = 1) -> DecodedStore:
    """Decode ``root/split`` into the folder ``out`` (``images.uint8`` + ``store.json``) and
    return it opened (memory-mapped).

    Written in a temporary folder beside ``out`` and renamed into place, so a reader never sees
    half a store. Raises :class:`DataError` for bad arguments, an ``out`` that exists already, or
    too little free space for ``store_bytes(N, side)`` (checked before decoding).
    """
    _check_args(side, fit)
    root = str(Path(root).expanduser().absolute())
    target = Path(out).expanduser().absolute()
    if target.exists():
        raise DataError(f"{target} exists already: remove it or pick another folder for the decoded store")
    classes, paths, labels = list_split(root, split)
    fingerprint = source_fingerprint(root, split, paths)
    size = store_bytes(len(paths), side)
    target.parent.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(target.parent).free
    if free < size:
        raise DataError(f"a decoded store of {len(paths)} images at {side} px needs {size / 1e9:.2f} GB, "
                        f"{target.parent} has {free / 1e9:.2f} GB free: free space, pick a smaller side or "
                        f"another folder")
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        pixels = tmp / PIXELS_NAME
        array = np.memmap(pixels, dtype=np.uint8, mode="w+", shape=(max(1, len(paths)), 3, side, side))
        skipped = _decode_into(array, paths, side, fit, workers)
        array.flush()
        del array
        kept = _kept(labels, skipped)
        os.truncate(pixels, store_bytes(len(kept), side))  # the skipped files' rows were never written
        header = _header(root, split, side, fit, classes, kept, [_rel(paths[k], root) for k in skipped],
                         fingerprint)
        (tmp / HEADER_NAME).write_text(json.dumps(header) + "\n")
        os.chmod(tmp, 0o755)
        os.rename(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return open_decoded_store(target)


def open_decoded_store(path: str | os.PathLike, *, source: str | os.PathLike | None = None,
                       side: int | None = None, fix: str | None = None) -> DecodedStore:
    """The store in folder ``path``, its pixels memory-mapped read-only.

    With ``source`` (the image folder it was built from), refuses a store whose source split's
    files changed since (added, removed, renamed, resized, rewritten); with ``side``, one of
    another side. Each refusal, and a missing, foreign or truncated store, is a one-line
    :class:`DataError` ending with ``fix``, what to do (default: rebuild the store).
    """
    folder = Path(path).expanduser().absolute()
    rebuild = fix or "rebuild it with largebatch.data.decoded_store.build_decoded_store"
    try:
        header = json.loads((folder / HEADER_NAME).read_text())
    except FileNotFoundError:
        raise DataError(f"{folder} is not a decoded store (no {HEADER_NAME}): {rebuild}") from None
    except (OSError, ValueError) as err:
        raise DataError(f"cannot read {folder / HEADER_NAME} ({err}): {rebuild}") from None
    if header.get("version") != STORE_VERSION:
        raise DataError(f"decoded store {folder} has format version {header.get('version')}, this "
                        f"version reads {STORE_VERSION}: {rebuild}")
    count, stored_side = int(header["count"]), int(header["side"])
    pixels = folder / PIXELS_NAME
    expected = store_bytes(count, stored_side)
    actual = pixels.stat().st_size if pixels.is_file() else -1
    if actual != expected:
        raise DataError(f"decoded store {folder}: {PIXELS_NAME} holds {actual} bytes, its header says "
                        f"{count} images at {stored_side} px ({expected} bytes): {rebuild}")
    if side is not None and side != stored_side:
        raise DataError(f"decoded store {folder} holds images at {stored_side} px, not {side}: "
                        f"build one at {side} px in another folder")
    if source is not None:
        now = source_fingerprint(source, header["split"])
        if now != header["fingerprint"]:
            raise DataError(f"decoded store {folder} was built from {header['source']}/{header['split']} as it "
                            f"was then (fingerprint {header['fingerprint']}), its files changed since "
                            f"({now}): {rebuild}")
    images: np.ndarray = (np.memmap(pixels, dtype=np.uint8, mode="r", shape=(count, 3, stored_side, stored_side))
                          if count else np.empty((0, 3, stored_side, stored_side), dtype=np.uint8))
    return DecodedStore(images, np.asarray(header["labels"], dtype=np.int64), header)
