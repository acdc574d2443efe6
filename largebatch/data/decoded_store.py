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

* ``OUT/images.uint8``: the pixels, C order, NCHW (what ``roi_align`` reads), no header; written
  through the file into space allocated first, so a full disk is an ``OSError`` (exit 74), never
  a memory map's SIGBUS (:func:`build_decoded_store`);
* ``OUT/store.json``: ``version``, ``split``, ``source`` (the folder's absolute path), ``side``,
  ``fit``, ``count``, ``classes``, ``labels`` (one int per image), ``skipped`` (paths relative
  to the source), ``bytes`` and ``fingerprint``: the source split's file names, sizes and
  modification times (the data check's rule, :mod:`largebatch.data.check`). :func:`open_decoded_store`
  given the source refuses a store whose source changed since, in one line.
"""

from __future__ import annotations

import errno
import json
import os
import re
import secrets
import shutil
import signal
import socket
import threading
import warnings
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch
from PIL import Image, ImageOps

from largebatch.data.check import _fingerprint, _rel, _stat_key
from largebatch.data.images import list_split, load_rgb
from largebatch.errors import DataError, WriteError, os_error_text

__all__ = ["FITS", "HEADER_NAME", "PIXELS_NAME", "STORE_VERSION", "DecodedStore", "build_decoded_store",
           "decode_split", "open_decoded_store", "remove_stale_builds", "size_text", "source_fingerprint",
           "store_bytes"]

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


def size_text(count: int) -> str:
    """Bytes as people read them: ``55.3 kB``, ``35.9 MB``, ``98.4 GB``."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if count >= scale:
            return f"{count / scale:,.1f} {unit}"
    return f"{count} B"


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


def _decode_chunks(paths: Sequence[str], side: int, fit: str, workers: int,
                   sink: Callable[[np.ndarray], object]) -> list[int]:
    """Decode ``paths`` in order, handing ``sink`` the readable ones' pixels a chunk at a time
    (``(n, 3, side, side)`` uint8); the indices of the unreadable ones. The next chunk decodes
    while ``sink`` takes the last one."""
    skipped: list[int] = []
    pool = ThreadPoolExecutor(max_workers=max(1, workers))  # Pillow decodes without the GIL
    pending: deque[tuple[int, list[Future]]] = deque()
    try:
        for begin in range(0, len(paths), _CHUNK):
            pending.append((begin, [pool.submit(_decode_one, p, side, fit) for p in paths[begin : begin + _CHUNK]]))
            if len(pending) == 2 or begin + _CHUNK >= len(paths):
                while len(pending) > (0 if begin + _CHUNK >= len(paths) else 1):
                    first, futures = pending.popleft()
                    decoded = [f.result() for f in futures]
                    skipped += [first + k for k, pixels in enumerate(decoded) if pixels is None]
                    kept = [pixels for pixels in decoded if pixels is not None]
                    if kept:
                        sink(np.ascontiguousarray(np.stack(kept)))
    finally:  # a failing sink (a full disk) or a signal: the chunks not started are dropped
        pool.shutdown(wait=True, cancel_futures=True)
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
    filled = 0

    def into_memory(chunk: np.ndarray) -> None:
        nonlocal filled
        images[filled : filled + len(chunk)] = chunk
        filled += len(chunk)

    skipped = _decode_chunks(paths, side, fit, workers, into_memory)
    kept = _kept(labels, skipped)
    header = _header(root, split, side, fit, classes, kept, [_rel(paths[k], root) for k in skipped], fingerprint)
    return DecodedStore(images[: len(kept)], np.asarray(kept, dtype=np.int64), header)


def build_decoded_store(root: str | os.PathLike, out: str | os.PathLike, split: str = "train", *, side: int,
                        fit: str = "crop", workers: int = 1) -> DecodedStore:
    """Decode ``root/split`` into the folder ``out`` (``images.uint8`` + ``store.json``) and
    return it opened (memory-mapped).

    Written in a temporary folder beside ``out`` (``.<name>.tmp-<host>-<pid>-<random>``) and
    renamed into place, so a reader never sees half a store. The pixel file is allocated whole
    first (``posix_fallocate``) and written through the file, not through a memory map, so a disk
    that is or becomes full is an ``OSError`` (a memory map's page that cannot be backed is a
    SIGBUS instead). The temporary folder is removed on every failure, on Ctrl-C, and on SIGTERM
    or SIGHUP where they would kill the process (it then dies by the signal, as it would have);
    one left by a build that was killed (SIGKILL, a lost node) is removed by the next build in
    the same folder once its process is gone (:func:`remove_stale_builds`).

    Raises :class:`DataError` for bad arguments or an ``out`` that exists already, and
    :class:`~largebatch.errors.WriteError` (exit 74) for a folder that cannot be written or a
    disk that fills: one line with the store, its size, the errno and what to do.
    """
    _check_args(side, fit)
    root = str(Path(root).expanduser().absolute())
    target = Path(out).expanduser().absolute()
    if target.exists():
        raise DataError(f"{target} exists already: remove it or pick another folder for the decoded store")
    classes, paths, labels = list_split(root, split)
    fingerprint = source_fingerprint(root, split, paths)
    size = store_bytes(len(paths), side)
    what = f"{len(paths):,} images at {side} px, {size_text(size)}"
    tmp = target.parent / f".{target.name}.tmp-{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_builds(target.parent)
        free = shutil.disk_usage(target.parent).free
        if free < size:
            raise DataError(f"a decoded store of {len(paths)} images at {side} px needs {size / 1e9:.2f} GB, "
                            f"{target.parent} has {free / 1e9:.2f} GB free: free space, pick a smaller side or "
                            f"another folder")
        with _removed_unless_renamed(tmp):
            tmp.mkdir()
            pixels = tmp / PIXELS_NAME
            with open(pixels, "wb") as file:
                _allocate(file.fileno(), size)
                skipped = _decode_chunks(paths, side, fit, workers, lambda chunk: file.write(chunk.data))
                kept = _kept(labels, skipped)
                file.truncate(store_bytes(len(kept), side))  # the skipped files' rows were never written
                file.flush()
                os.fsync(file.fileno())  # a delayed allocation that fails shows here, not in a later read
            header = _header(root, split, side, fit, classes, kept, [_rel(paths[k], root) for k in skipped],
                             fingerprint)
            (tmp / HEADER_NAME).write_text(json.dumps(header) + "\n")
            os.chmod(tmp, 0o755)
            os.rename(tmp, target)
    except OSError as err:
        fix = ("free space, or set LARGEBATCH_CACHE to a folder with room for it" if err.errno in _NO_ROOM
               else "set LARGEBATCH_CACHE to a writable folder")
        raise WriteError(f"cannot write the decoded store {target} ({what}): {_errno_text(err, tmp)}; {fix}",
                         path=target, errno=err.errno) from None
    return open_decoded_store(target)


def _errno_text(err: OSError, tmp: Path) -> str:
    """``[Errno 28 ENOSPC] No space left on device``, after the file's name where it is not the
    store's own (``tmp``'s files are the store the message names already)."""
    text = os_error_text(err, tmp)
    if not err.filename or os.fspath(err.filename).startswith(os.fspath(tmp)):
        text = text.split(": ", 1)[1]
    if err.errno in (errno.EEXIST, errno.ENOTDIR):  # name the file that stands where a folder must be
        blocker = next((p for p in tmp.parents if p.exists()), None)
        if blocker is not None and not blocker.is_dir():
            text += f" ({blocker} is a file)"
    return text


_NO_ROOM = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def _allocate(fd: int, size: int) -> None:
    """Give the file ``size`` bytes of disk now, so a full disk fails here (ENOSPC), before any
    decoding. A file system that cannot preallocate is written through as it is: a full disk
    then fails the write that meets it, an ``OSError`` all the same."""
    if size <= 0:
        return
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as err:
        if err.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            raise


class _Stopped(BaseException):
    """A stop signal arrived while a store was being built (its temporary folder is removed)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@contextmanager
def _removed_unless_renamed(tmp: Path) -> Iterator[None]:
    """Remove ``tmp`` when the block fails or is interrupted (nothing once it was renamed away).
    SIGTERM and SIGHUP, where their handler is the default (the process would die and leave
    ``tmp``), first remove it, then kill the process by the same signal."""
    def stop(signum: int, frame: object) -> None:
        raise _Stopped(signum)

    previous = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGHUP):
            if signal.getsignal(sig) is signal.SIG_DFL:
                previous[sig] = signal.signal(sig, stop)
    try:
        yield
    except _Stopped as stopped:
        shutil.rmtree(tmp, ignore_errors=True)
        signal.signal(stopped.signum, signal.SIG_DFL)
        os.kill(os.getpid(), stopped.signum)  # dies by it, as without the handler
        raise
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        shutil.rmtree(tmp, ignore_errors=True)


# .<store>.tmp-<host>-<pid>-<6 hex>: build_decoded_store's temporary folder
_TMP_NAME = re.compile(r"^\..+\.tmp-(?P<host>.+)-(?P<pid>\d+)-[0-9a-f]{6}$")
_STORE_FILES = {PIXELS_NAME, HEADER_NAME}


def remove_stale_builds(folder: str | os.PathLike[str]) -> list[Path]:
    """Remove the temporary folders that builds of this host left in ``folder`` when they were
    killed (their process is gone); the folders removed. A live build's folder, another host's
    (a shared cache), and a folder holding anything but a store's files are left alone."""
    removed: list[Path] = []
    try:
        entries = list(os.scandir(str(folder)))
    except OSError:
        return removed
    host = socket.gethostname()
    for entry in entries:
        match = _TMP_NAME.match(entry.name)
        if match is None or match["host"] != host or _alive(int(match["pid"])) or not entry.is_dir(follow_symlinks=False):
            continue
        try:
            if set(os.listdir(entry.path)) <= _STORE_FILES:
                shutil.rmtree(entry.path)
                removed.append(Path(entry.path))
        except OSError:
            pass  # another build removing it too, or not ours to remove
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's
        return True
    return True


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
