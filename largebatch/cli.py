"""Command-line entry points: the only code that reads the config object.

``largebatch-train [hydra overrides]`` (also ``python -m largebatch.train``) composes
``conf/train.yaml``, checks the batch arithmetic, starts the backend, builds data, model,
optimizer and schedule, and runs the loop. Under torchrun every rank runs this; rank 0
chooses the run directory and the others receive it, so a run has exactly one directory.

Under torchrun with ``--max-restarts``, a restarted worker group resumes by itself: without
``run_dir=`` the run directory is ``<output_root>/<model>-<torchrun run id>`` (the same for
every restart), and ``resume`` defaults to ``auto`` once ``TORCHELASTIC_RESTART_COUNT`` > 0.

Exit codes:

* 0 (``EXIT_OK``): the run finished (or stopped at ``max_steps`` / its target).
* 2 (``EXIT_USAGE``): bad input (config key or type, batch sizes, data folders, run
  directory, a checkpoint that does not fit the run): one line on stderr naming the problem
  and the fix, no traceback.
* 3 (``EXIT_NON_FINITE``): the loss became NaN/inf (``non_finite=stop``, or more than
  ``max_skipped_steps`` skipped steps with ``non_finite=skip``); the message names the step
  and the rank.
* 75 (``EXIT_PREEMPTED``, sysexits' EX_TEMPFAIL: "try again later"): SIGTERM or SIGINT
  arrived; every rank finished the same step and a checkpoint was saved, so rerunning with
  ``resume=auto run_dir=<same>`` continues. Distinct from 143 (128 + SIGTERM), which means
  the process was killed before it could save.
* 130: a second Ctrl-C interrupted without saving.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

import torch
from omegaconf import OmegaConf

from largebatch import __version__

__all__ = ["main", "run", "BatchPlan", "plan_batches"]

log = logging.getLogger("largebatch")

EXIT_OK = 0
EXIT_USAGE = 2
EXIT_NON_FINITE = 3
EXIT_PREEMPTED = 75
EXIT_INTERRUPTED = 130


class UsageError(ValueError):
    """A setting that cannot work; the message says which and how to fix it."""


@dataclass(frozen=True)
class BatchPlan:
    """The batch arithmetic: global = per_device x world_size x accumulation_steps."""

    global_batch_size: int
    world_size: int
    accumulation_steps: int
    per_device: int


def plan_batches(global_batch_size: int, world_size: int, accumulation_steps: int) -> BatchPlan:
    """Split ``global_batch_size`` over devices and micro-steps, or say why it cannot be."""
    if global_batch_size < 1 or accumulation_steps < 1:
        raise UsageError(
            f"global_batch_size ({global_batch_size}) and accumulation_steps "
            f"({accumulation_steps}) must be positive"
        )
    parts = world_size * accumulation_steps
    if global_batch_size % parts:
        lower = global_batch_size - global_batch_size % parts
        raise UsageError(
            f"global_batch_size={global_batch_size} is not divisible by world size {world_size} "
            f"x accumulation_steps {accumulation_steps} = {parts}; use a multiple of {parts}, "
            f"e.g. global_batch_size={max(lower, parts)}"
        )
    return BatchPlan(global_batch_size, world_size, accumulation_steps, global_batch_size // parts)


def _setup_logging(is_main: bool, run_dir: Optional[Path]) -> None:
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    level = logging.INFO if is_main else logging.WARNING
    fmt = logging.Formatter("[%(asctime)s %(levelname)s] %(message)s", "%H:%M:%S")
    console = logging.StreamHandler(sys.stdout)
    console.setFormatter(fmt)
    root.addHandler(console)
    if is_main and run_dir is not None:
        fh = logging.FileHandler(run_dir / "train.log")
        fh.setFormatter(fmt)
        root.addHandler(fh)
    root.setLevel(level)


def _elastic_run_id() -> Optional[str]:
    """torchrun's job id (``--rdzv-id``; a fresh id per ``--standalone`` launch), if any."""
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", "")
    return run_id if run_id and run_id != "none" else None


def _resume_setting(resume: Optional[str]) -> Optional[str]:
    """``resume``; a restarted torchrun worker group always resumes (``auto``)."""
    if resume is None and int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0) > 0:
        log.info("torchrun restart %s: resuming from the newest checkpoint (resume=auto)",
                 os.environ["TORCHELASTIC_RESTART_COUNT"])
        return "auto"
    return resume


def _make_run_dir(cfg: Any, backend: Any) -> Path:
    """Rank 0 creates the run directory; every rank gets the same path."""
    path: Optional[str] = None
    error: Optional[str] = None
    if backend.is_main:
        try:
            if cfg.run_dir:
                run_dir = Path(cfg.run_dir)
            elif _elastic_run_id():
                # Every restart of a torchrun job must find the same directory (to resume).
                run_dir = Path(cfg.output_root) / f"{cfg.model.name}-{_elastic_run_id()}"
            else:
                stamp = time.strftime("%Y%m%d-%H%M%S")
                run_dir = Path(cfg.output_root) / f"{stamp}-{cfg.model.name}"
                n = 1
                while run_dir.exists():
                    n += 1
                    run_dir = Path(cfg.output_root) / f"{stamp}-{cfg.model.name}-{n}"
            run_dir.mkdir(parents=True, exist_ok=True)
            probe = run_dir / ".write-test"
            probe.write_text("ok")
            probe.unlink()
            path = str(run_dir.resolve())
        except OSError as e:
            error = (
                f"cannot write the run directory ({e.strerror}: {e.filename}); set run_dir= or "
                f"output_root= to a writable folder"
            )
    path, error = backend.broadcast_object((path, error))
    if error:
        raise UsageError(error)
    return Path(path)


def _resolve_data_root(cfg: Any, backend: Any) -> Path:
    """``data.root``, or the embedded synthetic set (made by rank 0 on first use).

    When the run may read with DALI (``data.loader`` dali or auto), rank 0 also runs the
    data check on the embedded set if it has none yet, so DALI works on it out of the box.
    """
    if cfg.data.root:
        return Path(cfg.data.root).expanduser()
    from largebatch.data.synthetic import ensure_synthetic

    syn = cfg.data.synthetic
    args = dict(
        num_classes=syn.classes,
        train_per_class=syn.train_per_class,
        val_per_class=syn.val_per_class,
        image_size=syn.image_size,
        seed=syn.seed,
    )
    root: Optional[Path] = None
    if backend.is_main:
        root = ensure_synthetic(workers=max(1, cfg.data.workers), **args)
        if _value(cfg.data.loader) != "torchvision":
            _ensure_checked(root, workers=max(1, cfg.data.workers))
    backend.barrier()
    return ensure_synthetic(**args) if root is None else root


def _ensure_checked(root: Path, *, workers: int) -> None:
    """Run the data check on ``root`` unless an up-to-date one is on disk."""
    from largebatch.data.check import SPLITS, check_dataset, require_checked
    from largebatch.data.folder import DataError

    try:
        for split in SPLITS:
            require_checked(root, split)
    except DataError:
        report = check_dataset(root, workers=workers)
        log.info("checked %s for DALI: %d file(s) left out (%s)", root, len(report.fatal), report.report_path)


def _dali_decision(requested: str, root: Path) -> tuple[bool, Optional[dict[str, str]], Optional[str], Optional[str]]:
    """``(use_dali, clean file lists, error, note)`` for ``data.loader=requested`` (dali|auto).

    DALI needs the clean file lists of ``largebatch-check-data`` (it cannot skip a bad file):
    ``dali`` on an unchecked (or changed) set is an error naming the command; ``auto`` then
    reads with torchvision and says why in the note.
    """
    from largebatch.data.check import SPLITS, require_checked
    from largebatch.data.dali import dali_available, require_dali
    from largebatch.data.folder import DataError

    if not dali_available():
        if requested == "dali":
            try:
                require_dali()
            except DataError as err:
                return False, None, str(err), None
        return False, None, None, "data.loader=auto: NVIDIA DALI is not installed, reading with torchvision"
    if not root.is_dir():  # the loader builders name the missing folder
        return requested == "dali", None, None, None
    try:
        lists = {split: str(require_checked(root, split)) for split in SPLITS}
    except DataError as err:
        if requested == "dali":
            return False, None, f"{err} (or set data.loader=torchvision)", None
        return False, None, None, f"data.loader=auto: reading with torchvision, not DALI: {err}"
    return True, lists, None, None


def _loader_arguments(cfg: Any, backend: Any, plan: BatchPlan) -> dict[str, Any]:
    """What every pipeline (torchvision, DALI files, DALI shards) takes: sizes, shard, seed."""
    return dict(
        image_size=cfg.data.image_size,
        batch_size=plan.per_device,
        workers=cfg.data.workers,
        rank=backend.rank,
        world_size=backend.world_size,
        seed=cfg.seed,
        crop_scale=tuple(cfg.data.crop_scale),
        val_crop_ratio=cfg.data.val_crop_ratio,
    )


def _dali_device_and_layout(cfg: Any, backend: Any) -> tuple[Optional[int], str]:
    """DALI's ``device_id`` (mixed GPU decode on a CUDA device, else None: CPU decode) and layout."""
    device = backend.device
    device_id = (device.index if device.index is not None else backend.local_rank) if device.type == "cuda" else None
    return device_id, "NHWC" if cfg.model.channels_last else "NCHW"


def _build_data(cfg: Any, backend: Any, plan: BatchPlan, root: Path) -> tuple[Any, Any, int]:
    """Train and val loaders of this rank: torchvision, or DALI (``data.loader``).

    Rank 0 decides between the two (DALI only on a set checked by ``largebatch-check-data``)
    and tells the others, so every rank reads with the same pipeline.
    """
    from largebatch.data.folder import DataError, build_loaders

    requested = _value(cfg.data.loader)
    if cfg.data.shards:
        return _build_shard_data(cfg, backend, plan, requested)
    use_dali, lists = False, None
    if requested != "torchvision":
        decision: tuple[bool, Optional[dict[str, str]], Optional[str], Optional[str]] = (False, None, None, None)
        if backend.is_main:
            decision = _dali_decision(requested, root)
        use_dali, lists, error, note = backend.broadcast_object(decision)
        if error:
            raise DataError(error)
        if note and backend.is_main:
            log.info("%s", note)
        if lists and not all(Path(p).is_file() for p in lists.values()):
            # rank 0's lists live on a disk this node does not see: find this node's own
            from largebatch.data.check import require_checked

            lists = {split: str(require_checked(root, split)) for split in lists}
    common = _loader_arguments(cfg, backend, plan)
    if not use_dali:
        if backend.is_main:
            log.info("input pipeline: torchvision DataLoader, %d worker(s) per rank", cfg.data.workers)
        return build_loaders(root, pin_memory=backend.device.type == "cuda", **common)
    from largebatch.data.dali import build_dali_loaders

    device_id, layout = _dali_device_and_layout(cfg, backend)
    train, val, num_classes = build_dali_loaders(root, device_id=device_id, layout=layout, file_list=lists, **common)
    if backend.is_main:
        log.info(
            "input pipeline: DALI, %s decode, %d thread(s), %s; %d train / %d val files from the "
            "data check's lists", "mixed (GPU)" if device_id is not None else "CPU",
            max(1, cfg.data.workers), layout, train.sampler.dataset_len, val.sampler.dataset_len,
        )
    return train, val, num_classes


def _build_shard_data(cfg: Any, backend: Any, plan: BatchPlan, requested: str) -> tuple[Any, Any, int]:
    """DALI loaders over the packed shards of ``data.shards`` (``largebatch-make-shards``)."""
    from largebatch.data.dali import build_dali_shard_loaders, require_dali
    from largebatch.data.folder import DataError

    if requested == "torchvision":
        raise DataError(
            f"data.shards={cfg.data.shards} is read by DALI only; set data.loader=dali (or auto), "
            f"or drop data.shards to read data.root's files with torchvision"
        )
    require_dali()
    device_id, layout = _dali_device_and_layout(cfg, backend)
    train, val, num_classes = build_dali_shard_loaders(
        cfg.data.shards, device_id=device_id, layout=layout, **_loader_arguments(cfg, backend, plan)
    )
    if backend.is_main:
        log.info("input pipeline: DALI webdataset reader over the shards in %s, %s decode, %s",
                 cfg.data.shards, "mixed (GPU)" if device_id is not None else "CPU", layout)
    return train, val, num_classes


def _optimizer_options(opt: Any) -> dict[str, Any]:
    """The optimizer-specific options the config sets (None = the optimizer's default)."""
    names = ("momentum", "nesterov", "trust_coefficient", "eps", "betas", "foreach")
    out = {n: getattr(opt, n) for n in names if getattr(opt, n) is not None}
    if "betas" in out:
        out["betas"] = tuple(out["betas"])
    return out


def _value(x: Any) -> Any:
    return getattr(x, "value", x)


def _find_checkpoint(resume: str, ckpt_dir: Path, backend: Any) -> Optional[Path]:
    """Rank 0 picks the checkpoint (newest readable one for ``auto``); all ranks get it."""
    from largebatch.engine.checkpoint import CheckpointError, load_latest

    choice: tuple[Optional[str], Optional[str]] = (None, None)
    if backend.is_main:
        if resume != "auto":
            choice = (resume, None) if Path(resume).is_file() else (
                None, f"checkpoint {resume} does not exist; set resume= to a checkpoint file or to auto")
        else:
            found = load_latest(ckpt_dir)
            choice = (str(found[0]) if found else None, None)
    path, error = backend.broadcast_object(choice)
    if error:
        raise CheckpointError(error)
    return Path(path) if path else None


def _check_fits(ckpt: dict[str, Any], path: Path, *, model_name: str, plan: BatchPlan, steps_per_epoch: int) -> None:
    """A checkpoint must come from the same model, global batch and epoch length."""
    from largebatch.engine.checkpoint import CheckpointError

    saved_model = ckpt.get("model_name")
    if saved_model is not None and saved_model != model_name:
        raise CheckpointError(
            f"checkpoint {path} was made with model {saved_model}, not {model_name}; "
            f"resume with model.name={saved_model} or start a new run_dir"
        )
    saved_batch = ckpt.get("global_batch_size", plan.global_batch_size)
    if saved_batch != plan.global_batch_size:
        raise UsageError(
            f"checkpoint {path} was made with global_batch_size={saved_batch}, not "
            f"{plan.global_batch_size}; resume with global_batch_size={saved_batch} (the LR, "
            f"schedule and data position depend on it)"
        )
    saved_steps = ckpt.get("steps_per_epoch", steps_per_epoch)
    if saved_steps != steps_per_epoch:
        raise UsageError(
            f"checkpoint {path} has {saved_steps} steps per epoch but this run has "
            f"{steps_per_epoch} (world size {plan.world_size}, {plan.per_device} per device "
            f"drops a different tail of the data); resume at world size "
            f"{ckpt.get('world_size')} or with a global_batch_size that divides the data evenly"
        )


def _resume(
    resume: str, ckpt_dir: Path, *, backend: Any, model_name: str, plan: BatchPlan,
    steps_per_epoch: int, model: Any, optimizer: Any, scheduler: Any, scaler: Any, state: Any,
) -> None:
    """Load the checkpoint ``resume`` names (a path, or ``auto``: the newest in the run)."""
    from largebatch.engine.checkpoint import CheckpointError, load_checkpoint, restore_rng_state

    path = _find_checkpoint(resume, ckpt_dir, backend)
    if path is None:
        log.info("resume=auto: no checkpoint in %s, starting from scratch", ckpt_dir)
        return
    ckpt = load_checkpoint(path)
    _check_fits(ckpt, path, model_name=model_name, plan=plan, steps_per_epoch=steps_per_epoch)
    try:
        model.load_state_dict(ckpt["model"])
    except RuntimeError as e:
        raise CheckpointError(
            f"checkpoint {path} does not fit model {model_name} "
            f"({str(e).splitlines()[0]}); resume with the model it was made with"
        ) from None
    optimizer.load_state_dict(ckpt["optimizer"])
    scheduler.load_state_dict(ckpt["scheduler"])
    if scaler is not None and ckpt.get("scaler"):
        scaler.load_state_dict(ckpt["scaler"])
    state.load_state_dict(ckpt["train_state"])
    restore_rng_state(ckpt["rng"])
    saved_world = ckpt.get("world_size", plan.world_size)
    if saved_world != plan.world_size:
        log.warning(
            "checkpoint written at world size %d, resuming at %d: per-device batch is now %d "
            "(global batch %d kept); the result is not bit-identical to an uninterrupted run",
            saved_world, plan.world_size, plan.per_device, plan.global_batch_size,
        )
    log.info("resumed from %s (epoch %d, step %d)", path, state.epoch, state.step)


def run(cfg: Any, raw_cfg: Any = None) -> dict[str, Any]:
    """Run one training job described by a ``TrainConfig``; return its summary."""
    from largebatch.backends import build_backend
    from largebatch.engine import hooks as H
    from largebatch.engine.loop import Trainer, TrainState
    from largebatch.engine.preemption import Preempted, PreemptionHook
    from largebatch.engine.precision import resolve_precision
    from largebatch.lr import build_lr_scheduler, scale_lr, schedule_factors
    from largebatch.models import build_model
    from largebatch.nn import convert_group_sync_batchnorm
    from largebatch.optim import build_optimizer

    backend = build_backend(_value(cfg.backend.name), timeout_s=cfg.backend.timeout_s)
    backend.start()
    try:
        plan = plan_batches(cfg.global_batch_size, backend.world_size, cfg.accumulation_steps)
        run_dir = _make_run_dir(cfg, backend)
        _setup_logging(backend.is_main, run_dir)
        torch.manual_seed(cfg.seed)
        precision = resolve_precision(_value(cfg.precision.name), backend)
        data_root = _resolve_data_root(cfg, backend)
        train_loader, val_loader, num_classes = _build_data(cfg, backend, plan, data_root)

        model = build_model(
            cfg.model.name,
            num_classes,
            zero_init_last_bn_gamma=cfg.model.zero_init_last_bn,
            drop_rate=cfg.model.drop_rate,
            drop_path_rate=cfg.model.drop_path_rate,
        )
        model = backend.prepare_model(model, channels_last=cfg.model.channels_last)
        if cfg.bn.group_size != 1 and backend.world_size > 1:
            model = convert_group_sync_batchnorm(model, cfg.bn.group_size, backend.bn_reducer(cfg.bn.group_size))
        lr = scale_lr(cfg.optimizer.lr, cfg.global_batch_size, cfg.base_batch_size, _value(cfg.lr_scaling))
        optimizer = build_optimizer(
            cfg.optimizer.name,
            model,
            lr=lr,
            weight_decay=cfg.optimizer.weight_decay,
            exclude_bn_bias=cfg.optimizer.exclude_bn_bias,
            **_optimizer_options(cfg.optimizer),
        )
        train_model = backend.wrap_model(
            model,
            bucket_mb=cfg.comm.bucket_mb,
            algorithm=_value(cfg.comm.algorithm),
            compress=_value(cfg.comm.compress),
            ranks_per_node=cfg.comm.ranks_per_node,
        )
        if cfg.model.compile:
            train_model = torch.compile(train_model)
        steps_per_epoch = len(train_loader) // plan.accumulation_steps
        sched = cfg.schedule
        start_factor, end_factor = schedule_factors(
            lr, base_lr=cfg.optimizer.lr, warmup_start=_value(sched.warmup_start),
            warmup_start_factor=sched.warmup_start_factor, end_lr=sched.end_lr, end_factor=sched.end_factor,
        )
        scheduler = build_lr_scheduler(
            optimizer,
            name=_value(sched.name),
            steps_per_epoch=steps_per_epoch,
            epochs=cfg.epochs,
            warmup_epochs=sched.warmup_epochs,
            warmup_start_factor=start_factor,
            milestones=sched.milestones,
            gamma=sched.gamma,
            power=sched.power,
            end_factor=end_factor,
        )
        scaler = backend.grad_scaler(precision.loss_scaling, cfg.precision.init_scale, cfg.precision.growth_interval)
        state = TrainState()

        resume = _resume_setting(cfg.resume)
        if resume:
            _resume(
                resume, run_dir / "checkpoints", backend=backend, model_name=cfg.model.name,
                plan=plan, steps_per_epoch=steps_per_epoch, model=model, optimizer=optimizer,
                scheduler=scheduler, scaler=scaler, state=state,
            )

        resolved = {
            "version": __version__,
            "backend": backend.describe(),
            "world_size": backend.world_size,
            "global_batch_size": plan.global_batch_size,
            "per_device_batch_size": plan.per_device,
            "accumulation_steps": plan.accumulation_steps,
            "lr_per_base_batch": cfg.optimizer.lr,
            "base_batch_size": cfg.base_batch_size,
            "lr_scaling": _value(cfg.lr_scaling),
            "lr": lr,
            "optimizer": cfg.optimizer.name,
            "steps_per_epoch": steps_per_epoch,
            "warmup_steps": int(round(sched.warmup_epochs * steps_per_epoch)),
            "precision": precision.name,
            "model": cfg.model.name,
            "num_classes": num_classes,
            "bn_group_size": cfg.bn.group_size,
            "data_root": str(data_root),
            "run_dir": str(run_dir),
        }
        if backend.is_main:
            if raw_cfg is not None:
                (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(raw_cfg), encoding="utf-8")
            log.info(
                "global batch %d = %d per device x %d devices x %d accumulation; lr %.4g per %d "
                "images, %s-scaled to %.4g; %d steps/epoch, %d warmup steps; %s, %s; run dir %s",
                plan.global_batch_size, plan.per_device, plan.world_size, plan.accumulation_steps,
                cfg.optimizer.lr, cfg.base_batch_size, resolved["lr_scaling"], lr, steps_per_epoch,
                resolved["warmup_steps"], precision.name, backend.describe(), run_dir,
            )

        channels_last = cfg.model.channels_last
        main = backend.is_main
        hook_list: list[Any] = [H.DataOrderHook(), H.ProgressHook(enabled=main and cfg.progress)]
        # Agree on a stop every step on CPU/gloo (cheap), every log step on accelerators.
        preemption = PreemptionHook(check_every=1 if backend.device.type == "cpu" else cfg.log_every)
        hook_list.append(preemption)
        if main:  # before EvalHook, so that epoch_stop precedes the epoch's eval_accuracy
            from largebatch.engine.mllog import MLPerfLogHook

            hook_list.append(MLPerfLogHook(run_dir / "mlperf_log.jsonl", target_top1=cfg.target_top1, params={
                "global_batch_size": plan.global_batch_size, "world_size": backend.world_size,
                "opt_name": cfg.optimizer.name, "opt_base_learning_rate": lr,
                "opt_learning_rate_warmup_epochs": cfg.schedule.warmup_epochs, "model": cfg.model.name,
            }))
        hook_list.append(
            H.EvalHook(
                backend.wrap_loader(val_loader, channels_last=channels_last),
                every=cfg.eval_every,
                target_top1=cfg.target_top1,
                stop_at_target=cfg.stop_at_target,
                channels_last=channels_last,
            )
        )
        config_dict = OmegaConf.to_container(raw_cfg, resolve=True) if raw_cfg is not None else None
        hook_list.append(
            H.CheckpointHook(
                run_dir / "checkpoints",
                every_epochs=cfg.checkpoint.every_epochs,
                every_steps=cfg.checkpoint.every_steps,
                keep=cfg.checkpoint.keep,
                extra_state=lambda: {"config": config_dict, "resolved": resolved, "model_name": cfg.model.name},
            )
        )
        if main:
            if cfg.tensorboard:
                hook_list.append(H.TensorBoardHook(run_dir / "tensorboard"))
            hook_list.append(H.JsonlHook(run_dir / "metrics.jsonl"))
        summary_hook = H.SummaryHook(run_dir / "summary.json" if main else None, target_top1=cfg.target_top1, extra=resolved)
        hook_list.append(summary_hook)

        trainer = Trainer(
            model=train_model,
            optimizer=optimizer,
            scheduler=scheduler,
            train_loader=backend.wrap_loader(train_loader, channels_last=channels_last),
            backend=backend,
            epochs=cfg.epochs,
            global_batch_size=plan.global_batch_size,
            accumulation_steps=plan.accumulation_steps,
            label_smoothing=cfg.label_smoothing,
            autocast_dtype=precision.autocast_dtype,
            scaler=scaler,
            log_every=cfg.log_every,
            max_steps=cfg.max_steps,
            non_finite=_value(cfg.non_finite),
            max_skipped_steps=cfg.max_skipped_steps,
            hooks=hook_list,
            state=state,
        )
        try:
            trainer.train()
        finally:
            preemption.uninstall()
        if preemption.preempted:
            raise Preempted(
                f"{trainer.stop_reason} at step {state.step}; checkpoint saved in "
                f"{run_dir / 'checkpoints'}; continue with resume=auto run_dir={run_dir}"
            )
        skipped = getattr(train_loader, "skipped", 0) + getattr(val_loader, "skipped", 0)
        if skipped and main:
            log.warning("%d unreadable image file(s) were skipped (named above in the log)", skipped)
        return summary_hook.summary
    finally:
        backend.shutdown()


def _user_errors() -> tuple[type[BaseException], ...]:
    from largebatch.config import ConfigError
    from largebatch.data.folder import DataError
    from largebatch.engine.checkpoint import CheckpointError
    from largebatch.models import ModelError

    return (UsageError, ConfigError, DataError, CheckpointError, ModelError)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``largebatch-train [key=value ...]``: compose the config and run it."""
    from largebatch.config import ConfigError, compose_config, to_train_config
    from largebatch.engine.loop import NonFiniteLossError
    from largebatch.engine.preemption import Preempted

    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in ("-h", "--help"):
        print(__doc__.strip())
        print("\nusage: largebatch-train [key=value ...]   e.g. optimizer=lars global_batch_size=1024")
        return 0
    try:
        raw = compose_config(args)
        cfg = to_train_config(raw)
        run(cfg, raw)
    except _user_errors() as e:
        print(f"largebatch: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except ValueError as e:
        # Argument checks of the library (optimizer options, BN group size, ...) are
        # ValueErrors with a message written for the user.
        print(f"largebatch: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except NonFiniteLossError as e:
        print(f"largebatch: error: {e}", file=sys.stderr)
        return EXIT_NON_FINITE
    except Preempted as e:
        print(f"largebatch: preempted: {e}", file=sys.stderr)
        return EXIT_PREEMPTED
    except KeyboardInterrupt:
        print("largebatch: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
