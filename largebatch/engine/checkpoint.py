"""How a checkpoint's bytes reach disk and come back: complete or absent, data only, checked.

The checkpoint rooms: what is saved is :mod:`largebatch.engine.checkpoint_format` (and
:mod:`largebatch.engine.rng_state`); this module names the files and writes and reads their
bytes; which files are kept is :mod:`largebatch.engine.checkpoint_retention`; a run resumes
through :mod:`largebatch.engine.resume`.

A checkpoint is written to a temporary file in the same directory, flushed and fsynced, then
renamed over its final name (an atomic rename on POSIX) and the directory fsynced, so a run
killed at any moment leaves either the new checkpoint or none. SIGINT/SIGTERM arriving during
the write wait until it is done. A write that fails (disk full, quota, I/O error) removes its
temporary file, leaves the earlier checkpoints as they were and raises
:class:`CheckpointSaveError` naming the path, the errno and what is left to resume from (how
many earlier checkpoints and the newest's name, or that there is none).

A checkpoint holds tensors and plain Python values only (dicts, lists, tuples, numbers,
strings, None; the RNG states are stored as tensors and int tuples), so it is read with
``torch.load(weights_only=True)``: a file that holds anything else (a crafted pickle with a
``__reduce__`` payload, say) is refused without running any of it.

Each checkpoint carries the SHA-256 of the bytes ``torch.save`` wrote, hashed as they are
written, in the zip comment of the file (so the file stays a plain zip archive that
``torch.load`` and ``unzip`` read as before). Loading hashes the file again and refuses one
whose digest differs: a flipped bit in a tensor would otherwise load silently and surface
steps later as a non-finite loss. Checkpoints written before checksums load unverified, with
one log line.
"""

from __future__ import annotations

import contextlib
import errno as errno_codes
import hashlib
import logging
import os
import pickle
import re
import signal
import struct
import tempfile
import threading
from pathlib import Path
from typing import IO, Any, Iterator, Optional, cast

import torch

from largebatch.errors import STOP_SIGNALS, CheckpointError, CheckpointSaveError

__all__ = [
    "CheckpointError",
    "CheckpointSaveError",
    "checkpoint_name",
    "checkpoint_step",
    "is_readable",
    "verify_checksum",
    "list_checkpoints",
    "load_checkpoint",
    "save_checkpoint",
    "TEMP_GLOB",
]

log = logging.getLogger(__name__)

_NAME = re.compile(r"^ckpt-e(\d+)-s(\d+)\.pt$")
# what the temporary file of a write (save_checkpoint) matches until it is renamed into place
TEMP_GLOB = ".ckpt-*.tmp"

# The zip comment that carries the checksum: a fixed marker and the hex SHA-256 of the bytes
# torch.save wrote (whose end-of-central-directory record says "no comment").
_CHECKSUM_MARKER = b"largebatch-sha256:"
_CHECKSUM_LEN = len(_CHECKSUM_MARKER) + 64
_EOCD_SIGNATURE = b"PK\x05\x06"
_EOCD_SIZE = 22  # the record without its comment; its last 2 bytes are the comment length
_HASH_CHUNK = 8 << 20
_unverified_reported: set[str] = set()


def checkpoint_name(epoch: int, step: int) -> str:
    return f"ckpt-e{epoch:04d}-s{step:09d}.pt"


@contextlib.contextmanager
def _signals_deferred() -> Iterator[None]:
    """Hold SIGINT/SIGTERM until the block ends, then deliver them to the usual handlers.

    A checkpoint write interrupted by a second Ctrl-C would leave no checkpoint; deferred,
    the write completes and the signal then does what it would have done.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []
    previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}

    def hold(signum: int, frame: Any) -> None:
        pending.append(signum)

    for sig in previous:
        signal.signal(sig, hold)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        for signum in pending:
            log.warning("%s arrived during a checkpoint write; delivered now that it is complete",
                        signal.Signals(signum).name)
            signal.raise_signal(signum)


def _os_error(e: BaseException) -> Optional[OSError]:
    """The OSError behind ``e`` (torch.save wraps a failed write in a RuntimeError)."""
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, OSError):
            return e
        seen.add(id(e))
        e = e.__cause__ or e.__context__  # type: ignore[assignment]
    return None


class _HashingWriter:
    """A write-only file that hashes what passes through it and keeps the last record.

    Only what ``torch.save`` calls on a file object: ``write`` and ``flush``
    (``torch.serialization._open_zipfile_writer_buffer``).
    """

    def __init__(self, file: IO[bytes]) -> None:
        self.file = file
        self.sha256 = hashlib.sha256()
        self.tail = b""

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self.sha256.update(view)
        self.tail = (self.tail + bytes(view[-_EOCD_SIZE:]))[-_EOCD_SIZE:]
        return self.file.write(view)

    def flush(self) -> None:
        self.file.flush()


def _write_with_checksum(state: dict[str, Any], f: IO[bytes]) -> None:
    """``torch.save`` into ``f``, then append the SHA-256 of those bytes as the zip comment."""
    writer = _HashingWriter(f)
    # cast: torch.save's stub asks for a whole IO[bytes]; it calls write and flush only
    torch.save(state, cast(IO[bytes], writer))
    if not (writer.tail.startswith(_EOCD_SIGNATURE) and writer.tail[-2:] == b"\0\0"):
        raise RuntimeError("torch.save did not end its file with an end-of-central-directory record")
    comment = _CHECKSUM_MARKER + writer.sha256.hexdigest().encode()
    f.seek(-2, os.SEEK_END)
    f.write(struct.pack("<H", len(comment)) + comment)


def verify_checksum(path: str | os.PathLike) -> Optional[bool]:
    """True when ``path``'s bytes match the SHA-256 written with them; None when it carries
    none (written before checksums). A mismatch raises :class:`CheckpointError` naming the file."""
    with open(path, "rb") as f:
        size = f.seek(0, os.SEEK_END)
        if size < _EOCD_SIZE + _CHECKSUM_LEN:
            return None
        f.seek(size - 2 - _CHECKSUM_LEN)
        trailer = f.read(2 + _CHECKSUM_LEN)
        comment = trailer[2:]
        if struct.unpack("<H", trailer[:2])[0] != _CHECKSUM_LEN or not comment.startswith(_CHECKSUM_MARKER):
            return None
        digest = hashlib.sha256()
        f.seek(0)
        left = size - 2 - _CHECKSUM_LEN
        buffer = bytearray(min(_HASH_CHUNK, max(left, 1)))
        while left > 0:
            n = f.readinto(memoryview(buffer)[: min(left, len(buffer))])
            if not n:
                break
            digest.update(memoryview(buffer)[:n])
            left -= n
        digest.update(b"\0\0")  # the comment length as torch.save wrote it
    if digest.hexdigest().encode() != comment[len(_CHECKSUM_MARKER):]:
        raise CheckpointError(
            f"checkpoint {path} is damaged: its bytes do not match the SHA-256 written with it "
            f"(changed on disk or in a copy); it was not loaded: resume from another checkpoint "
            f"(resume=auto skips damaged ones)"
        )
    return True


def save_checkpoint(state: dict[str, Any], directory: str | os.PathLike, name: str) -> Path:
    """Atomically write ``state`` to ``directory/name`` (with its checksum); the path written.

    Raises :class:`CheckpointSaveError` when the write fails with an OSError. Which earlier
    checkpoints stay is :func:`largebatch.engine.checkpoint_retention.prune_checkpoints`'s call.
    """
    directory = Path(directory)
    final = directory / name
    with _signals_deferred():
        tmp: Optional[str] = None
        try:
            directory.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=directory)
            with os.fdopen(fd, "wb") as f:
                _write_with_checksum(state, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, final)
            tmp = None
            dir_fd = os.open(directory, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        except (OSError, RuntimeError) as e:
            os_error = _os_error(e)
            if os_error is None:
                raise
            code = os_error.errno
            name_of = errno_codes.errorcode.get(code, "?") if code is not None else "?"
            raise CheckpointSaveError(
                f"cannot write checkpoint {final}: [Errno {code} {name_of}] "
                f"{os_error.strerror or os_error}; free space (or raise the quota) on that disk, "
                f"then {_what_is_left(directory)}",
                path=final, errno=code,
            ) from None
        finally:
            if tmp is not None:
                Path(tmp).unlink(missing_ok=True)
    return final


def _what_is_left(directory: Path) -> str:
    """What a failed write leaves to resume from, for its message: the earlier checkpoints (how
    many, the newest's name) or none (a first save: nothing to resume from)."""
    try:
        earlier = list_checkpoints(directory)
    except OSError:
        earlier = []
    if not earlier:
        return "start the run again: no earlier checkpoint: this run has none to resume from"
    return (f"resume with resume=auto: the {len(earlier)} earlier checkpoint(s) are intact "
            f"(newest: {earlier[-1].name})")


def list_checkpoints(directory: str | os.PathLike) -> list[Path]:
    """Checkpoint files of ``directory``, oldest first (by step, then epoch)."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = []
    for p in directory.iterdir():
        m = _NAME.match(p.name)
        if m:
            found.append((int(m.group(2)), int(m.group(1)), p))
    return [p for _, _, p in sorted(found)]


def checkpoint_step(path: str | os.PathLike) -> int:
    """The step in a checkpoint's file name (-1 for a name ``checkpoint_name`` never makes)."""
    m = _NAME.match(Path(path).name)
    return int(m.group(2)) if m else -1


def _torch_load(path: str | os.PathLike, **kwargs: Any) -> Any:
    return torch.load(path, map_location="cpu", weights_only=True, **kwargs)


def is_readable(path: str | os.PathLike) -> bool:
    """True when ``path`` opens as a data-only checkpoint (memory-mapped: tensors not read)."""
    try:
        state = _torch_load(path, mmap=True)
    except Exception:  # noqa: BLE001 - any failure means "not usable"
        return False
    return isinstance(state, dict) and "model" in state


def load_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """Load a checkpoint onto the CPU (data only: nothing in the file is executed).

    A damaged file, or one holding Python objects a checkpoint never holds, raises
    ``CheckpointError``, and so does one whose bytes differ from the checksum written with it.
    """
    try:
        verified = verify_checksum(path)
        state = _torch_load(path)
    except CheckpointError:
        raise
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint {path} does not exist") from None
    except pickle.UnpicklingError as e:
        what = str(e).strip().splitlines()
        detail = next((ln for ln in what if "GLOBAL" in ln or "Unsupported" in ln), what[0] if what else "")
        raise CheckpointError(
            f"{path} is not a plain largebatch checkpoint: it holds Python objects a checkpoint "
            f"never holds ({detail.strip()[:160]}); it was not loaded (nothing in it ran): "
            f"remove it, or resume from a checkpoint this library wrote"
        ) from None
    except Exception as e:  # noqa: BLE001 - any other reading failure means a damaged file
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise CheckpointError(f"checkpoint {path} is damaged or truncated ({type(e).__name__}: {first})") from None
    if not isinstance(state, dict) or "model" not in state:
        raise CheckpointError(f"{path} is not a largebatch checkpoint (no model state)")
    if verified is None and os.fspath(path) not in _unverified_reported:
        _unverified_reported.add(os.fspath(path))
        log.warning("checkpoint %s carries no checksum (written before largebatch stored one); "
                    "loaded without verifying its bytes", path)
    return state
