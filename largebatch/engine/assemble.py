"""The hooks of a training run, in the order they must run.

``build_run_hooks`` turns the run's settings objects into the hook list the :class:`~largebatch.engine.loop.Trainer`
takes. Order matters where hooks read each other's results:

1. ``DataOrderHook`` (set the epoch's shuffle and resume position), ``ProgressHook``,
   ``EmaHook`` (the weight EMA, updated before anything checkpoints or evaluates it),
   ``NoiseScaleHook`` (the gradient noise scale, read by the checkpoint and the summary);
2. ``PreemptionHook`` (SIGTERM/SIGINT -> a stop all ranks agree on);
3. ``MLPerfLogHook`` (rank 0) before ``EvalHook``, so ``epoch_stop`` precedes the epoch's
   ``eval_accuracy``;
4. ``EvalHook`` (exact evaluation, time to target) before ``CheckpointHook``, so a checkpoint
   holds the epoch's evaluation;
5. ``TensorBoardHook``, ``JsonlHook`` (rank 0), ``SummaryHook`` last (it reads every result).

Only rank 0 writes files: the other ranks get the hooks that compute (evaluation, preemption,
checkpoint agreement) and a ``SummaryHook`` that writes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Optional

from largebatch.engine import hooks as H
from largebatch.engine.checkpoint_format import RunIdentity
from largebatch.engine.loop import Hook
from largebatch.engine.preemption import PreemptionHook

__all__ = ["LogSettings", "OptionalHooks", "RunHooks", "build_run_hooks"]


@dataclass
class RunHooks:
    """The hook list, and the two hooks the caller reads after training."""

    hooks: list[Hook]
    preemption: PreemptionHook  # .preempted; .uninstall() restores the signal handlers
    summary: H.SummaryHook  # .summary: the run's result


@dataclass(frozen=True)
class LogSettings:
    """What rank 0 shows and writes besides the checkpoints: a tqdm bar (``progress``) and
    TensorBoard scalars (``tensorboard``); metrics.jsonl, mlperf_log.jsonl and summary.json
    always. ``train_sizes``: progressive resizing's schedule (anything with ``size_at(epoch)``,
    a :class:`~largebatch.resolution.ResolutionSchedule`): each epoch's training crop side goes
    into the run log when it changes and into metrics.jsonl's epoch record; None: a fixed side."""

    progress: bool = True
    tensorboard: bool = True
    train_sizes: Optional[Any] = None


@dataclass(frozen=True)
class OptionalHooks:
    """Hooks a run adds when configured, which other hooks read (None: not in this run).

    ``ema``: the weight EMA's ``EmaHook``: updated before anything checkpoints or evaluates
    it, evaluated beside the model, checkpointed as ``ema``. ``noise_scale``: the
    ``NoiseScaleHook`` (``largebatch.engine.noise_scale_hook``): checkpointed as
    ``noise_scale``, reported in summary.json and the closing lines.
    """

    ema: Optional[Any] = None
    noise_scale: Optional[Any] = None
    batch: Optional[Hook] = None  # the adaptive batch schedule's hook: first, before anything reads the batch


# the MLPerf log's run_start hyperparameters, from the keys of a run's resolved settings
_MLPERF_PARAMS = {"global_batch_size": "global_batch_size", "world_size": "world_size",
                  "opt_name": "optimizer", "opt_base_learning_rate": "lr",
                  "opt_learning_rate_warmup_epochs": "warmup_epochs", "model": "model"}


def build_run_hooks(
    *,
    run_dir: Path,
    is_main: bool,
    val_loader: Iterable,
    agree_every: int,
    identity: RunIdentity = RunIdentity(),
    evaluation: H.EvalSettings = H.EvalSettings(),
    checkpointing: H.CheckpointSettings = H.CheckpointSettings(),
    logging: LogSettings = LogSettings(),
    optional: OptionalHooks = OptionalHooks(),
) -> RunHooks:
    """The hooks of one run, writing under ``run_dir`` (rank 0 only).

    Args:
        run_dir: the run directory: checkpoints/, tensorboard/, metrics.jsonl,
            mlperf_log.jsonl, summary.json.
        is_main: True on rank 0, the only rank that writes files or shows progress.
        val_loader: this rank's validation loader, already on the device.
        agree_every: steps between the all-rank agreements on a SIGTERM/SIGINT stop
            (1 where a collective is cheap, e.g. CPU/gloo; the log interval on accelerators).
        identity: what the run says about itself: written into each checkpoint; its
            ``resolved`` settings are copied into summary.json and give the MLPerf log's
            hyperparameters.
        evaluation, checkpointing: the ``EvalHook``'s and ``CheckpointHook``'s settings.
        logging: the progress bar and TensorBoard.
        optional: the weight EMA's and the noise scale's hooks, where the run has them.
    """
    sizes = logging.train_sizes
    hooks: list[Hook] = [*([optional.batch] if optional.batch is not None else []), H.DataOrderHook(),
                         H.ProgressHook(enabled=is_main and logging.progress)]
    if sizes is not None and is_main:
        hooks.append(H.ResolutionLogHook(sizes))
    if is_main:
        hooks.append(H.BatchLogHook())
    ema, noise_scale = optional.ema, optional.noise_scale
    hooks += [h for h in (ema, noise_scale) if h is not None]
    preemption = PreemptionHook(check_every=agree_every)
    hooks.append(preemption)
    resolved = identity.resolved
    if is_main:
        from largebatch.engine.mllog import MLPerfLogHook

        params = {k: resolved[r] for k, r in _MLPERF_PARAMS.items() if r in resolved}
        hooks.append(MLPerfLogHook(run_dir / "mlperf_log.jsonl", target_top1=evaluation.target_top1, params=params,
                                   top1_of=evaluation.top1_of))
    hooks.append(H.EvalHook(val_loader, evaluation, ema_model=ema.eval_model if ema is not None else None))
    hooks.append(H.CheckpointHook(run_dir / "checkpoints", checkpointing, identity=identity, ema=ema,
                                  noise_scale=noise_scale))
    if is_main:
        if logging.tensorboard:
            hooks.append(H.TensorBoardHook(run_dir / "tensorboard"))
        hooks.append(H.JsonlHook(run_dir / "metrics.jsonl", train_sizes=sizes))
    summary = H.SummaryHook(run_dir / "summary.json" if is_main else None, target_top1=evaluation.target_top1,
                            extra=dict(resolved), noise_scale=noise_scale)
    hooks.append(summary)
    return RunHooks(hooks, preemption, summary)
