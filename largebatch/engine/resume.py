"""Resuming a run: find the checkpoint, check that it fits the run, load it.

The last of the checkpoint rooms: the record is :mod:`largebatch.engine.checkpoint_format`,
saved (and loaded, verified) by :mod:`largebatch.engine.checkpoint`, kept by
:mod:`largebatch.engine.checkpoint_retention`; the generators come back through
:mod:`largebatch.engine.rng_state`.

Rank 0 chooses the checkpoint and every rank loads the same file. ``resume=auto`` takes the
newest readable one (:func:`load_latest`: newest first, a file that cannot be read or fails
its checksum is reported and skipped). A checkpoint fits when it
was made with the same model, optimizer, global batch and epoch length; anything else stops
with one line naming what differs (a silent resume with another optimizer would apply state
meant for another update rule). ``resume=auto`` with checkpoint files present but none
readable is an error, not a fresh start.

A resume whose config differs from the checkpoint's in a key the run's result depends on
(:data:`RUN_KEYS`: the seed, the model, the optimizer's update rule, the embedded data set,
the crops, the loss, BN) is refused with one line naming the keys and both values: it would
continue another run under this one's name (a continued sweep whose values were listed in
another order did). Keys that only say how or where it runs (paths, workers, logging,
checkpoint cadence, precision, backend) may change.

The pipeline that read the checkpoint's data (``resolved["loader"]``) must be this run's
(:func:`check_same_loader`): each draws its own crops, so ``data.loader=auto`` answering
otherwise at the resume is refused with the override that continues exactly.

A resume whose config changes the learning-rate schedule (``epochs``, ``schedule.*``,
``optimizer.lr``, ``base_batch_size``, ``lr_scaling``: the usual one is raising ``epochs`` to
train a finished run longer) continues on the new schedule from the step reached, with the
learning rate set to the new schedule's value at that step, and says so in one log line naming
the keys and the learning rate before and after (without it, the rate jumped from the old
schedule's end, 0.0, to the new one's silently).

A resume from an older checkpoint than the newest in the run (a rollback) starts a new
timeline: rank 0 moves the newer checkpoints aside (``checkpoints/abandoned-<time>/``), so
``resume=auto`` later continues this run, not the one given up, and pruning never trades the
checkpoint resumed from for one of them.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import torch

from largebatch.engine.checkpoint import (
    CheckpointError,
    checkpoint_step,
    list_checkpoints,
    load_checkpoint,
)
from largebatch.engine.checkpoint_format import RunCheckpoint, with_absent_keys
from largebatch.engine.checkpoint_retention import set_aside_newer
from largebatch.engine.compile import strip_compile_prefixes
from largebatch.engine.ema import load_ema_state
from largebatch.engine.rng_state import restore_rng_state

if TYPE_CHECKING:
    from largebatch.backends.base import Backend

__all__ = ["RUN_KEYS", "SCHEDULE_KEYS", "ResumeCheck", "RunParts", "check_fits", "check_same_loader", "check_same_run",
           "find_checkpoint", "load_latest", "resume_run", "run_key_differences", "schedule_changes",
           "set_aside_abandoned"]

# config keys (or key prefixes) the learning-rate schedule is computed from
SCHEDULE_KEYS = ("epochs", "schedule.", "optimizer.lr", "base_batch_size", "lr_scaling")

# config keys (or key prefixes) a checkpoint must share with the run resuming it
RUN_KEYS = ("seed", "model.", "optimizer.", "label_smoothing", "bn.", "data.synthetic.",
            "data.image_size", "data.crop_scale", "data.val_crop_ratio", "data.resolution.",
            "batch_schedule.")
# ... except these: how the same computation runs, or only how it is evaluated (rect_val: fast.ai
# turned it on for the last phase), and the schedule keys
_HOW_KEYS = ("optimizer.foreach", "model.compile", "model.channels_last", "data.resolution.rect_val",
             "data.resolution.rect_val_from_epoch")

log = logging.getLogger("largebatch")


@dataclass(frozen=True)
class ResumeCheck:
    """What a checkpoint must share with the run resuming it (:func:`check_fits`): the model,
    optimizer, global batch and epoch length (``per_device`` only names the fix), the data
    set's class count (None: not checked), and this run's config as a plain dict, compared
    key by key (:data:`RUN_KEYS`, :data:`SCHEDULE_KEYS`; None: not compared)."""

    model_name: str
    optimizer_name: str
    global_batch_size: int
    per_device: int
    steps_per_epoch: int
    num_classes: Optional[int] = None
    config: Optional[dict[str, Any]] = None
    loader: Optional[str] = None  # the pipeline that reads this run's data (None: not checked)
    requested_loader: Optional[str] = None  # data.loader as given (auto, or a pipeline)


@dataclass(frozen=True)
class RunParts:
    """The live objects a checkpoint is loaded into: the plain model (not DDP- or
    compile-wrapped), the optimizer, the LR schedule, the loss scaler (None: none), the loop
    state (``TrainState``) and the weight EMA (a ``ModelEmaV3``; None: no EMA)."""

    model: Any
    optimizer: Any
    scheduler: Any
    scaler: Any
    state: Any
    ema: Any = None
    noise_scale: Any = None  # a GradientNoiseScale (the run measures it), or None


def load_latest(directory: str | os.PathLike) -> Optional[tuple[Path, dict[str, Any]]]:
    """The newest readable checkpoint of ``directory`` (damaged newer ones are reported).

    None when there is no checkpoint file; ``CheckpointError`` when there are some but none
    can be read (resuming "from scratch" would silently throw the run away).
    """
    paths = list_checkpoints(directory)
    newest_error = ""
    for path in reversed(paths):
        try:
            return path, load_checkpoint(path)
        except CheckpointError as e:
            newest_error = newest_error or str(e)
            log.warning("%s; falling back to the previous checkpoint", e)
    if paths:
        raise CheckpointError(
            f"none of the {len(paths)} checkpoint(s) in {directory} can be read (newest: "
            f"{newest_error}); resume from a good file with resume=<path>, or start a new run "
            f"with another run_dir"
        )
    return None


def find_checkpoint(resume: str, ckpt_dir: Path, backend: Backend) -> Optional[Path]:
    """Rank 0 picks the checkpoint (newest readable one for ``auto``); all ranks get it."""
    return _find_checkpoint(resume, ckpt_dir, backend)[0]


def _find_checkpoint(resume: str, ckpt_dir: Path, backend: Backend) -> tuple[Optional[Path], Optional[dict[str, Any]]]:
    """``find_checkpoint``, plus the state rank 0 loaded while choosing (``auto``): verifying
    and reading it again would cost a second SHA-256 pass and ``torch.load`` of the file."""
    choice: tuple[Optional[str], Optional[str]] = (None, None)
    loaded: Optional[dict[str, Any]] = None
    if backend.is_main:
        try:
            if resume != "auto":
                if Path(resume).is_dir():
                    raise CheckpointError(_folder_given(Path(resume)))
                if not Path(resume).is_file():
                    raise CheckpointError(
                        f"checkpoint {resume} does not exist; set resume= to a checkpoint file or to auto")
                choice = (resume, None)
            else:
                found = load_latest(ckpt_dir)
                if found:
                    choice, loaded = (str(found[0]), None), found[1]
        except CheckpointError as e:
            choice = (None, str(e))
    path, error = backend.broadcast_object(choice)
    if error:
        raise CheckpointError(error)
    return (Path(path) if path else None), loaded


def _folder_given(folder: Path) -> str:
    """The line for ``resume=<a folder>``: the run directory's way to resume is ``resume=auto``
    with ``run_dir=`` (the newest readable checkpoint, checked), or name one file."""
    ckpts, run_dir = list_checkpoints(folder), folder.parent  # a run's checkpoints/ folder
    if not ckpts:  # a run directory
        ckpts, run_dir = list_checkpoints(folder / "checkpoints"), folder
    if not ckpts:
        return (f"resume={folder} is a folder, not a checkpoint file, and holds no checkpoint; "
                "set resume= to a checkpoint file or to auto")
    return (f"resume={folder} is a folder, not a checkpoint file; to continue that run set "
            f"resume=auto run_dir={run_dir}, or name one file, e.g. resume={ckpts[-1]}")


def set_aside_abandoned(ckpt_dir: Path, step: int, backend: Backend) -> None:
    """Rank 0 moves the checkpoints newer than ``step`` (the abandoned timeline) aside."""
    error: Optional[str] = None
    if backend.is_main:
        try:
            moved = set_aside_newer(ckpt_dir, step)
        except OSError as e:
            error = (f"cannot move the checkpoints newer than step {step} aside in {ckpt_dir} "
                     f"({e.strerror}: {e.filename}); move them out of that folder by hand and resume again")
        else:
            if moved:
                folder, files = moved
                steps = sorted(checkpoint_step(f) for f in files)
                log.warning(
                    "resumed from step %d, older than the newest checkpoint: moved %d newer "
                    "checkpoint(s) of the abandoned timeline (steps %d-%d) to %s; resume=auto "
                    "continues this run", step, len(files), steps[0], steps[-1], folder)
    error = backend.broadcast_object(error)
    if error:
        raise CheckpointError(error)


def _flat(tree: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(tree, dict):
        return {prefix[:-1]: tree}
    out: dict[str, Any] = {}
    for key, value in tree.items():
        out.update(_flat(value, f"{prefix}{key}."))
    return out


def _differences(saved: Optional[dict[str, Any]], current: Optional[dict[str, Any]], prefixes: tuple[str, ...],
                 skip: tuple[str, ...] = ()) -> list[tuple[str, Any, Any]]:
    if not saved or not current:
        return []
    old, new = _flat(saved), _flat(current)

    def under(k: str, ps: tuple[str, ...]) -> bool:
        return any(k == p or (p.endswith(".") and k.startswith(p)) for p in ps)

    keys = sorted(k for k in old.keys() | new.keys() if under(k, prefixes) and not under(k, skip))
    return [(k, _plain(old.get(k)), _plain(new.get(k))) for k in keys if old.get(k) != new.get(k)]


def _plain(value: Any) -> Any:
    """An enum as the value a user writes (``accumulation``, not ``BatchGrowth.accumulation``):
    the run's own config holds the schema's enums, a checkpoint's their values."""
    return value.value if isinstance(value, Enum) else value


def schedule_changes(saved: Optional[dict[str, Any]], current: Optional[dict[str, Any]]) -> list[str]:
    """``["epochs 2 -> 4", ...]``: the :data:`SCHEDULE_KEYS` whose values differ between a
    checkpoint's config and this run's (both plain dicts; nothing when either is missing)."""
    return [f"{k} {a} -> {b}" for k, a, b in _differences(with_absent_keys(saved, current), current, SCHEDULE_KEYS)]


def run_key_differences(saved: Optional[dict[str, Any]], current: Optional[dict[str, Any]],
                        extra: tuple[str, ...] = ()) -> list[tuple[str, Any, Any]]:
    """``(key, saved value, current value)`` for each :data:`RUN_KEYS` key (and ``extra``) where two
    configs (plain dicts) differ: another run's, not this one's; nothing when either is missing."""
    saved = with_absent_keys(saved, current)  # keys added since: what the run did without them
    return _differences(saved, current, RUN_KEYS + extra, skip=SCHEDULE_KEYS + _HOW_KEYS)


def check_same_run(saved: Optional[dict[str, Any]], current: Optional[dict[str, Any]], path: Path) -> None:
    """Refuse a checkpoint whose config differs from this run's in a :data:`RUN_KEYS` key."""
    differ = run_key_differences(saved, current)
    if differ:
        was = ", ".join(f"{k}={a}" for k, a, _ in differ)
        now = ", ".join(f"{k}={b}" for k, _, b in differ)
        raise CheckpointError(
            f"checkpoint {path} belongs to another run: it was made with {was}, this run has {now}; "
            f"resume with the checkpoint's values, or start a new run_dir"
        )


def _continue_on_new_schedule(scheduler: Any, optimizer: Any, changes: list[str], step: int) -> None:
    """Set each group's lr to the new schedule's value at the step reached (a ``LambdaLR``
    holds its step, not its functions) and log the change in one line."""
    before = optimizer.param_groups[0]["lr"]
    if isinstance(scheduler, torch.optim.lr_scheduler.LambdaLR):  # build_lr_scheduler's
        for group, base, fn in zip(optimizer.param_groups, scheduler.base_lrs, scheduler.lr_lambdas):
            group["lr"] = base * fn(scheduler.last_epoch)
        scheduler._last_lr = [g["lr"] for g in optimizer.param_groups]
    log.warning("resume changes the learning-rate schedule (%s): continuing on the new schedule from "
                "step %d, lr %.4g -> %.4g (resume with the checkpoint's values to keep the old one)",
                ", ".join(changes), step, before, optimizer.param_groups[0]["lr"])


def check_fits(ckpt: RunCheckpoint, path: Path, check: ResumeCheck, world_size: int) -> None:
    """A checkpoint must come from the same model, optimizer, global batch, class count and
    epoch length; raise ``CheckpointError`` naming what differs and the fix."""
    saved_model = ckpt.identity.model_name
    if saved_model is not None and saved_model != check.model_name:
        raise CheckpointError(
            f"checkpoint {path} was made with model {saved_model}, not {check.model_name}; "
            f"resume with model.name={saved_model} or start a new run_dir"
        )
    saved_opt = ckpt.identity.optimizer_name
    if saved_opt is not None and saved_opt != check.optimizer_name:
        raise CheckpointError(
            f"checkpoint {path} was made with optimizer={saved_opt}, not {check.optimizer_name}; its "
            f"optimizer state does not fit another update rule: resume with optimizer={saved_opt} "
            f"or start a new run_dir"
        )
    saved_batch = ckpt.global_batch_size
    if saved_batch is not None and saved_batch != check.global_batch_size:
        raise CheckpointError(
            f"checkpoint {path} was made with global_batch_size={saved_batch}, not "
            f"{check.global_batch_size}; resume with global_batch_size={saved_batch} (the LR, "
            f"schedule and data position depend on it)"
        )
    saved_classes = ckpt.identity.num_classes
    if check.num_classes is not None and saved_classes is not None and saved_classes != check.num_classes:
        # the same model name, but its classifier has another width: the data set differs
        raise CheckpointError(
            f"checkpoint {path} was trained on {saved_classes} classes, but this run's data set has "
            f"{check.num_classes}; resume with the data set it was trained on (data.root), or start a new run_dir"
        )
    check_same_loader(ckpt.identity.resolved.get("loader"), check, path)
    saved_steps = ckpt.steps_per_epoch
    if saved_steps is not None and saved_steps != check.steps_per_epoch:
        raise CheckpointError(
            f"checkpoint {path} has {saved_steps} steps per epoch but this run has "
            f"{check.steps_per_epoch} (world size {world_size}, {check.per_device} per device "
            f"drops a different tail of the data); resume at world size "
            f"{ckpt.world_size} or with a global_batch_size that divides the data evenly"
        )


def check_same_loader(saved: Optional[str], check: ResumeCheck, path: Path) -> None:
    """The pipeline that read the checkpoint's data against this run's: each draws its own crops,
    so a switch makes the rest of the run another run's. ``data.loader=auto`` answering otherwise
    than the checkpoint's run did (a store built or deleted since, another cache, another
    version's default) is refused with the override that continues exactly; a pipeline named on
    the command line is the user's choice, said in one line; a checkpoint that does not record
    its pipeline (an earlier version's) gets a line naming this run's and how to pin another."""
    now = check.loader
    if now is None or saved == now:
        return
    if saved is None:
        log.warning("checkpoint %s does not record which loader read its data (written by an earlier version); "
                    "this run reads with %s (data.loader=%s): if the run trained with another, resume with "
                    "data.loader=<that one> to continue it exactly", path, now, check.requested_loader)
        return
    if check.requested_loader == "auto":
        raise CheckpointError(
            f"checkpoint {path} was trained reading with the {saved} loader, but data.loader=auto now reads with "
            f"{now}, whose crops differ: resume with data.loader={saved} to continue the run exactly, or "
            f"data.loader={now} to go on with {now}'s crops"
        )
    log.warning("resuming with data.loader=%s, not the %s loader checkpoint %s was trained with: the crops from "
                "here on differ, so the run is not bit-identical to one that kept %s", now, saved, path, saved)


def _load_parts(ckpt: RunCheckpoint, path: Path, parts: RunParts, backend: Backend) -> None:
    """Optimizer, schedule, scaler, loop state, RNG and EMA from the checkpoint (the model is loaded)."""
    try:
        parts.optimizer.load_state_dict(ckpt.optimizer)
        parts.scheduler.load_state_dict(ckpt.scheduler)
        if parts.scaler is not None and ckpt.scaler:
            parts.scaler.load_state_dict(ckpt.scaler)
        parts.state.load_state_dict(ckpt.train_state)
        restore_rng_state(ckpt.rng, backend)
        if parts.ema is not None and not load_ema_state(parts.ema, ckpt.ema, parts.model):
            log.warning("checkpoint %s holds no EMA weights (written with ema.enabled=false or "
                        "before the EMA existed): the EMA starts from its weights at step %d",
                        path, parts.state.step)
        if parts.ema is None and ckpt.ema is not None:
            log.info("checkpoint %s holds EMA weights; ema.enabled=false: they are not used", path)
        _load_noise_scale(ckpt, path, parts)
    except (KeyError, ValueError, TypeError, RuntimeError) as e:
        raise CheckpointError(
            f"checkpoint {path} does not fit this run's optimizer/schedule/EMA state "
            f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); resume with the "
            f"settings it was made with, or start a new run_dir"
        ) from None


def _load_noise_scale(ckpt: RunCheckpoint, path: Path, parts: RunParts) -> None:
    """Continue the noise scale's averages; a file without them, or with another beta, starts them afresh
    (a diagnostic: never a reason to refuse the resume)."""
    if parts.noise_scale is None:
        return
    if ckpt.noise_scale is None:
        log.info("checkpoint %s holds no noise scale averages: they start afresh", path)
        return
    try:
        parts.noise_scale.load_state_dict(ckpt.noise_scale)
    except ValueError as e:
        log.warning("%s; the noise scale averages start afresh", e)


def resume_run(resume: str, ckpt_dir: Path, *, backend: Backend, check: ResumeCheck, parts: RunParts) -> Optional[Path]:
    """Load the checkpoint ``resume`` names (a path, or ``auto``: the newest in the run) into ``parts``.

    ``check``: what the checkpoint must share with this run (``check_fits``; its config is
    compared for a changed learning-rate schedule, module docstring). ``parts.ema`` (a
    ``ModelEmaV3``, or None) is loaded from the checkpoint's EMA weights; a checkpoint
    written without them starts the EMA from the resumed weights (one log line).

    Returns the checkpoint loaded, or None (``auto`` and no checkpoint file yet).
    """
    path, state = _find_checkpoint(resume, ckpt_dir, backend)
    if path is None:
        log.info("resume=auto: no checkpoint in %s, starting from scratch", ckpt_dir)
        return None
    if state is None:  # a path given, or a rank other than 0
        state = load_checkpoint(path)
    ckpt = RunCheckpoint.from_state(state, path)
    world_size = backend.world_size
    check_fits(ckpt, path, check, world_size)
    try:
        # strip: checkpoints of older versions were saved from the compiled module
        parts.model.load_state_dict(strip_compile_prefixes(ckpt.model))
    except RuntimeError as e:
        raise CheckpointError(
            f"checkpoint {path} does not fit model {check.model_name} "
            f"({str(e).splitlines()[0]}); resume with the model (and the data set's class count) it was made with"
        ) from None
    missing = ckpt.missing_parts()
    if missing:
        raise CheckpointError(
            f"checkpoint {path} holds no {', '.join(missing)} state (model weights only?), so a "
            f"run cannot continue from it; resume from a checkpoint largebatch-train wrote, or "
            f"start a new run without resume="
        )
    _load_parts(ckpt, path, parts, backend)
    # after the loads: an optimizer's own refusal (LARS's momentum form) names its option better
    check_same_run(ckpt.identity.config, check.config, path)
    changes = schedule_changes(ckpt.identity.config, check.config)
    if changes:
        _continue_on_new_schedule(parts.scheduler, parts.optimizer, changes, parts.state.step)
    saved_world = ckpt.world_size if ckpt.world_size is not None else world_size
    if saved_world != world_size:
        log.warning(
            "checkpoint written at world size %d, resuming at %d: per-device batch is now %d "
            "(global batch %d kept); the result is not bit-identical to an uninterrupted run",
            saved_world, world_size, check.per_device, check.global_batch_size,
        )
    log.info("resumed from %s (epoch %d, step %d)", path, parts.state.epoch, parts.state.step)
    set_aside_abandoned(ckpt_dir, parts.state.step, backend)
    return path
