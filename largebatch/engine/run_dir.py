"""The run directory: chosen once per job, locked while a run uses it, cleaned at start.

Rank 0 creates the directory and every rank gets the same path. Rank 0 then takes an
exclusive lock on ``<run_dir>/.lock`` (a POSIX record lock, ``fcntl.lockf``: it also works on
NFS, and forked DataLoader workers do not inherit it, so it dies with its process; the file
names the owner's host and pid) and holds it until the run ends, so a second run on the same directory stops with one
line naming the owner instead of interleaving checkpoints and logs. The ranks of one torchrun
job share rank 0's lock. The kernel drops the lock when its process dies, so the lock of a
killed run (a torchrun restart, a SIGKILL) is taken over, with a log line naming the old owner.
With the lock held, the temporary files of killed checkpoint writes are removed.

``resume=auto`` without ``run_dir=`` continues the newest unfinished run under ``output_root``
whose configuration is this one's (:func:`unfinished_run`: any folder name, so ``runs/rn50`` or
``runs/slurm-<jobid>`` as much as ``<time>-<model>``), as Lightning's ``ckpt_path="last"`` and the
HF Trainer's ``resume_from_checkpoint=True`` do, and says which in one line; with none it starts
a new run and says so.
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

__all__ = ["RunDir", "RunDirError", "RunDirLock", "elastic_run_id", "live_owner", "make_run_dir", "unfinished_run"]

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


def _finished(run: Path, newest_checkpoint: Path) -> bool:
    """A run ended its plan: its summary.json, written after its newest checkpoint, names no stop
    reason (a preempted, stopped or ``max_steps`` run does; a killed one wrote none since)."""
    summary = run / "summary.json"
    try:
        if summary.stat().st_mtime < newest_checkpoint.stat().st_mtime:
            return False
        return json.loads(summary.read_text(encoding="utf-8")).get("stop_reason") is None
    except (OSError, ValueError, AttributeError):
        return False


def _run_config(run: Path) -> Optional[dict[str, Any]]:
    """A run directory's config.yaml as a plain, resolved dict; None when it cannot be read."""
    from omegaconf import OmegaConf

    try:
        config = OmegaConf.to_container(OmegaConf.load(run / "config.yaml"), resolve=True)
    except Exception:  # noqa: BLE001 - any unreadable config: not a run this one can continue
        return None
    return config if isinstance(config, dict) else None


def unfinished_run(output_root: Path, config: Optional[dict[str, Any]]) -> tuple[Optional[Path], int]:
    """The run directory a bare ``resume=auto`` continues: among the folders of ``output_root``
    (any name) with a checkpoint, not finished (:func:`_finished`), not in use by a live run,
    and whose config.yaml is ``config`` in every key its result depends on (``RUN_KEYS`` and the
    global batch, as a resume checks), the one whose newest checkpoint is newest. Returns it
    (None: none) and how many unfinished runs there have another configuration."""
    from largebatch.engine.checkpoint import list_checkpoints
    from largebatch.engine.resume import run_key_differences

    if config is None or not output_root.is_dir():
        return None, 0
    matching: list[tuple[float, Path]] = []
    others = 0
    for run in output_root.iterdir():
        checkpoints = list_checkpoints(run / "checkpoints") if run.is_dir() else []
        if not checkpoints or _finished(run, checkpoints[-1]) or live_owner(run) is not None:
            continue
        if run_key_differences(_run_config(run) or {"config.yaml": "unreadable"}, config, ("global_batch_size",)):
            others += 1
            continue
        matching.append((checkpoints[-1].stat().st_mtime, run))
    return (max(matching)[1] if matching else None), others


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


def _bare_auto_note(found: Optional[Path], chosen: Path, others: int, output_root: str) -> str:
    """The one line a bare ``resume=auto`` logs: the run it continues, or that there was none."""
    if found is not None:
        return (f"resume=auto: continuing {chosen}, the newest unfinished run of this configuration under "
                f"{output_root} (run_dir= names another)")
    other = (f"; {others} unfinished run(s) there have another configuration: add run_dir=<one of them> to "
             f"continue it with its own values") if others else ""
    return f"resume=auto: no unfinished run of this configuration under {output_root}: a new run in {chosen}{other}"


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
    config: Optional[dict[str, Any]] = None,
) -> RunDir:
    """Rank 0 creates and locks the run directory and removes orphaned checkpoint temp files;
    every rank gets the same path. ``resume=auto`` without ``run_dir`` takes the newest
    unfinished run of ``config`` (the run's composed config as a plain dict) under
    ``output_root`` (:func:`unfinished_run`). Raises :class:`RunDirError` (unwritable, or locked)."""
    # imported here: largebatch-report reads the lock (live_owner) without loading torch
    from largebatch.engine.checkpoint_retention import remove_orphaned_temp_files

    path: Optional[str] = None
    error: Optional[str] = None
    lock: Optional[RunDirLock] = None
    notes: list[str] = []
    if backend.is_main:
        target = Path(run_dir or output_root)  # the file or folder being written, for the message
        try:
            bare_auto = resume == "auto" and not run_dir and not elastic_run_id()
            found, others = unfinished_run(Path(output_root), config) if bare_auto else (None, 0)
            chosen = target = found or _choose(run_dir, output_root, model_name)
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
            if bare_auto:
                notes.append(_bare_auto_note(found, chosen, others, output_root))
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
