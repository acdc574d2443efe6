"""What a checkpoint holds: one versioned record, written and read here only.

Saved by :mod:`largebatch.engine.checkpoint` (the bytes, atomic and checksummed), kept by
:mod:`largebatch.engine.checkpoint_retention`, resumed by :mod:`largebatch.engine.resume`.

A checkpoint file holds one flat dict of plain values, :meth:`RunCheckpoint.to_state`; :meth:`RunCheckpoint.from_state`
reads it back, from this format or an older one. Its parts:

==================  ==========================================================================
``model``           the plain module's state dict (no DDP / ``torch.compile`` key prefixes)
``optimizer``       ``optimizer.state_dict()``
``scheduler``       the LR schedule's ``state_dict()``
``scaler``          the fp16 loss scaler's ``state_dict()``, or None
``train_state``     the loop state (``largebatch.engine.loop.TrainState``: epoch, step, data
                    position, skipped steps, evaluations, training time)
``rng``             Python, NumPy, torch and device generator states
                    (:mod:`largebatch.engine.rng_state` captures and restores them)
``ema``             the weight EMA's module state (``ema.enabled``), else absent
``noise_scale``     the gradient noise scale's averages (``GradientNoiseScale.state_dict``),
                    where the run measured it, else absent (older files: absent)
``world_size``,     the run's shape when it was written: a resume must have the same global
``global_batch_size``, batch and epoch length (the world size may change)
``accumulation_steps``, ``steps_per_epoch``
``model_name``,     what the run says about itself (:class:`RunIdentity`): the timm model, the
``config``,         composed config as a plain dict, and what the run resolved (sizes, lr,
``resolved``        precision, class count: summary.json's settings)
``version``         the largebatch version that wrote it
``format``          :data:`FORMAT`
==================  ==========================================================================

Formats: 1 (largebatch up to 0.x of 2026-11, no ``format`` key): the parts above; 2: the
same parts and ``format``. A file of a newer format than this code knows is refused with one
line naming the version that wrote it. Only ``model`` is required to read a file (a
weights-only file loads for inspection); :meth:`RunCheckpoint.missing_parts` says what a
run needs to continue from it.
"""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

from largebatch import __version__
from largebatch.errors import CheckpointError

__all__ = ["FORMAT", "RUN_PARTS", "RunCheckpoint", "RunIdentity", "to_plain"]

FORMAT = 2

# the parts a run continues from (the model besides); a file without them holds weights only
RUN_PARTS = ("optimizer", "scheduler", "train_state", "rng")

_SHAPE = ("world_size", "global_batch_size", "accumulation_steps", "steps_per_epoch")


def to_plain(value: Any) -> Any:
    """``value`` with Enums turned into their values and paths into strings (recursively).

    What ``torch.load(weights_only=True)`` can read back: tensors, dicts, lists, tuples,
    numbers, strings, None.
    """
    if isinstance(value, enum.Enum):
        return to_plain(value.value)
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, dict):
        return {to_plain(k): to_plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [to_plain(v) for v in value]
    if isinstance(value, tuple):  # a namedtuple becomes a plain tuple
        return tuple(to_plain(v) for v in value)
    if isinstance(value, np.ndarray):
        return torch.from_numpy(value.copy())
    if isinstance(value, np.generic):
        return value.item()
    return value


@dataclass(frozen=True)
class RunIdentity:
    """What a run writes about itself into each checkpoint (and summary.json: ``resolved``).

    ``model_name``: the timm model; ``config``: the composed config as a plain dict (None
    where ``run`` got no raw config); ``resolved``: the sizes, lr, precision and class count
    the run resolved. A file of another program may lack all three (None / empty).
    """

    model_name: Optional[str] = None
    config: Optional[dict[str, Any]] = None
    resolved: dict[str, Any] = field(default_factory=dict)

    @property
    def optimizer_name(self) -> Optional[str]:
        """The optimizer the run used (``resolved``, else the config's), or None."""
        if self.resolved.get("optimizer"):
            return str(self.resolved["optimizer"])
        return ((self.config or {}).get("optimizer") or {}).get("name")

    @property
    def num_classes(self) -> Optional[int]:
        return self.resolved.get("num_classes")


@dataclass(frozen=True)
class RunCheckpoint:
    """A checkpoint's contents (module docstring); ``to_state`` / ``from_state`` convert."""

    model: dict[str, Any]
    optimizer: Optional[dict[str, Any]] = None
    scheduler: Optional[dict[str, Any]] = None
    scaler: Optional[dict[str, Any]] = None
    train_state: Optional[dict[str, Any]] = None
    rng: Optional[dict[str, Any]] = None
    ema: Optional[dict[str, Any]] = None
    noise_scale: Optional[dict[str, Any]] = None
    world_size: Optional[int] = None
    global_batch_size: Optional[int] = None
    accumulation_steps: Optional[int] = None
    steps_per_epoch: Optional[int] = None
    identity: RunIdentity = field(default_factory=RunIdentity)
    version: Optional[str] = __version__
    format: int = FORMAT

    def to_state(self) -> dict[str, Any]:
        """The dict ``torch.save`` writes: plain values only (``weights_only=True`` reads it)."""
        state: dict[str, Any] = {
            "format": self.format,
            "version": self.version,
            "model": self.model,
            "optimizer": self.optimizer,
            "scheduler": self.scheduler,
            "scaler": self.scaler,
            "train_state": self.train_state,
            "rng": self.rng,
            **{k: getattr(self, k) for k in _SHAPE},
            "model_name": self.identity.model_name,
            "config": self.identity.config,
            "resolved": self.identity.resolved,
        }
        if self.ema is not None:
            state["ema"] = self.ema
        if self.noise_scale is not None:
            state["noise_scale"] = self.noise_scale
        return to_plain(state)

    @classmethod
    def from_state(cls, state: dict[str, Any], path: Path | str) -> "RunCheckpoint":
        """Read a checkpoint's dict (any known format); refuse a newer format in one line."""
        fmt = state.get("format", 1)
        if not isinstance(fmt, int) or fmt > FORMAT:
            raise CheckpointError(
                f"checkpoint {path} has format {fmt}, written by largebatch {state.get('version', '?')}; this "
                f"largebatch ({__version__}) reads formats 1-{FORMAT}: resume it with that version or a newer one"
            )
        if "model" not in state:
            raise CheckpointError(f"{path} is not a largebatch checkpoint (no model state)")
        return cls(
            model=state["model"],
            **{k: state.get(k) for k in RUN_PARTS + ("scaler", "ema", "noise_scale") + _SHAPE},
            identity=RunIdentity(model_name=state.get("model_name"), config=state.get("config"),
                                 resolved=state.get("resolved") or {}),
            version=state.get("version"),
            format=fmt,
        )

    def missing_parts(self) -> list[str]:
        """The :data:`RUN_PARTS` this file lacks (a weights-only file lacks them all)."""
        return [k for k in RUN_PARTS if getattr(self, k) is None]
