"""The hooks of a training run, in the order they must run.

``build_run_hooks`` turns plain settings into the hook list the :class:`~largebatch.engine.loop.Trainer`
takes. Order matters where hooks read each other's results:

1. ``DataOrderHook`` (set the epoch's shuffle and resume position), ``ProgressHook``,
   ``EmaHook`` (the weight EMA, updated before anything checkpoints or evaluates it);
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
from typing import Any, Callable, Iterable, Mapping, Optional

from largebatch.engine import hooks as H
from largebatch.engine.loop import Hook
from largebatch.engine.preemption import PreemptionHook

__all__ = ["RunHooks", "build_run_hooks"]


@dataclass
class RunHooks:
    """The hook list, and the two hooks the caller reads after training."""

    hooks: list[Hook]
    preemption: PreemptionHook  # .preempted; .uninstall() restores the signal handlers
    summary: H.SummaryHook  # .summary: the run's result


def build_run_hooks(
    *,
    run_dir: Path,
    is_main: bool,
    val_loader: Iterable,
    agree_every: int,
    progress: bool = True,
    eval_every: int = 1,
    target_top1: Optional[float] = None,
    stop_at_target: bool = False,
    channels_last: bool = False,
    checkpoint_every_epochs: int = 1,
    checkpoint_every_steps: int = 0,
    checkpoint_keep: int = 3,
    checkpoint_extra: Optional[Callable[[], dict[str, Any]]] = None,
    tensorboard: bool = True,
    mlperf_params: Optional[Mapping[str, Any]] = None,
    summary_extra: Optional[Mapping[str, Any]] = None,
    ema: Any = None,
    ema_every: int = 1,
    ema_target: str = "raw",
) -> RunHooks:
    """The hooks of one run, writing under ``run_dir`` (rank 0 only).

    Args:
        run_dir: the run directory: checkpoints/, tensorboard/, metrics.jsonl,
            mlperf_log.jsonl, summary.json.
        is_main: True on rank 0, the only rank that writes files or shows progress.
        val_loader: this rank's validation loader, already on the device.
        agree_every: steps between the all-rank agreements on a SIGTERM/SIGINT stop
            (1 where a collective is cheap, e.g. CPU/gloo; the log interval on accelerators).
        progress: tqdm bar on rank 0.
        eval_every, target_top1, stop_at_target, channels_last: as for ``EvalHook``.
        checkpoint_every_epochs, checkpoint_every_steps, checkpoint_keep: as for ``CheckpointHook``.
        checkpoint_extra: what each checkpoint adds (resolved config, model name).
        tensorboard: write TensorBoard scalars.
        mlperf_params: hyperparameters for the MLPerf log's ``run_start`` block.
        summary_extra: the run's resolved settings, copied into summary.json.
        ema: a timm ``ModelEmaV3`` of the model (None: no weight EMA): updated every
            ``ema_every`` optimizer steps, evaluated beside the model, checkpointed as ``ema``.
        ema_target: ``raw`` or ``ema``, the top-1 that best_top1 and the time to target use.
    """
    hooks: list[Hook] = [H.DataOrderHook(), H.ProgressHook(enabled=is_main and progress)]
    ema_hook = None
    if ema is not None:
        from largebatch.engine.ema import EmaHook

        ema_hook = EmaHook(ema, every=ema_every)
        hooks.append(ema_hook)
        extra = checkpoint_extra or dict
        checkpoint_extra = lambda: {**extra(), "ema": ema_hook.state_dict()}  # noqa: E731
    preemption = PreemptionHook(check_every=agree_every)
    hooks.append(preemption)
    if is_main:
        from largebatch.engine.mllog import MLPerfLogHook

        hooks.append(MLPerfLogHook(run_dir / "mlperf_log.jsonl", target_top1=target_top1, params=mlperf_params,
                                   top1_of=ema_target))
    hooks.append(H.EvalHook(val_loader, every=eval_every, target_top1=target_top1,
                            stop_at_target=stop_at_target, channels_last=channels_last,
                            ema_model=ema_hook.eval_model if ema_hook is not None else None,
                            target=ema_target))
    hooks.append(H.CheckpointHook(
        run_dir / "checkpoints", every_epochs=checkpoint_every_epochs, every_steps=checkpoint_every_steps,
        keep=checkpoint_keep, extra_state=checkpoint_extra or dict,
    ))
    if is_main:
        if tensorboard:
            hooks.append(H.TensorBoardHook(run_dir / "tensorboard"))
        hooks.append(H.JsonlHook(run_dir / "metrics.jsonl"))
    summary = H.SummaryHook(run_dir / "summary.json" if is_main else None, target_top1=target_top1,
                            extra=dict(summary_extra or {}))
    hooks.append(summary)
    return RunHooks(hooks, preemption, summary)
