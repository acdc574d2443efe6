"""One training job: :func:`run` reads as the list of its steps.

``run(cfg)`` takes a composed, checked ``TrainConfig`` (choices as plain strings; the command
line, ``largebatch.cli``, composes it with Hydra) and: starts the backend, plans the batch
(``largebatch.engine.batch_plan``), makes or finds the run directory, builds data, model,
optimizer and schedule, resumes when asked, and runs the loop with its hooks. Each step is a
builder of ``largebatch.parts`` named by what it builds (``data``, ``model``, ``training``,
``diagnostics``, ``hooks``, ``record``, ``resume``, ``outcome``), which hands the config's plain
values to the library and returns a named type, so nothing below reads the config object. Under
torchrun every rank runs this; rank 0 chooses the run directory and the others receive it, so
a run has exactly one directory.

Under torchrun with ``--max-restarts``, a restarted worker group resumes by itself: without
``run_dir=`` the run directory is ``<output_root>/<model>-<torchrun run id>`` (the same for
every restart), and ``resume`` defaults to ``auto`` once ``TORCHELASTIC_RESTART_COUNT`` > 0.

Errors are the types of ``largebatch.errors``; the callers (``largebatch.cli``,
``largebatch.multirun``, ``largebatch.launch.xla``) turn them into exit codes with
``largebatch.errors.exit_code``.
"""

from __future__ import annotations

import logging
import traceback
from typing import TYPE_CHECKING, Any, Optional, cast

import torch
from omegaconf import DictConfig

from largebatch.batch_schedule import batch_schedule_of
from largebatch.parts.data import channels_last_of, data_of
from largebatch.parts.diagnostics import adaptive_batch_of, noise_scale_of
from largebatch.parts.hooks import run_hooks_of
from largebatch.parts.model import check_model_name, model_of, train_model_of
from largebatch.parts.outcome import eval_out_of_memory, out_of_memory, raise_if_stopped
from largebatch.parts.record import announce, config_of, resolved_of, run_dir_of
from largebatch.parts.resume import resume_of
from largebatch.parts.training import ema_of, optimizer_of, scheduler_of, step_settings_of
from largebatch.engine.batch_plan import BatchPlan, plan_batches
from largebatch.engine.run_log import setup_logging
from largebatch.errors import EvalOutOfMemoryError, StepOutOfMemoryError
from largebatch.resolution import resolution_of

if TYPE_CHECKING:
    from pathlib import Path

    from largebatch.backends.base import Backend
    from largebatch.parts.data import RunData
    from largebatch.config.schema import TrainConfig
    from largebatch.data.contract import Loader
    from largebatch.engine.assemble import RunHooks
    from largebatch.engine.loop import Trainer
    from largebatch.engine.precision import PrecisionPolicy
    from largebatch.engine.run_dir import RunDir

__all__ = ["run"]

log = logging.getLogger("largebatch")


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
    from largebatch.engine.precision import resolve_precision

    run_dir: Optional[RunDir] = None
    data: Optional[RunData] = None
    try:
        plan = plan_batches(cfg.global_batch_size, backend.world_size, cfg.accumulation_steps)
        setup_logging(backend.is_main)
        torch.manual_seed(cfg.seed)
        precision = resolve_precision(cfg.precision.name, backend)
        channels_last = channels_last_of(cfg, backend)
        check_model_name(cfg.model.name)  # a typo is one line before the data set is made
        # The data before the run directory: a data set the batch cannot fill (or a missing
        # data folder) is one line before anything is written.
        data = data_of(cfg, backend, plan, precision.autocast_dtype, channels_last)
        run_dir = run_dir_of(cfg, backend, config_of(raw_cfg))
        trainer, hooks = _trainer(cfg, raw_cfg, backend, plan, precision, data, run_dir.path, channels_last)
        return _train(cfg, plan, trainer, hooks, run_dir.path, data)
    finally:
        if data is not None:
            data.close()
        if run_dir is not None:
            run_dir.release()


def _trainer(cfg: TrainConfig, raw_cfg: Optional[DictConfig], backend: Backend, plan: BatchPlan,
             precision: PrecisionPolicy, data: RunData, run_dir: Path, channels_last: bool) -> tuple[Trainer, RunHooks]:
    """The model, optimizer, schedules and hooks, resumed when asked, as the loop that trains them."""
    from largebatch.data.build import pipeline_of
    from largebatch.engine.assemble import OptionalHooks
    from largebatch.engine.checkpoint_format import RunIdentity
    from largebatch.engine.loop import Trainer, TrainState
    from largebatch.engine.resume import RunParts
    from largebatch.lr import scale_lr

    model = model_of(cfg, backend, data.num_classes, channels_last)
    lr = scale_lr(cfg.optimizer.lr, cfg.global_batch_size, cfg.base_batch_size, cfg.lr_scaling)
    optimizer = optimizer_of(cfg, model, lr)
    ema = ema_of(cfg, model)
    train_model = train_model_of(cfg, backend, model)
    noise_scale = noise_scale_of(cfg, backend, plan, train_model.local_norm_tap)
    steps_per_epoch = len(data.train) // plan.accumulation_steps
    batches = batch_schedule_of(cfg)  # one per run: an adaptive schedule's decisions are shared
    scheduler = scheduler_of(cfg, optimizer, steps_per_epoch, lr, batches)
    scaler = backend.grad_scaler(precision.loss_scaling, cfg.precision.init_scale, cfg.precision.growth_interval)
    state = TrainState()
    config = config_of(raw_cfg)
    loader = pipeline_of(data.train)
    resume_of(cfg, backend, plan, run_dir, steps_per_epoch=steps_per_epoch, num_classes=data.num_classes,
              config=config, loader=loader, parts=RunParts(model=model, optimizer=optimizer, scheduler=scheduler, scaler=scaler,
                                            state=state, ema=ema.ema if ema is not None else None,
                                            noise_scale=noise_scale.tracker if noise_scale is not None else None))
    resolved = resolved_of(cfg, backend, plan, lr=lr, steps_per_epoch=steps_per_epoch, precision=precision.name,
                           batches=batches, num_classes=data.num_classes, data_root=data.root, run_dir=run_dir,
                           channels_last=channels_last, loader=loader)
    if backend.is_main:
        announce(resolved, run_dir, raw_cfg, cfg.epochs, devices=cfg.data.root is not None)
    identity = RunIdentity(model_name=cfg.model.name, config=config, resolved=resolved)
    optional = OptionalHooks(ema=ema, noise_scale=noise_scale, batch=adaptive_batch_of(batches, noise_scale, backend))
    hooks = run_hooks_of(cfg, backend, run_dir, data.val, identity, optional, resolution_of(cfg))
    trainer = Trainer(
        model=train_model.model, optimizer=optimizer, scheduler=scheduler,
        # the device wrapper forwards the Loader's members (set_epoch, skipped, ...)
        train_loader=cast("Loader", backend.wrap_loader(data.train, channels_last=channels_last)),
        backend=backend, settings=step_settings_of(cfg, backend, plan, precision.autocast_dtype, batches),
        scaler=scaler, hooks=hooks.hooks, state=state,
    )
    return trainer, hooks


def _train(cfg: TrainConfig, plan: BatchPlan, trainer: Trainer, hooks: RunHooks, run_dir: Path,
           data: RunData) -> dict[str, Any]:
    """Run the loop; a SIGTERM/SIGINT stop becomes ``Preempted`` (exit 75, resumable), a step
    out of memory one line naming the side and the batch (exit 4)."""
    try:
        trainer.train()
    except StepOutOfMemoryError as err:
        raise out_of_memory(err, sizes=resolution_of(cfg), image_size=cfg.data.image_size, plan=plan,
                            run_dir=run_dir) from None
    finally:
        hooks.preemption.uninstall()
    try:
        raise_if_stopped(trainer, hooks, run_dir)
    except EvalOutOfMemoryError as err:  # the epoch was saved first
        raise eval_out_of_memory(err, eval_side=cfg.data.resolution.eval_size or cfg.data.image_size, plan=plan,
                                 run_dir=run_dir) from None
    data.warn_skipped(trainer.backend.is_main)
    return hooks.summary.summary
