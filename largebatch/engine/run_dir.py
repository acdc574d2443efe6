"""The run directory: chosen once per job, locked while a run uses it, cleaned at start.

Rank 0 creates the directory and every rank gets the same path. Rank 0 then takes an
exclusive lock on ``<run_dir>/.lock`` (a POSIX record lock, ``fcntl.lockf``: it also works on
NFS, and forked DataLoader workers do not inherit it, so it dies with its process; the file
names the owner's host and pid) and holds it until the run ends, so a second run on the same directory stops with one
line naming the owner instead of interleaving checkpoints and logs. The ranks of one torchrun
job share rank 0's lock. The kernel drops the lock when its process dies, so the lock of a
killed run (a torchrun restart, a SIGKILL) is taken over, with a log line naming the old owner.
With the lock held, the temporary files of killed checkpoint writes are removed.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from largebatch.errors import RunDirError, os_error_text

if TYPE_CHECKING:
    from largebatch.backends.base import Backend

__all__ = ["RunDir", "RunDirError", "RunDirLock", "elastic_run_id", "live_owner", "make_run_dir", "newest_run_dir"]

LOCK_NAME = ".lock"


def elastic_run_id() -> Optional[str]:
    """torchrun's job id (``--rdzv-id``; a fresh id per ``--standalone`` launch), if any."""
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", "")
    return run_id if run_id and run_id != "none" else None


class RunDirLock:
    """An exclusive ``lockf`` lock on ``<run_dir>/.lock`` holding ``{"host", "pid"}`` of the owner.

    ``previous`` is the owner a stale lock named (a process that died holding it), else None.
    """

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / LOCK_NAME
        self.previous: Optional[dict[str, Any]] = None
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno not in (errno.EACCES, errno.EAGAIN):
                os.close(fd)
                raise
            owner = _read_owner(fd)
            os.close(fd)
            who = f"host {owner.get('host', '?')}, pid {owner.get('pid', '?')}" if owner else "another process"
            raise RunDirError(
                f"run directory {run_dir} is in use by a live run ({who}); wait for it to end, "
                f"stop it, or use another run_dir"
            ) from None
        self.previous = _read_owner(fd) or None
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"host": socket.gethostname(), "pid": os.getpid(),
                                  "since": time.strftime("%Y-%m-%dT%H:%M:%S")}).encode(), 0)
        os.fsync(fd)
        self._fd: Optional[int] = fd

    def release(self) -> None:
        """Empty the file (a clean end leaves no owner behind) and drop the lock."""
        if self._fd is None:
            return
        try:
            os.ftruncate(self._fd, 0)
        finally:
            fcntl.lockf(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


def live_owner(run_dir: str | os.PathLike) -> Optional[dict[str, Any]]:
    """The owner (``{"host", "pid", "since"}``, or ``{}`` when unreadable) of the lock a live run
    holds on ``run_dir``, or None when no process holds it (the run ended, or was killed).

    Asks with a shared lock of its own, taken and dropped at once (a read-only run directory
    does), so it needs no write access. Call it from a process that does not hold the lock:
    closing any file of a POSIX lock drops that process's locks on it.
    """
    try:
        fd = os.open(Path(run_dir) / LOCK_NAME, os.O_RDONLY)
    except OSError:
        return None  # no lock file: never run, or not a run directory of this version
    try:
        try:
            fcntl.lockf(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno in (errno.EACCES, errno.EAGAIN):
                return _read_owner(fd)
            return None
        fcntl.lockf(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def _read_owner(fd: int) -> dict[str, Any]:
    try:
        raw = os.pread(fd, 4096, 0)
        owner = json.loads(raw.decode()) if raw.strip() else {}
    except (OSError, ValueError):
        return {}
    return owner if isinstance(owner, dict) else {}


@dataclass
class RunDir:
    """The run directory of this job: ``path`` (every rank), ``lock`` (rank 0 only) and
    ``notes``: lines rank 0 logs once logging writes into the run directory."""

    path: Path
    lock: Optional[RunDirLock] = None
    notes: list[str] = field(default_factory=list)

    def release(self) -> None:
        if self.lock is not None:
            self.lock.release()
            self.lock = None


def newest_run_dir(output_root: Path, model_name: str, *, exclude: Optional[Path] = None) -> Optional[Path]:
    """The most recently modified run directory of ``model_name`` under ``output_root``."""
    if not output_root.is_dir():
        return None
    runs = [
        p for p in output_root.iterdir()
        if p.is_dir() and (p.name.endswith(f"-{model_name}") or f"-{model_name}-" in p.name
                           or p.name.startswith(f"{model_name}-"))
        and (exclude is None or p.resolve() != exclude.resolve())
        and (p / "checkpoints").is_dir()
    ]
    return max(runs, key=lambda p: p.stat().st_mtime) if runs else None


def _choose(run_dir: Optional[str], output_root: str, model_name: str) -> Path:
    if run_dir:
        return Path(run_dir)
    if elastic_run_id():
        # Every restart of a torchrun job must find the same directory (to resume).
        return Path(output_root) / f"{model_name}-{elastic_run_id()}"
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = Path(output_root) / f"{stamp}-{model_name}"
    n = 1
    while path.exists():
        n += 1
        path = Path(output_root) / f"{stamp}-{model_name}-{n}"
    return path


def _permission_hint(e: OSError) -> str:
    """What a permission error on the run directory most often means: a folder mounted into a
    container that Docker created for the mount, owned by root, while the job runs as a user."""
    if e.errno not in (errno.EACCES, errno.EPERM):
        return ""
    return (f" owned by this user (uid {os.getuid()}); in a container, a folder given with -v that did "
            "not exist yet was created by Docker and belongs to root: create it first (mkdir -p runs) and "
            'add --user "$(id -u):$(id -g)" to docker run')


def make_run_dir(
    *, run_dir: Optional[str], output_root: str, model_name: str, resume: Optional[str], backend: Backend,
) -> RunDir:
    """Rank 0 creates and locks the run directory and removes orphaned checkpoint temp files;
    every rank gets the same path. Raises :class:`RunDirError` (unwritable, or locked)."""
    # imported here: largebatch-report reads the lock (live_owner) without loading torch
    from largebatch.engine.checkpoint_retention import remove_orphaned_temp_files

    path: Optional[str] = None
    error: Optional[str] = None
    lock: Optional[RunDirLock] = None
    notes: list[str] = []
    if backend.is_main:
        target = Path(run_dir or output_root)  # the file or folder being written, for the message
        try:
            chosen = target = _choose(run_dir, output_root, model_name)
            chosen.mkdir(parents=True, exist_ok=True)
            probe = target = chosen / ".write-test"
            probe.write_text("ok")
            probe.unlink()
            target = chosen
            lock = RunDirLock(chosen)
            if lock.previous:
                notes.append(
                    f"run directory lock of host {lock.previous.get('host', '?')} pid "
                    f"{lock.previous.get('pid', '?')} was stale (that process is gone); taken over")
            files, size = remove_orphaned_temp_files(chosen / "checkpoints")
            if files:
                notes.append(f"removed {files} temporary file(s) ({size / 2**20:.1f} MiB) of "
                             f"interrupted checkpoint writes from {chosen / 'checkpoints'}")
            if resume == "auto" and not run_dir and not elastic_run_id():
                newest = newest_run_dir(Path(output_root), model_name, exclude=chosen)
                hint = (f"; the newest run of {model_name} under {output_root} is {newest}: "
                        f"add run_dir={newest} to continue it") if newest else (
                        f"; no earlier run of {model_name} under {output_root}")
                notes.append(f"resume=auto without run_dir=: this is a new run in {chosen}{hint}")
            path = str(chosen.resolve())
        except RunDirError as e:
            error = str(e)
        except OSError as e:
            error = (
                f"cannot write the run directory ({os_error_text(e, target)}); "
                f"set run_dir= or output_root= to a writable folder{_permission_hint(e)}"
            )
    path, error = backend.broadcast_object((path, error))
    if error:
        raise RunDirError(error)
    return RunDir(Path(path), lock, notes)
