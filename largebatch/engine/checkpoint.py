"""Checkpoints that are complete or absent.

A checkpoint is written to a temporary file in the same directory, flushed and fsynced, then
renamed over its final name (an atomic rename on POSIX) and the directory fsynced, so a run
killed at any moment leaves either the new checkpoint or none. ``load_latest`` walks the
checkpoints newest first and skips (and reports) one that cannot be read.
"""

from __future__ import annotations

import logging
import os
import random
import re
import tempfile
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

__all__ = [
    "CheckpointError",
    "capture_rng_state",
    "checkpoint_name",
    "list_checkpoints",
    "load_checkpoint",
    "load_latest",
    "restore_rng_state",
    "save_checkpoint",
]

log = logging.getLogger(__name__)

_NAME = re.compile(r"^ckpt-e(\d+)-s(\d+)\.pt$")


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be read or does not fit the run."""


def checkpoint_name(epoch: int, step: int) -> str:
    return f"ckpt-e{epoch:04d}-s{step:09d}.pt"


def save_checkpoint(state: dict[str, Any], directory: str | os.PathLike, name: str, *, keep: int = 0) -> Path:
    """Atomically write ``state`` to ``directory/name``; keep the newest ``keep`` (0: all)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / name
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    if keep > 0:
        for old in list_checkpoints(directory)[:-keep]:
            old.unlink(missing_ok=True)
    return final


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


def load_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """Load a checkpoint onto the CPU; a damaged file raises ``CheckpointError``."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint {path} does not exist") from None
    except Exception as e:  # noqa: BLE001 - any unpickling failure means a damaged file
        raise CheckpointError(f"checkpoint {path} is damaged or truncated ({type(e).__name__}: {e})") from None
    if not isinstance(state, dict) or "model" not in state:
        raise CheckpointError(f"{path} is not a largebatch checkpoint (no model state)")
    return state


def load_latest(directory: str | os.PathLike) -> Optional[tuple[Path, dict[str, Any]]]:
    """The newest readable checkpoint of ``directory`` (damaged newer ones are reported)."""
    for path in reversed(list_checkpoints(directory)):
        try:
            return path, load_checkpoint(path)
        except CheckpointError as e:
            log.warning("%s; falling back to the previous checkpoint", e)
    return None


def capture_rng_state() -> dict[str, Any]:
    """Python, NumPy, torch CPU and (where present) CUDA generator states."""
    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
