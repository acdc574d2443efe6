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
* ``OUT/sources.sha256``: the first 16 bytes of the SHA-256 of each source file's bytes, in the
  split's listing order (zeros for a file that could not be read), 16 bytes a file: 20.5 MB for
  ImageNet's training split. Taken from the bytes the build reads to decode them: ~0.15 ms a
  file against the ~3-5 ms of its decode, 2-4% of a build;
* ``OUT/store.json``: ``version``, ``split``, ``source`` (the folder's absolute path), ``side``,
  ``fit``, ``count``, ``classes``, ``labels`` (one int per image) and ``labels_crc32``,
  ``skipped`` (paths relative to the source), ``bytes``, ``fingerprint``: the source split's file
  names, sizes and modification times (the data check's rule, :mod:`largebatch.data.check`),
  ``checksum``: a CRC-32 of each 16 MiB block of ``images.uint8`` (5,865 for ImageNet at 160 px;
  computed as it is written, ~1 minute of one core for its 98.4 GB), and ``sources``: the file
  count and the SHA-256 of ``sources.sha256``.

:func:`open_decoded_store` refuses, in one line, a store whose source changed since (the listing;
the content of a sample of files, which the listing cannot see where a file was rewritten with
its size and time kept) or whose data differ from their checksums: the labels, and the pixels
whole up to 256 MiB, 16 of their blocks above (~0.2 s from the page cache). ``verify="full"``
reads every block and every source file (``largebatch-make-decoded --check``).
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import random
import re
import secrets
import shutil
import signal
import socket
import threading
import warnings
import zlib
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterator, Literal, Sequence

import numpy as np
import torch
from PIL import Image, ImageOps

from largebatch.data.check import _fingerprint, _rel, _stat_key
from largebatch.data.images import list_split, load_rgb, special_file
from largebatch.errors import DataError, WriteError, os_error_text

__all__ = ["CHECK_BLOCK_BYTES", "FITS", "HEADER_NAME", "PIXELS_NAME", "SOURCES_NAME", "STORE_VERSION", "Verify",
           "DecodedStore", "build_decoded_store",
           "build_owner", "decode_split", "open_decoded_store", "remove_stale_builds", "size_text", "source_fingerprint",
           "store_bytes"]

STORE_VERSION = 2  # 2: checksums of the pixels and the labels, a content digest of every source file
HEADER_NAME = "store.json"
PIXELS_NAME = "images.uint8"
SOURCES_NAME = "sources.sha256"
CHECK_BLOCK_BYTES = 16 << 20  # the pixels' checksum is one CRC-32 per block of this many bytes
_DIGEST_BYTES = 16  # of each source file's SHA-256: a change is found with certainty, not a forger
_NO_DIGEST = bytes(_DIGEST_BYTES)  # a file that could not be read when the store was built
# What opening a store checks, where it checks (open_decoded_store's verify="sample"): a store up
# to this size whole, a larger one this many bytes of blocks (the first, the last and random ones),
# and this many of its source files, drawn at random: ~0.2 s where the pixels are in the page cache.
_OPEN_CHECK_BYTES = 256 << 20
_OPEN_CHECK_SOURCES = 32
Verify = Literal["none", "sample", "full"]
FITS = ("crop", "squash")
_CHUNK = 256  # images decoded per round of the thread pool (bounds the decoded images in flight)
_CHUNK_BYTES = 2**28  # ... and at most this many bytes of them a round (256 MiB: 5 images at 4096 px)


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


def _read_one(path: str, side: int, fit: str) -> tuple[np.ndarray | None, bytes]:
    """The pixels of one file (:func:`_decode_one`) and the digest of its bytes (all zero where
    it cannot be read): each file is read once, hashed and decoded from memory."""
    readable, data = _read_bytes(path)
    if not readable:
        return None, _NO_DIGEST
    return _decode_one(io.BytesIO(data), side, fit), _digest(data)


def _read_bytes(path: str) -> tuple[bool, bytes]:
    """Whether ``path`` could be read, and its bytes; a FIFO or device is not opened (the read
    could wait forever), as every loader leaves it."""
    if special_file(path) is not None:
        return False, b""
    try:
        with open(path, "rb") as file:
            return True, file.read()
    except OSError:
        return False, b""


def _digest(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()[:_DIGEST_BYTES]


def _decode_one(path: str | BinaryIO, side: int, fit: str) -> np.ndarray | None:
    """``(3, side, side)`` uint8 of one file, or None if it cannot be decoded."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Pillow's EXIF / decompression warnings
            image = load_rgb(path)  # type: ignore[arg-type]  # a file object: Pillow opens it
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError):
        return None
    if image.size != (side, side):
        if fit == "crop":
            image = ImageOps.fit(image, (side, side), Image.Resampling.BILINEAR)
        else:
            image = image.resize((side, side), Image.Resampling.BILINEAR)
    return np.asarray(image).transpose(2, 0, 1)


def _decode_chunks(paths: Sequence[str], side: int, fit: str, workers: int,
                   sink: Callable[[np.ndarray], object]) -> tuple[list[int], bytes]:
    """Decode ``paths`` in order, handing ``sink`` the readable ones' pixels a chunk at a time
    (``(n, 3, side, side)`` uint8); the indices of the unreadable ones, and the digests of every
    file's bytes (:func:`_read_one`), in order. The next chunk decodes while ``sink`` takes the
    last one."""
    skipped: list[int] = []
    digests = bytearray()
    pool = ThreadPoolExecutor(max_workers=max(1, workers))  # Pillow decodes without the GIL
    pending: deque[tuple[int, list[Future]]] = deque()
    # two rounds in flight: at a large side the round's images, not their count, are the bound
    chunk = max(1, min(_CHUNK, _CHUNK_BYTES // (3 * side * side)))
    try:
        for begin in range(0, len(paths), chunk):
            pending.append((begin, [pool.submit(_read_one, p, side, fit) for p in paths[begin : begin + chunk]]))
            if len(pending) == 2 or begin + chunk >= len(paths):
                while len(pending) > (0 if begin + chunk >= len(paths) else 1):
                    first, futures = pending.popleft()
                    decoded = []
                    for future in futures:
                        pixels, digest = future.result()
                        decoded.append(pixels)
                        digests += digest
                    skipped += [first + k for k, pixels in enumerate(decoded) if pixels is None]
                    kept = [pixels for pixels in decoded if pixels is not None]
                    if kept:
                        sink(np.ascontiguousarray(np.stack(kept)))
    finally:  # a failing sink (a full disk) or a signal: the chunks not started are dropped
        pool.shutdown(wait=True, cancel_futures=True)
    return skipped, bytes(digests)


class _BlockChecksums:
    """CRC-32 of each :data:`CHECK_BLOCK_BYTES` block of a stream written in pieces of any size."""

    def __init__(self) -> None:
        self.blocks: list[int] = []
        self._crc, self._filled = 0, 0

    def update(self, data: memoryview) -> None:
        data = data.cast("B")
        while len(data):
            take = min(len(data), CHECK_BLOCK_BYTES - self._filled)
            self._crc = zlib.crc32(data[:take], self._crc)
            self._filled += take
            data = data[take:]
            if self._filled == CHECK_BLOCK_BYTES:
                self.blocks.append(self._crc)
                self._crc, self._filled = 0, 0

    def finish(self) -> list[int]:
        if self._filled:
            self.blocks.append(self._crc)
            self._crc, self._filled = 0, 0
        return self.blocks


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
            "labels_crc32": _labels_crc(labels), "classes": classes, "skipped": skipped, "labels": labels}


def _labels_crc(labels: Sequence[int] | np.ndarray) -> int:
    return zlib.crc32(np.asarray(labels, dtype="<i8").tobytes())


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

    skipped, _ = _decode_chunks(paths, side, fit, workers, into_memory)
    kept = _kept(labels, skipped)
    header = _header(root, split, side, fit, classes, kept, [_rel(paths[k], root) for k in skipped], fingerprint)
    return DecodedStore(images[: len(kept)], np.asarray(kept, dtype=np.int64), header)


def build_decoded_store(root: str | os.PathLike, out: str | os.PathLike, split: str = "train", *, side: int,
                        fit: str = "crop", workers: int = 1) -> DecodedStore:
    """Decode ``root/split`` into the folder ``out`` (``images.uint8`` + ``store.json``) and
    return it opened (memory-mapped).

    Written in a temporary folder beside ``out`` (``.<name>.tmp-<owner>-<random>``, :func:`build_owner`) and
    renamed into place, so a reader never sees half a store. The pixel file is allocated whole
    first (``posix_fallocate``) and written through the file, not through a memory map, so a disk
    that is or becomes full is an ``OSError`` (a memory map's page that cannot be backed is a
    SIGBUS instead). The temporary folder is removed on every failure, on Ctrl-C, and on SIGTERM
    or SIGHUP where they would kill the process (it then dies by the signal, as it would have);
    one left by a build that was killed (SIGKILL, a lost node) is removed by the next build in
    the same folder once its process is gone (:func:`remove_stale_builds`).

    Raises :class:`DataError` for bad arguments or an ``out`` that exists already, and
    :class:`~largebatch.errors.WriteError` (exit 74) for a folder that cannot be written, too
    little free space for ``store_bytes(N, side)`` (checked before decoding) or a disk that
    fills: one line with the store, its size in the unit that fits it, the errno and what to do.
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
    tmp = target.parent / f".{target.name}.tmp-{build_owner()}-{secrets.token_hex(3)}"
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_builds(target.parent)
        free = shutil.disk_usage(target.parent).free
        if free < size:
            raise WriteError(f"no room for the decoded store {target}: {what}, and {target.parent} has "
                             f"{size_text(free)} free; free space, lower the side, or set LARGEBATCH_CACHE to a "
                             f"folder with room for it", path=target, errno=errno.ENOSPC)
        with _removed_unless_renamed(tmp):
            tmp.mkdir()
            pixels = tmp / PIXELS_NAME
            checksums = _BlockChecksums()

            def write(chunk: np.ndarray) -> None:
                file.write(chunk.data)
                checksums.update(chunk.data)

            with open(pixels, "wb") as file:
                _allocate(file.fileno(), size)
                skipped, digests = _decode_chunks(paths, side, fit, workers, write)
                kept = _kept(labels, skipped)
                file.truncate(store_bytes(len(kept), side))  # the skipped files' rows were never written
                file.flush()
                os.fsync(file.fileno())  # a delayed allocation that fails shows here, not in a later read
            (tmp / SOURCES_NAME).write_bytes(digests)
            header = _header(root, split, side, fit, classes, kept, [_rel(paths[k], root) for k in skipped],
                             fingerprint)
            header["checksum"] = {"crc32": checksums.finish(), "block_bytes": CHECK_BLOCK_BYTES}
            header["sources"] = {"files": len(paths), "sha256": hashlib.sha256(digests).hexdigest()}
            (tmp / HEADER_NAME).write_text(json.dumps(header) + "\n")
            os.chmod(tmp, 0o755)
            os.rename(tmp, target)
    except OSError as err:
        fix = ("free space, or set LARGEBATCH_CACHE to a folder with room for it" if err.errno in _NO_ROOM
               else "set LARGEBATCH_CACHE to a writable folder")
        raise WriteError(f"cannot write the decoded store {target} ({what}): {_errno_text(err, tmp)}; {fix}",
                         path=target, errno=err.errno) from None
    return open_decoded_store(target, verify="none")  # just written and synced


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


# .<store>.tmp-<host>-<pid namespace>-<pid>-<6 hex>: build_decoded_store's temporary folder
_TMP_NAME = re.compile(r"^\..+\.tmp-(?P<owner>.+-\d+)-(?P<pid>\d+)-[0-9a-f]{6}$")


def build_owner() -> str:
    """``<host>-<pid namespace>-<pid>``: whose a temporary store folder is. The namespace tells
    two containers of one host name apart (with the host's network they share it), whose pids
    mean different processes; 0 where the system has none."""
    try:
        namespace = int(os.readlink("/proc/self/ns/pid").split("[")[1].rstrip("]"))
    except (OSError, IndexError, ValueError):
        namespace = 0
    return f"{socket.gethostname()}-{namespace}-{os.getpid()}"
_STORE_FILES = {PIXELS_NAME, HEADER_NAME, SOURCES_NAME}


def remove_stale_builds(folder: str | os.PathLike[str]) -> list[Path]:
    """Remove the temporary folders that builds of this host left in ``folder`` when they were
    killed (their process is gone); the folders removed. A live build's folder, another host's
    or container's (a shared cache), and a folder holding anything but a store's files are left
    alone."""
    removed: list[Path] = []
    try:
        entries = list(os.scandir(str(folder)))
    except OSError:
        return removed
    ours = build_owner().rsplit("-", 1)[0]  # host and pid namespace
    for entry in entries:
        match = _TMP_NAME.match(entry.name)
        if match is None or match["owner"] != ours or _alive(int(match["pid"])) or not entry.is_dir(follow_symlinks=False):
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
                       side: int | None = None, fix: str | None = None, verify: Verify = "sample") -> DecodedStore:
    """The store in folder ``path``, its pixels memory-mapped read-only.

    With ``source`` (the image folder it was built from), refuses a store whose source split's
    files changed since (added, removed, renamed, resized, rewritten: a listing with a ``stat``
    per file); with ``side``, one of another side. ``verify`` checks the data against the
    checksums written with it: ``"sample"`` (the default, cheap) the labels, the whole pixel file
    up to 256 MiB and 16 blocks of 16 MiB of a larger one, and with ``source`` the content of 32
    source files drawn at random (a file rewritten with its size and time kept); ``"full"`` every
    block and every source file (``largebatch-make-decoded --check``: a read of the store and of
    the data set); ``"none"`` nothing. Each refusal, and a missing, foreign, truncated or
    corrupted store, is a one-line :class:`DataError` ending with ``fix``, what to do (default:
    rebuild the store).
    """
    folder = Path(path).expanduser().absolute()
    rebuild = fix or "rebuild it with largebatch.data.decoded_store.build_decoded_store"
    header = _read_header(folder, rebuild)
    count, stored_side = header["count"], header["side"]
    pixels = folder / PIXELS_NAME
    expected = store_bytes(count, stored_side)
    actual = pixels.stat().st_size if pixels.is_file() else -1
    if actual != expected:
        raise DataError(f"decoded store {folder}: {PIXELS_NAME} holds {actual} bytes, its header says "
                        f"{count} images at {stored_side} px ({expected} bytes): {rebuild}")
    if side is not None and side != stored_side:
        raise DataError(f"decoded store {folder} holds images at {stored_side} px, not {side}: "
                        f"build one at {side} px in another folder")
    labels = np.asarray(header["labels"], dtype=np.int64)
    if verify != "none":
        if _labels_crc(labels) != header["labels_crc32"]:
            raise DataError(f"decoded store {folder} is corrupted: its labels differ from what was written: {rebuild}")
        _verify_pixels(folder, header, full=verify == "full", rebuild=rebuild)
    if source is not None:
        root = str(Path(source).expanduser().absolute())
        _, paths, _ = list_split(root, header["split"])
        now = source_fingerprint(root, header["split"], paths)
        if now != header["fingerprint"]:
            raise DataError(f"decoded store {folder} was built from {header['source']}/{header['split']} as it "
                            f"was then (fingerprint {header['fingerprint']}), its files changed since "
                            f"({now}): {rebuild}")
        if verify != "none":
            _verify_sources(folder, header, paths, full=verify == "full", rebuild=rebuild)
    images: np.ndarray = (np.memmap(pixels, dtype=np.uint8, mode="r", shape=(count, 3, stored_side, stored_side))
                          if count else np.empty((0, 3, stored_side, stored_side), dtype=np.uint8))
    return DecodedStore(images, labels, header)


# A header's fields and their types, checked before any is used (a header written by hand or
# damaged is one line, not a KeyError).
_HEADER_FIELDS: dict[str, type] = {
    "split": str, "source": str, "side": int, "count": int, "bytes": int, "fingerprint": str, "labels_crc32": int,
    "classes": list, "skipped": list, "labels": list, "checksum": dict, "sources": dict,
}


def _read_header(folder: Path, rebuild: str) -> dict[str, Any]:
    """The header of the store in ``folder``, its fields checked; one line where it cannot be used."""
    try:
        header = json.loads((folder / HEADER_NAME).read_text())
    except FileNotFoundError:
        raise DataError(f"{folder} is not a decoded store (no {HEADER_NAME}): {rebuild}") from None
    except (OSError, ValueError) as err:
        raise DataError(f"cannot read {folder / HEADER_NAME} ({err}): {rebuild}") from None
    if not isinstance(header, dict):
        raise DataError(f"{folder / HEADER_NAME} is not a decoded store's header (a JSON object): {rebuild}")
    if header.get("version") != STORE_VERSION:
        raise DataError(f"decoded store {folder} has format version {header.get('version')}, this "
                        f"version reads {STORE_VERSION}: {rebuild}")
    for key, kind in _HEADER_FIELDS.items():
        if not isinstance(header.get(key), kind) or isinstance(header.get(key), bool):
            raise DataError(f"{folder / HEADER_NAME} has no valid {key!r}: the store is damaged: {rebuild}")
    if (header["count"] < 0 or header["side"] < 1 or len(header["labels"]) != header["count"]
            or header["bytes"] != store_bytes(header["count"], header["side"])):
        raise DataError(f"{folder / HEADER_NAME} says {header['count']} images at {header['side']} px and holds "
                        f"{len(header['labels'])} labels: the store is damaged: {rebuild}")
    return header


def _verify_pixels(folder: Path, header: dict[str, Any], *, full: bool, rebuild: str) -> None:
    """Check the pixel file's blocks against their CRC-32s (every one, or :data:`_OPEN_CHECK_BYTES`
    of them); a block that differs is one line naming its bytes."""
    checksum = header["checksum"]
    blocks, size, total = checksum.get("crc32"), checksum.get("block_bytes"), header["bytes"]
    if not isinstance(size, int) or size <= 0 or not isinstance(blocks, list) or len(blocks) != -(-total // size):
        raise DataError(f"{folder / HEADER_NAME} has no valid 'checksum': the store is damaged: {rebuild}")
    which: Sequence[int] = range(len(blocks))
    if not full and total > _OPEN_CHECK_BYTES:
        picked = random.Random().sample(range(1, len(blocks) - 1), _OPEN_CHECK_BYTES // size - 2)
        which = [0, *sorted(picked), len(blocks) - 1]
    with open(folder / PIXELS_NAME, "rb") as file:
        for k in which:
            file.seek(k * size)
            if zlib.crc32(file.read(size)) != blocks[k]:
                end = min(total, (k + 1) * size)
                raise DataError(f"decoded store {folder} is corrupted: bytes {k * size:,} to {end:,} of {PIXELS_NAME} "
                                f"differ from what was written: {rebuild}")


def _verify_sources(folder: Path, header: dict[str, Any], paths: Sequence[str], *, full: bool,
                    rebuild: str) -> None:
    """Check the source files' content against the digests taken when they were decoded (every
    one, or :data:`_OPEN_CHECK_SOURCES` drawn at random): a listing's sizes and times cannot see a
    file rewritten with both kept."""
    try:
        digests = (folder / SOURCES_NAME).read_bytes()
    except OSError as err:
        raise DataError(f"cannot read {folder / SOURCES_NAME} ({err}): {rebuild}") from None
    if (len(digests) != _DIGEST_BYTES * len(paths) or header["sources"].get("files") != len(paths)
            or hashlib.sha256(digests).hexdigest() != header["sources"].get("sha256")):
        raise DataError(f"decoded store {folder} is corrupted: {SOURCES_NAME} differs from what was written: "
                        f"{rebuild}")
    which: Sequence[int] = range(len(paths))
    if not full and len(paths) > _OPEN_CHECK_SOURCES:
        which = random.Random().sample(range(len(paths)), _OPEN_CHECK_SOURCES)
    for k in which:
        stored = digests[k * _DIGEST_BYTES : (k + 1) * _DIGEST_BYTES]
        if stored == _NO_DIGEST:  # unreadable then: left out of the store and named in its header
            continue
        readable, data = _read_bytes(paths[k])
        if not readable or _digest(data) != stored:
            raise DataError(f"decoded store {folder} was built from {paths[k]} as it was then, its content changed "
                            f"since (its size and modification time did not): {rebuild}")
