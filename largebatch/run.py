"""One training job: :func:`run` reads as the list of its steps.

``run(cfg)`` takes a composed, checked ``TrainConfig`` (choices as plain strings; the command
line, ``largebatch.cli``, composes it with Hydra) and: starts the backend, plans the batch
(``largebatch.engine.batch_plan``), makes or finds the run directory, builds data, model,
optimizer and schedule, resumes when asked, and runs the loop with its hooks. Each
step is a short builder that hands the config's plain values to the library
(``largebatch.data.build``, ``largebatch.engine.assemble``, ...), so nothing below this module
reads the config object. Under torchrun every rank runs this; rank 0 chooses the run
directory and the others receive it, so a run has exactly one directory.

Under torchrun with ``--max-restarts``, a restarted worker group resumes by itself: without
``run_dir=`` the run directory is ``<output_root>/<model>-<torchrun run id>`` (the same for
every restart), and ``resume`` defaults to ``auto`` once ``TORCHELASTIC_RESTART_COUNT`` > 0.

Errors are the types of ``largebatch.errors``; the callers (``largebatch.cli``,
``largebatch.multirun``, ``largebatch.launch.xla``) turn them into exit codes with
``largebatch.errors.exit_code``.
"""

from __future__ import annotations

import logging
import os
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Optional, Sequence, cast

import torch
from omegaconf import DictConfig, OmegaConf

from largebatch import __version__
from largebatch.engine.batch_plan import BatchPlan, batch_too_large, plan_batches
from largebatch.engine.run_log import log_into_run_dir, setup_logging
from largebatch.errors import Preempted, StepOutOfMemoryError, TooFewSamplesError, UsageError

if TYPE_CHECKING:
    from largebatch.backends.base import Backend
    from largebatch.batch_schedule import BatchSchedule
    from largebatch.config.schema import TrainConfig
    from largebatch.data.contract import Loader
    from largebatch.resolution import ResolutionSchedule

__all__ = ["run"]

log = logging.getLogger("largebatch")


def _resume_setting(resume: Optional[str]) -> Optional[str]:
    """``resume``; a restarted torchrun worker group always resumes (``auto``)."""
    if resume is None and int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0) > 0:
        log.info("torchrun restart %s: resuming from the newest checkpoint (resume=auto)",
                 os.environ["TORCHELASTIC_RESTART_COUNT"])
        return "auto"
    return resume


def _channels_last(cfg: TrainConfig, backend: Backend) -> bool:
    """``model.channels_last``; unset: on CUDA devices (NHWC convolutions use the tensor cores).
    Called once per run; the model, the loaders (``LoaderSpec``) and the hooks get the answer."""
    if cfg.model.channels_last is None:
        return backend.device.type == "cuda"
    return bool(cfg.model.channels_last)


def _data(cfg: TrainConfig, backend: Backend, plan: BatchPlan, dtype: Optional[torch.dtype],
          channels_last: bool) -> tuple[Path, Loader, Loader, int]:
    """The data folder and this rank's loaders (``largebatch.data.build``), from one ``LoaderSpec``."""
    from largebatch.data.build import build_run_loaders, resolve_data_root
    from largebatch.data.contract import LoaderSpec

    data = cfg.data
    syn = data.synthetic
    root = resolve_data_root(
        data.root, loader=data.loader, workers=data.workers, backend=backend,
        synthetic=dict(num_classes=syn.classes, train_per_class=syn.train_per_class,
                       val_per_class=syn.val_per_class, image_size=syn.image_size, seed=syn.seed),
    )
    device = backend.device
    if device.type == "cuda" and device.index is None:  # DALI's mixed decode needs the GPU's index
        device = torch.device("cuda", backend.local_rank)  # gpu-only
    elif device.type != "cuda":  # pipelines decode on a GPU or on the host (an XLA device: the host)
        device = torch.device("cpu")
    spec = LoaderSpec(
        image_size=data.image_size, batch_size=plan.per_device, workers=data.workers, seed=cfg.seed,
        crop_scale=cast(tuple[float, float], tuple(data.crop_scale)),  # a pair: check_ranges
        val_crop_ratio=data.val_crop_ratio, rank=backend.rank,
        world_size=backend.world_size, device=device, dtype=dtype or torch.float32, channels_last=channels_last,
        shuffle_buffer=data.shuffle_buffer, accumulation_steps=plan.accumulation_steps,
        **_resolution_options(cfg),
    )
    try:
        train, val, num_classes = build_run_loaders(root, spec, loader=data.loader, shards=data.shards,
                                                    backend=backend)
    except TooFewSamplesError as err:
        raise batch_too_large(plan, num_samples=err.num_samples) from None
    return root, train, val, num_classes


def _resolution_options(cfg: TrainConfig) -> dict[str, Any]:
    """The ``LoaderSpec`` options of ``data.resolution``: the training side and crop scale per
    epoch, the evaluation side and shape per epoch."""
    res = cfg.data.resolution
    return dict(train_sizes=_resolution(cfg), val_image_size=res.eval_size, rect_val=res.rect_val,
                crop_scale_steps=tuple((int(e), float(m)) for e, m in res.crop_scale_steps),
                val_follows_train=res.eval_follows_train, rect_val_from_epoch=res.rect_val_from_epoch)


def _resolution(cfg: TrainConfig) -> Optional[ResolutionSchedule]:
    """``data.resolution``'s training schedule (a ``ResolutionSchedule``), None when off."""
    from largebatch.resolution import ResolutionSchedule

    res = cfg.data.resolution
    return ResolutionSchedule.of(getattr(res.schedule, "value", res.schedule), steps=[list(p) for p in res.steps], start_epoch=res.start_epoch,
                                 end_epoch=res.end_epoch, start_size=res.start_size, end_size=res.end_size,
                                 multiple=res.multiple, image_size=cfg.data.image_size, epochs=cfg.epochs)


def _batch_schedule(cfg: TrainConfig) -> Optional[BatchSchedule]:
    """``batch_schedule``'s global batch per epoch (a ``BatchSchedule``; with ``adaptive.enabled``
    an ``AdaptiveBatchSchedule``, whose decisions the run makes: build it once per run), None when off."""
    from largebatch.batch_schedule import AdaptiveBatchSchedule, BatchSchedule

    bs = cfg.batch_schedule
    if bs.adaptive.enabled:
        a = bs.adaptive
        return AdaptiveBatchSchedule.of_adaptive(
            global_batch_size=cfg.global_batch_size, raise_at=a.raise_at, growth=a.growth,
            max_batch=a.max_global_batch, via=getattr(bs.via, "value", bs.via), lr=getattr(bs.lr, "value", bs.lr),
            lr_scaling=getattr(cfg.lr_scaling, "value", cfg.lr_scaling))
    return BatchSchedule.of([list(p) for p in bs.steps], global_batch_size=cfg.global_batch_size, epochs=cfg.epochs,
                            via=getattr(bs.via, "value", bs.via), lr=getattr(bs.lr, "value", bs.lr),
                            lr_scaling=getattr(cfg.lr_scaling, "value", cfg.lr_scaling))


def _check_model_name(name: str) -> None:
    """``model.name`` is a timm model, checked before the data and the run directory are made;
    the error also names the presets of the ``model=`` config group."""
    from importlib import resources

    from largebatch.errors import ModelError
    from largebatch.models import check_model_name

    try:
        check_model_name(name)
    except ModelError as err:
        presets = sorted(p.name[:-len(".yaml")] for p in (resources.files("largebatch.conf") / "model").iterdir()
                         if p.name.endswith(".yaml"))
        raise ModelError(f"{err}; set model.name= to a timm model, or choose a preset of the model= group: "
                         f"{', '.join(presets)} "
                         f"(model={presets[-1]})") from None


def _model(cfg: TrainConfig, backend: Backend, num_classes: int, channels_last: bool) -> Any:
    """The timm model on the device, with grouped BN (``bn.group_size``) across ranks."""
    from largebatch.models import build_model
    from largebatch.nn import convert_group_sync_batchnorm

    m = cfg.model
    model = build_model(m.name, num_classes, zero_init_last_bn_gamma=m.zero_init_last_bn,
                        drop_rate=m.drop_rate, drop_path_rate=m.drop_path_rate, fc_init_std=m.fc_init_std)
    model = backend.prepare_model(model, channels_last=channels_last)
    if cfg.bn.group_size != 1 and backend.world_size > 1:
        model = convert_group_sync_batchnorm(model, cfg.bn.group_size, backend.bn_reducer(cfg.bn.group_size))
    return model


def _train_model(cfg: TrainConfig, backend: Backend, model: Any) -> Any:
    """The model as the loop calls it: DDP with the comm hook (tapped for the noise scale's local
    gradient norm, ``diagnostics.noise_scale.enabled``), then ``torch.compile`` (``model.compile``)."""
    from largebatch.engine.compile import compile_model

    comm = cfg.comm
    train_model = backend.wrap_model(model, bucket_mb=comm.bucket_mb, algorithm=comm.algorithm,
                                     compress=comm.compress, ranks_per_node=comm.ranks_per_node,
                                     tap_local_norm=cfg.diagnostics.noise_scale.enabled)
    return compile_model(train_model, cfg.model.compile, shapes=_training_shapes(cfg, backend.world_size))


def _training_shapes(cfg: TrainConfig, world_size: int = 1) -> int:
    """Distinct (per-device batch, side) pairs the compiled model is fed over the run's epochs:
    progressive resizing's sides times a per-device batch schedule's factors, twice that where
    the noise scale's probe runs (its two half batches are another shape at every side)."""
    shapes = _batch_shapes(cfg)
    ns = cfg.diagnostics.noise_scale
    # plan_noise_scale's choice: the probe runs in one process without accumulation
    probe = ns.enabled and ns.probe_every > 0 and world_size == 1 and cfg.accumulation_steps == 1
    return 2 * shapes if probe else shapes


def _batch_shapes(cfg: TrainConfig) -> int:
    from largebatch.batch_schedule import AdaptiveBatchSchedule

    sizes, batches = _resolution(cfg), _batch_schedule(cfg)
    side_count = len({sizes.size_at(e) if sizes is not None else cfg.data.image_size for e in range(cfg.epochs)})
    if batches is None or batches.via != "per_device":
        return side_count
    if isinstance(batches, AdaptiveBatchSchedule):  # any side with any factor it may reach
        return side_count * len(batches.possible_factors())
    return len({(batches.factor_at(e), sizes.size_at(e) if sizes is not None else cfg.data.image_size)
                for e in range(cfg.epochs)})


def _step_settings(cfg: TrainConfig, backend: Backend, plan: BatchPlan, autocast_dtype: Optional[torch.dtype],
                   batches: Optional[BatchSchedule]) -> Any:
    """How the loop runs a step (``largebatch.engine.loop.StepSettings``) from the config."""
    from largebatch.engine.compile import uses_cuda_graphs
    from largebatch.engine.loop import StepSettings

    return StepSettings(
        epochs=cfg.epochs, global_batch_size=plan.global_batch_size, accumulation_steps=plan.accumulation_steps,
        label_smoothing=cfg.label_smoothing, autocast_dtype=autocast_dtype, log_every=cfg.log_every,
        max_steps=cfg.max_steps, non_finite=cfg.non_finite, max_skipped_steps=cfg.max_skipped_steps,
        cuda_graph_steps=uses_cuda_graphs(cfg.model.compile) and backend.device.type == "cuda",
        batch_schedule=batches,
    )


def _optimizer_options(opt: Any) -> dict[str, Any]:
    """The optimizer-specific options the config sets (None = the optimizer's default)."""
    names = ("momentum", "nesterov", "trust_coefficient", "eps", "lr_in_momentum", "betas", "foreach")
    out = {n: getattr(opt, n) for n in names if getattr(opt, n) is not None}
    if "betas" in out:
        out["betas"] = tuple(out["betas"])
    return out


def _optimizer(cfg: TrainConfig, model: Any, lr: float) -> Any:
    from largebatch.optim import build_optimizer

    opt = cfg.optimizer
    return build_optimizer(opt.name, model, lr=lr, weight_decay=opt.weight_decay,
                           exclude_bn_bias=opt.exclude_bn_bias, decay_bias=opt.decay_bias, **_optimizer_options(opt))


def _scheduler(cfg: TrainConfig, optimizer: Any, steps_per_epoch: int, lr: float,
               batches: Optional[BatchSchedule]) -> Any:
    """Warmup + decay; ``warmup_start=base_lr`` and ``end_lr`` resolved against the scaled ``lr``."""
    from largebatch.lr import build_lr_scheduler, schedule_factors

    s = cfg.schedule
    start_factor, end_factor = schedule_factors(
        lr, base_lr=cfg.optimizer.lr, warmup_start=s.warmup_start,
        warmup_start_factor=s.warmup_start_factor, end_lr=s.end_lr, end_factor=s.end_factor,
    )
    return build_lr_scheduler(
        optimizer, name=s.name, steps_per_epoch=steps_per_epoch, epochs=cfg.epochs,
        warmup_epochs=s.warmup_epochs, warmup_start_factor=start_factor,
        milestones=s.milestones, gamma=s.gamma, power=s.power, end_factor=end_factor,
        points=[list(p) for p in s.points], batch_schedule=batches,
    )


def _resolved(cfg: TrainConfig, backend: Backend, plan: BatchPlan, **facts: Any) -> dict[str, Any]:
    """What the run resolved (summary.json, checkpoints): sizes, lr, precision, paths."""
    steps_per_epoch = facts["steps_per_epoch"]
    return {
        "version": __version__,
        "backend": backend.describe(),
        "world_size": backend.world_size,
        "global_batch_size": plan.global_batch_size,
        "per_device_batch_size": plan.per_device,
        "accumulation_steps": plan.accumulation_steps,
        "lr_per_base_batch": cfg.optimizer.lr,
        "base_batch_size": cfg.base_batch_size,
        "lr_scaling": cfg.lr_scaling,
        "lr": facts["lr"],
        "optimizer": cfg.optimizer.name,
        "steps_per_epoch": steps_per_epoch,
        "warmup_epochs": cfg.schedule.warmup_epochs,
        "warmup_steps": int(round(cfg.schedule.warmup_epochs * steps_per_epoch)),
        # batch-size control: the global batch per epoch, or null (global_batch_size every epoch)
        "batch_schedule": facts["batches"].describe() if facts["batches"] is not None else None,
        "precision": facts["precision"],
        "model": cfg.model.name,
        "compile": cfg.model.compile,
        "channels_last": facts["channels_last"],
        "num_classes": facts["num_classes"],
        "bn_group_size": cfg.bn.group_size,
        "ema_decay": cfg.ema.decay if cfg.ema.enabled else None,
        "top1_of": cfg.ema.target,  # raw | ema: the weights best_top1 and time_to_target_s measure
        "data_root": str(facts["data_root"]),
        "run_dir": str(facts["run_dir"]),
        # the ImageNet recipe's derived values, each with its source (recipe.mode=auto), or null
        "recipe": dict(cfg.recipe.derived) or None,
        "recipe_warnings": list(cfg.recipe.warnings),
    }


def _announce(resolved: dict[str, Any], run_dir: Path, raw_cfg: Optional[DictConfig]) -> None:
    """Rank 0: write config.yaml and log the batch and lr arithmetic once."""
    if raw_cfg is not None:
        path = run_dir / "config.yaml"
        try:
            path.write_text(OmegaConf.to_yaml(raw_cfg), encoding="utf-8")
        except OSError as e:
            from largebatch.engine.run_files import run_file_error

            raise run_file_error("the config", path, e, "nothing was trained; free space (or make it writable) and run again") from None
    r = resolved
    log.info(
        "global batch %d = %d per device x %d devices x %d accumulation; lr %.4g per %d "
        "images, %s-scaled to %.4g; %d steps/epoch, %d warmup steps; %s, %s; run dir %s",
        r["global_batch_size"], r["per_device_batch_size"], r["world_size"], r["accumulation_steps"],
        r["lr_per_base_batch"], r["base_batch_size"], r["lr_scaling"], r["lr"], r["steps_per_epoch"],
        r["warmup_steps"], r["precision"], r["backend"], run_dir,
    )
    if r["batch_schedule"] is not None:
        log.info("batch schedule: global batch %s; steps/epoch and warmup steps above are the first "
                 "batch's, the schedule runs on epochs", r["batch_schedule"])
    if r["recipe"]:
        from largebatch.imagenet_recipe import describe

        log.info("%s", "\n".join(describe(r["recipe"], r["global_batch_size"], r["model"])))
    for warning in r["recipe_warnings"]:
        log.warning("%s", warning)


def _warn_long_warmup(epochs: int, resolved: dict[str, Any]) -> None:
    """Rank 0: a warmup as long as the planned run or longer never reaches the peak lr (the
    factor is 1 from step ``warmup_steps`` on, steps count from 0), so the run trains on a
    schedule it did not ask for; say so once. A warning, not an error: a paper preset run for
    an epoch or two to check it works is a fair use. ``max_steps`` is not the plan: it stops a
    run early without changing its schedule."""
    total = epochs * resolved["steps_per_epoch"]
    if resolved["warmup_steps"] >= total:
        log.warning(
            "schedule.warmup_epochs=%g is %d warmup steps, not fewer than the run's %d (epochs=%d x %d "
            "steps): the lr never reaches its peak %.4g; lower schedule.warmup_epochs or raise epochs",
            resolved["warmup_epochs"], resolved["warmup_steps"], total, epochs, resolved["steps_per_epoch"],
            resolved["lr"],
        )


def _ema(cfg: TrainConfig, model: Any) -> Any:
    """The weight EMA's hook (``ema.enabled``; ``largebatch.engine.ema.EmaSettings``), or None."""
    from largebatch.engine.ema import EmaSettings

    e = cfg.ema
    if not e.enabled:
        return None
    return EmaSettings(decay=e.decay, warmup=e.warmup, warmup_gamma=e.warmup_gamma, warmup_power=e.warmup_power,
                       min_decay=e.min_decay, update_after_step=e.update_after_step, every=e.every).hook(model)


def _noise_scale(cfg: TrainConfig, backend: Backend, plan: BatchPlan) -> Any:
    """The gradient noise scale's hook (``diagnostics.noise_scale``), or None when disabled; after
    ``_train_model`` (which taps the local gradient norm: DDP's buckets, or XLA's ``.grad``)."""
    from largebatch.engine.noise_scale_hook import NoiseScaleHook, NoiseScalePlan, plan_noise_scale

    ns = cfg.diagnostics.noise_scale
    if not ns.enabled:
        return None
    from largebatch.engine.compile import uses_cuda_graphs

    tap = backend.local_norm_tap
    where = plan_noise_scale(world_size=backend.world_size, accumulation_steps=plan.accumulation_steps,
                             per_device_batch=plan.per_device, local_norm_tap=tap, probe_every=ns.probe_every)
    if where.source == "probe" and backend.device.type == "xla":
        # its half-batch passes and RNG fork are untried in the XLA step graph
        where = NoiseScalePlan(None, reason="the probe does not run on XLA; use accumulation_steps >= 2")
    if where.source == "probe" and uses_cuda_graphs(cfg.model.compile) and backend.device.type == "cuda":
        # the half batch would replay into the step's CUDA-graph buffers
        where = NoiseScalePlan(None, reason="the probe does not run with CUDA graphs (model.compile=reduce-overhead)")
    if backend.is_main:
        if where.source is None:
            log.info("noise scale: not measured (%s)", where.reason)
        elif where.source == "probe":
            log.info("noise scale: measured by a probe every %d steps (%d vs %d images per gradient): one extra "
                     "backward per probe, ~%.0f%% of steps, EMA beta %g", where.probe_every, where.batch_small,
                     where.batch_big, 100 / where.probe_every, ns.beta)
        else:
            log.info("noise scale: measured from %s (%d vs %d images per gradient), EMA beta %g",
                     where.source, where.batch_small, where.batch_big, ns.beta)
    return NoiseScaleHook(where, beta=ns.beta, local_norm_tap=tap)


def _adaptive_batch(batches: Optional[BatchSchedule], noise_scale: Any, backend: Backend) -> Any:
    """The adaptive batch schedule's hook (``batch_schedule.adaptive``), or None; it needs the
    noise scale measured, and says in one line how to measure it where it is not."""
    from largebatch.batch_schedule import AdaptiveBatchSchedule

    if not isinstance(batches, AdaptiveBatchSchedule):
        return None
    if noise_scale is None or noise_scale.plan.source is None:
        why = "diagnostics.noise_scale.enabled=false" if noise_scale is None else noise_scale.plan.reason
        raise UsageError(
            f"batch_schedule.adaptive.enabled=true raises the batch from the measured gradient noise scale, which "
            f"this run does not measure ({why}): enable diagnostics.noise_scale, and on one process use "
            f"accumulation_steps >= 2 or diagnostics.noise_scale.probe_every=N")
    from largebatch.engine.adaptive_batch import AdaptiveBatchHook

    return AdaptiveBatchHook(batches, noise_scale.tracker, is_main=backend.is_main)


def _hooks(cfg: TrainConfig, backend: Backend, run_dir: Path, val_loader: Iterable, identity: Any, optional: Any) -> Any:
    """The run's hooks (``largebatch.engine.assemble``), their settings read from the config."""
    from largebatch.engine.assemble import LogSettings, build_run_hooks
    from largebatch.engine.hooks import CheckpointSettings, EvalSettings

    channels_last = identity.resolved["channels_last"]  # resolved once (_channels_last)
    ckpt = cfg.checkpoint
    return build_run_hooks(
        run_dir=run_dir, is_main=backend.is_main,
        val_loader=backend.wrap_loader(val_loader, channels_last=channels_last),
        # Agree on a stop every step on CPU/gloo (cheap), every log step on accelerators.
        agree_every=1 if backend.device.type == "cpu" else cfg.log_every,
        identity=identity,
        evaluation=EvalSettings(every=cfg.eval_every, target_top1=cfg.target_top1, stop_at_target=cfg.stop_at_target,
                                channels_last=channels_last, top1_of=cfg.ema.target),
        checkpointing=CheckpointSettings(every_epochs=ckpt.every_epochs, every_steps=ckpt.every_steps, keep=ckpt.keep),
        logging=LogSettings(progress=cfg.progress, tensorboard=cfg.tensorboard, train_sizes=_resolution(cfg)),
        optional=optional,
    )


def _out_of_memory(err: StepOutOfMemoryError, cfg: TrainConfig, plan: BatchPlan, run_dir: Path) -> StepOutOfMemoryError:
    """The loop's out-of-memory error in the run's terms: the batch and the side it failed at, the
    settings to lower, and how to go on. The checkpoints written before are untouched; a resume
    may change accumulation_steps (the same global batch in smaller micro-batches) but not the
    sides or the global batch (``largebatch.engine.resume.RUN_KEYS``), so those take a new run_dir."""
    from largebatch.engine.checkpoint import list_checkpoints
    from largebatch.resolution import side_setting

    sizes = _resolution(cfg)
    side = sizes.size_at(err.epoch) if sizes is not None else cfg.data.image_size
    lower_side = f"the side ({side_setting(sizes, cfg.data.image_size, side)})"
    halves = err.per_device_batch % 2 == 0
    lower_micro = (f"the images per device (accumulation_steps={2 * plan.accumulation_steps} keeps global_batch_size="
                   f"{plan.global_batch_size} in micro-batches of {err.per_device_batch // 2})")
    saved = list_checkpoints(run_dir / "checkpoints")
    if saved and halves:
        advice = (f"lower {lower_micro} and resume=auto run_dir={run_dir} continues from its last checkpoint "
                  f"({saved[-1].name}), or lower {lower_side} in a new run_dir (a resumed run keeps its sides)")
    elif saved:
        advice = f"lower {lower_side} or global_batch_size in a new run_dir (a resumed run keeps both)"
    else:
        advice = (f"lower {lower_side} or {lower_micro if halves else 'global_batch_size'} and run again "
                  f"(no checkpoint was written yet)")
    return StepOutOfMemoryError(
        f"step {err.step} (epoch {err.epoch + 1}) ran out of memory: {err.per_device_batch} images per device at "
        f"{side} px ({err.cause}); {advice}",
        step=err.step, epoch=err.epoch, per_device_batch=err.per_device_batch, cause=err.cause)


def _train(cfg: TrainConfig, plan: BatchPlan, trainer: Any, hooks: Any, run_dir: Path,
           loaders: Sequence[Loader]) -> dict[str, Any]:
    """Run the loop; a SIGTERM/SIGINT stop becomes ``Preempted`` (exit 75, resumable), a step
    out of memory one line naming the side and the batch (exit 4)."""
    try:
        trainer.train()
    except StepOutOfMemoryError as err:
        raise _out_of_memory(err, cfg, plan, run_dir) from None
    finally:
        hooks.preemption.uninstall()
    if trainer.failure is not None:  # a run file could not be written (a checkpoint was saved)
        raise trainer.failure
    if hooks.preemption.preempted:
        raise Preempted(
            f"{trainer.stop_reason} at step {trainer.state.step}; checkpoint saved in "
            f"{run_dir / 'checkpoints'}; continue with resume=auto run_dir={run_dir}",
            signal_name=hooks.preemption.signal_name,
        )
    skipped = sum(loader.skipped for loader in loaders)
    if skipped and trainer.backend.is_main:
        log.warning("%d unreadable image file(s) were skipped (named above in the log)", skipped)
    return hooks.summary.summary


def run(cfg: TrainConfig, raw_cfg: Optional[DictConfig] = None) -> dict[str, Any]:
    """Run one training job described by a ``TrainConfig`` (choices as plain strings); return its summary."""
    from largebatch.backends import build_backend

    backend = build_backend(cfg.backend.name, timeout_s=cfg.backend.timeout_s)
    backend.start()
    backend.autotune_kernels(bool(cfg.backend.cudnn_benchmark))
    try:
        return _run_job(cfg, raw_cfg, backend)
    except BaseException as err:
        # The traceback's frames hold the job's model (DDP holds the process group) until
        # the caller handles the error; let them go so that shutdown() can destroy the group.
        traceback.clear_frames(err.__traceback__)
        raise
    finally:
        backend.shutdown()


def _run_job(cfg: TrainConfig, raw_cfg: Optional[DictConfig], backend: Backend) -> dict[str, Any]:
    """The job on a started backend; everything it builds is released when it returns."""
    from largebatch.engine.assemble import OptionalHooks
    from largebatch.engine.checkpoint_format import RunIdentity
    from largebatch.engine.loop import Trainer, TrainState
    from largebatch.engine.precision import resolve_precision
    from largebatch.engine.resume import ResumeCheck, RunParts, resume_run
    from largebatch.engine.run_dir import make_run_dir
    from largebatch.lr import scale_lr

    run_dir_state = None
    loaders: tuple[Any, ...] = ()
    try:
        plan = plan_batches(cfg.global_batch_size, backend.world_size, cfg.accumulation_steps)
        setup_logging(backend.is_main)
        torch.manual_seed(cfg.seed)
        precision = resolve_precision(cfg.precision.name, backend)
        channels_last = _channels_last(cfg, backend)
        _check_model_name(cfg.model.name)  # a typo is one line before the data set is made
        # The data before the run directory: a data set the batch cannot fill (or a missing
        # data folder) is one line before anything is written.
        data_root, train_loader, val_loader, num_classes = _data(cfg, backend, plan, precision.autocast_dtype,
                                                                 channels_last)
        loaders = (train_loader, val_loader)
        if len(train_loader) < plan.accumulation_steps:  # whole micro-batches, but no optimizer step
            raise batch_too_large(plan, batches_per_rank=len(train_loader))
        run_dir_state = make_run_dir(run_dir=cfg.run_dir, output_root=cfg.output_root,
                                     model_name=cfg.model.name, resume=cfg.resume, backend=backend)
        run_dir = run_dir_state.path
        log_into_run_dir(run_dir)
        for note in run_dir_state.notes:
            log.warning("%s", note)
        model = _model(cfg, backend, num_classes, channels_last)
        lr = scale_lr(cfg.optimizer.lr, cfg.global_batch_size, cfg.base_batch_size, cfg.lr_scaling)
        optimizer = _optimizer(cfg, model, lr)
        ema = _ema(cfg, model)
        train_model = _train_model(cfg, backend, model)
        noise_scale = _noise_scale(cfg, backend, plan)
        steps_per_epoch = len(train_loader) // plan.accumulation_steps
        batches = _batch_schedule(cfg)  # one per run: an adaptive schedule's decisions are shared
        scheduler = _scheduler(cfg, optimizer, steps_per_epoch, lr, batches)
        scaler = backend.grad_scaler(precision.loss_scaling, cfg.precision.init_scale, cfg.precision.growth_interval)
        state = TrainState()
        # a DictConfig becomes a dict with str keys (the config schema's)
        config = cast(dict[str, Any], OmegaConf.to_container(raw_cfg, resolve=True)) if raw_cfg is not None else None
        resume = _resume_setting(cfg.resume)
        if resume:
            resume_run(
                resume, run_dir / "checkpoints", backend=backend,
                check=ResumeCheck(model_name=cfg.model.name, optimizer_name=cfg.optimizer.name,
                                  global_batch_size=plan.global_batch_size, per_device=plan.per_device,
                                  steps_per_epoch=steps_per_epoch, num_classes=num_classes, config=config),
                parts=RunParts(model=model, optimizer=optimizer, scheduler=scheduler, scaler=scaler, state=state,
                               ema=ema.ema if ema is not None else None,
                               noise_scale=noise_scale.tracker if noise_scale is not None else None),
            )
        resolved = _resolved(cfg, backend, plan, lr=lr, steps_per_epoch=steps_per_epoch, precision=precision.name,
                             batches=batches,
                             num_classes=num_classes, data_root=data_root, run_dir=run_dir,
                             channels_last=channels_last)
        if backend.is_main:
            _announce(resolved, run_dir, raw_cfg)
            _warn_long_warmup(cfg.epochs, resolved)
        identity = RunIdentity(model_name=cfg.model.name, config=config, resolved=resolved)
        optional = OptionalHooks(ema=ema, noise_scale=noise_scale, batch=_adaptive_batch(batches, noise_scale, backend))
        hooks = _hooks(cfg, backend, run_dir, val_loader, identity, optional)
        trainer = Trainer(
            model=train_model, optimizer=optimizer, scheduler=scheduler,
            # the device wrapper forwards the Loader's members (set_epoch, skipped, ...)
            train_loader=cast("Loader", backend.wrap_loader(train_loader, channels_last=channels_last)),
            backend=backend, settings=_step_settings(cfg, backend, plan, precision.autocast_dtype, batches), scaler=scaler,
            hooks=hooks.hooks, state=state,
        )
        return _train(cfg, plan, trainer, hooks, run_dir, (train_loader, val_loader))
    finally:
        for loader in loaders:  # now, not in the garbage collection of the process-group shutdown
            loader.close()
        if run_dir_state is not None:
            run_dir_state.release()
