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
``format``          2, or 3 with ``features`` (below)
``features``        format 3: the features the run uses that a reader must know to continue it
==================  ==========================================================================

Formats: 1 (largebatch up to 0.x of 2026-11, no ``format`` key): the parts above; 2: the
same parts and ``format``; 3: the same and ``features``, the features of :data:`ADDED_KEYS` the
run uses. A run that uses none writes format 2, which every reader since format 2 reads as
before; one that uses a feature (a batch schedule, progressive resizing, ...) writes format 3,
which a reader from before format 3 refuses, and a format-3 reader refuses a feature it does
not know: a requeued job landing on an older image stops with one line naming the version
that wrote the file, instead of training on as another run. A file of a newer format than
this code knows is refused the same way. A new feature therefore needs no new format: it
declares each key it adds in :data:`ADDED_KEYS` (a test fails for a key that is neither of
format 2 nor declared), and the readers before it refuse the files that use it. Only
``model`` is required to read a file (a
weights-only file loads for inspection); :meth:`RunCheckpoint.missing_parts` says what a
run needs to continue from it.
"""

from __future__ import annotations

import copy
import enum
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

from largebatch import __version__
from largebatch.errors import CheckpointError

__all__ = ["ADDED_KEYS", "FEATURES", "FORMAT", "RUN_PARTS", "AddedKey", "RunCheckpoint", "RunIdentity",
           "features_used", "to_plain", "with_absent_keys"]

FORMAT = 3  # the newest format this code reads (it writes 2 or 3: the module docstring)


@dataclass(frozen=True)
class AddedKey:
    """A checkpoint key added after format 2: the value that means what a run did before the key
    existed, the feature a run uses when its value differs (None: the key never changes what a
    continued run computes, only how it is measured, recorded or composed), and the commit that
    added it (a checkpoint written before that commit lacks the key)."""

    absent: Any
    feature: Optional[str]
    since: str


# Every key a checkpoint holds that format 2 did not (largebatch of 2026-11-25, commit ccb132e:
# the keys of tests/fixtures/format2_record_keys.txt and, under ``config.``, of
# tests/fixtures/format2_config_keys.txt), by its path in the record: ``config.<key>``, a
# part's name, or ``<part>.<key>``; oldest commit first. A new key is declared
# here, with the value a run without it had, the feature that makes an older reader refuse the
# checkpoint when the value differs, and its commit (tests/test_checkpoint_format.py fails for
# a key that is in neither; tests/test_resume_compat.py resumes a checkpoint from before each
# commit). Reading an older checkpoint, an absent key takes its ``absent`` value
# (:func:`with_absent_keys`); writing, the features whose keys differ from it are the file's
# ``features`` (:func:`features_used`).
ADDED_KEYS: dict[str, AddedKey] = {
    # each rank's device generator (format 2: ``cuda``, rank 0's list); a reader without it
    # keeps its seeded device generators: only on-device random draws (dropout) differ
    "rng.device": AddedKey(None, None, "a25dbb0"),
    "config.diagnostics.noise_scale.enabled": AddedKey(True, None, "def7a83"),  # measured beside the step
    "config.diagnostics.noise_scale.beta": AddedKey(0.99, None, "def7a83"),
    "noise_scale": AddedKey(None, None, "9646d01"),  # the noise scale's averages: without them, measured afresh
    "config.diagnostics.noise_scale.probe_every": AddedKey(0, None, "a6ce97e"),
    "config.data.resolution.schedule": AddedKey("none", "progressive_resizing", "7cbe015"),
    "config.data.resolution.steps": AddedKey([], "progressive_resizing", "7cbe015"),
    "config.data.resolution.start_epoch": AddedKey(0, "progressive_resizing", "7cbe015"),
    "config.data.resolution.end_epoch": AddedKey(0, "progressive_resizing", "7cbe015"),
    "config.data.resolution.start_size": AddedKey(None, "progressive_resizing", "7cbe015"),
    "config.data.resolution.end_size": AddedKey(None, "progressive_resizing", "7cbe015"),
    "config.data.resolution.multiple": AddedKey(32, "progressive_resizing", "7cbe015"),
    "config.data.resolution.eval_size": AddedKey(None, "progressive_resizing", "7cbe015"),
    "config.batch_schedule.steps": AddedKey([], "batch_schedule", "4b4974b"),
    "config.batch_schedule.via": AddedKey("accumulation", None, "4b4974b"),  # read only with steps or adaptive
    "config.batch_schedule.lr": AddedKey("scale", None, "4b4974b"),
    "config.schedule.points": AddedKey([], "piecewise_schedule", "32a2b8f"),
    "config.batch_schedule.adaptive.enabled": AddedKey(False, "adaptive_batch", "5a0df7f"),
    "config.batch_schedule.adaptive.raise_at": AddedKey(2.0, None, "5a0df7f"),
    "config.batch_schedule.adaptive.growth": AddedKey(2, None, "5a0df7f"),
    "config.batch_schedule.adaptive.max_global_batch": AddedKey(None, None, "5a0df7f"),
    "train_state.batch_factors": AddedKey([], "adaptive_batch", "5a0df7f"),  # the adaptive batch's decisions
    "config.data.resolution.rect_val": AddedKey(False, None, "4809527"),  # evaluation only (resume._HOW_KEYS)
    "config.data.resolution.eval_follows_train": AddedKey(False, "progressive_resizing", "3675d78"),
    "config.data.resolution.crop_scale_steps": AddedKey([], "progressive_resizing", "3675d78"),
    "config.data.resolution.rect_val_from_epoch": AddedKey(0, None, "3675d78"),
    "config.recipe.mode": AddedKey("auto", None, "485c1a6"),  # how the config was composed: its values are in it
    "config.recipe.derived": AddedKey({}, None, "485c1a6"),
    "config.recipe.warnings": AddedKey([], None, "485c1a6"),
    "config.model.fc_init_std": AddedKey(None, None, "c73f019"),  # the classifier's init: a resume loads the weights
    "config.optimizer.decay_bias": AddedKey(False, "bias_decay", "c73f019"),  # which tensors are decayed
}

# the features this code continues a run with
FEATURES = frozenset(k.feature for k in ADDED_KEYS.values() if k.feature)

_CONFIG = "config."


def _select(tree: Any, key: str) -> tuple[bool, Any]:
    for part in key.split("."):
        if not isinstance(tree, dict) or part not in tree:
            return False, None
        tree = tree[part]
    return True, tree


def features_used(state: dict[str, Any]) -> list[str]:
    """The features of :data:`ADDED_KEYS` a checkpoint's record (a plain dict) uses, sorted:
    those with a key whose value differs from the key's ``absent`` one."""
    used = set()
    for key, added in ADDED_KEYS.items():
        found, value = _select(state, key)
        if added.feature and found and to_plain(value) != added.absent:
            used.add(added.feature)
    return sorted(used)


def with_absent_keys(saved: Optional[dict[str, Any]], current: Optional[dict[str, Any]]) -> Optional[dict[str, Any]]:
    """``saved`` (a checkpoint's config) with each :data:`ADDED_KEYS` config key that ``current``
    has and it lacks set to the key's absent value: what the run that wrote it did without the key."""
    if not isinstance(saved, dict) or not isinstance(current, dict):
        return saved
    out = copy.deepcopy(saved)
    for key, added in ADDED_KEYS.items():
        if not key.startswith(_CONFIG):
            continue
        key = key[len(_CONFIG):]
        if _select(current, key)[0] and not _select(out, key)[0]:
            *parents, last = key.split(".")
            node = out
            for part in parents:
                if not isinstance(node.get(part), dict):
                    node[part] = {}
                node = node[part]
            node[last] = copy.deepcopy(added.absent)
    return out

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
            "format": 2,
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
        state = to_plain(state)
        features = features_used(state)
        if features:  # a reader from before format 3 refuses it; a newer one checks the list
            state.update(format=3, features=features)
        return state

    @classmethod
    def from_state(cls, state: dict[str, Any], path: Path | str) -> "RunCheckpoint":
        """Read a checkpoint's dict (any known format); refuse a newer format in one line."""
        fmt = state.get("format", 1)
        if not isinstance(fmt, int) or fmt > FORMAT:
            raise CheckpointError(
                f"checkpoint {path} has format {fmt}, written by largebatch {state.get('version', '?')}; this "
                f"largebatch ({__version__}) reads formats 1-{FORMAT}: resume it with that version or a newer one"
            )
        features = state.get("features") or []
        if not isinstance(features, list) or not all(isinstance(f, str) for f in features):
            # a string would be read as its letters, a number would be a TypeError's traceback
            raise CheckpointError(
                f"checkpoint {path} is damaged: its 'features' field is {features!r}, not a list of names; "
                f"resume from an earlier checkpoint of the run with resume=<its file>")
        unknown = sorted(set(features) - FEATURES)
        if unknown:
            raise CheckpointError(
                f"checkpoint {path} was made by a run that uses {', '.join(unknown)}, written by largebatch "
                f"{state.get('version', '?')}; this largebatch ({__version__}) does not know it: resume it with "
                f"that version or a newer one")
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
