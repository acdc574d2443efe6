"""Which checkpoints are kept: pruning to ``checkpoint.keep``, cleanup, a rollback's set-aside.

What is saved is :mod:`largebatch.engine.checkpoint_format`; the bytes reach disk (and come
back verified) through :mod:`largebatch.engine.checkpoint`, which also names and lists the
files; this module decides which of them stay; a run resumes through
:mod:`largebatch.engine.resume`.

Pruning (``keep``) counts usable checkpoints only (readable, and matching their checksum), so
damaged files never push a good one out, and the only good one is never deleted. A file
pruning cannot delete is a warning naming it (the new checkpoint is already written, and the
run goes on). Cleanup and the set-aside run only while no other process writes to the
directory (the run-directory lock, :mod:`largebatch.engine.run_dir`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from pathlib import Path
from typing import Optional

from largebatch.engine.checkpoint import TEMP_GLOB, checkpoint_step, is_readable, list_checkpoints, verify_checksum
from largebatch.errors import CheckpointError, os_error_text

__all__ = ["prune_checkpoints", "remove_orphaned_temp_files", "set_aside_newer"]

log = logging.getLogger(__name__)

# Files this process found usable when pruning, by (path, size, mtime): each is hashed once,
# not at every save (ResNet-50's 98 MiB state: ~70 ms of SHA-256 per file).
_usable_files: set[tuple[str, int, int]] = set()


def _usable(path: Path, *, written: bool = False) -> bool:
    """Readable and its bytes match its checksum (or it carries none): what pruning may count as
    kept. A bit-flipped file still opens as a zip, and resume=auto would skip it."""
    try:
        st = path.stat()
    except OSError:
        return False
    key = (os.fspath(path), st.st_size, st.st_mtime_ns)
    if key in _usable_files:
        return True
    if not written:
        try:
            verify_checksum(path)
        except (CheckpointError, OSError):
            return False
        if not is_readable(path):
            return False
    _usable_files.add(key)
    return True


def prune_checkpoints(directory: str | os.PathLike, keep: int, *, written: Path) -> None:
    """Keep the newest ``keep`` usable checkpoints of ``directory`` (``written``: the one just
    written, known good); damaged ones never count as kept, and are deleted once older than
    every kept one."""
    kept = 0
    for path in reversed(list_checkpoints(directory)):
        readable = _usable(path, written=path == written)
        if readable and kept < keep:
            kept += 1
            continue
        if readable or kept >= keep:  # older than every kept one (or beyond keep)
            try:
                path.unlink(missing_ok=True)
            except OSError as e:
                # The new checkpoint is written: a file left behind costs disk space, not the run.
                log.warning("cannot delete old checkpoint %s (checkpoint.keep=%d): %s; it stays: "
                            "delete it yourself, the run goes on", path, keep, os_error_text(e, path))
                continue
            if not readable:
                log.warning("removed damaged checkpoint %s (older than the %d kept)", path, keep)


def remove_orphaned_temp_files(directory: str | os.PathLike) -> tuple[int, int]:
    """Delete the temporary files of checkpoint writes that were killed: ``(files, bytes)``.

    Call only while no other process writes to ``directory`` (the run-directory lock).
    """
    directory = Path(directory)
    if not directory.is_dir():
        return 0, 0
    files = size = 0
    for path in directory.glob(TEMP_GLOB):
        with contextlib.suppress(OSError):
            size += path.stat().st_size
            path.unlink()
            files += 1
    return files, size


def set_aside_newer(directory: str | os.PathLike, step: int) -> Optional[tuple[Path, list[Path]]]:
    """Move the checkpoints of ``directory`` past ``step`` into ``abandoned-<time>/`` there.

    Returns ``(folder, moved files)``, or None when no checkpoint is newer than ``step``.
    Call only while no other process writes to ``directory`` (the run-directory lock).
    """
    directory = Path(directory)
    newer = [p for p in list_checkpoints(directory) if checkpoint_step(p) > step]
    if not newer:
        return None
    stamp = time.strftime("%Y%m%d-%H%M%S")
    folder, n = directory / f"abandoned-{stamp}", 1
    while folder.exists():
        n += 1
        folder = directory / f"abandoned-{stamp}-{n}"
    folder.mkdir()
    for path in newer:
        os.rename(path, folder / path.name)
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return folder, newer
