"""How a run ends, in the run's terms: a step out of memory restated with the side, the batch
and the settings to lower; a stop by signal as ``Preempted`` with how to continue."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Optional

from largebatch.errors import EvalOutOfMemoryError, Preempted, StepOutOfMemoryError

if TYPE_CHECKING:
    from largebatch.engine.assemble import RunHooks
    from largebatch.engine.batch_plan import BatchPlan
    from largebatch.engine.loop import Trainer
    from largebatch.resolution import ResolutionSchedule

__all__ = ["eval_out_of_memory", "out_of_memory", "preempted", "raise_if_stopped"]


def out_of_memory(err: StepOutOfMemoryError, *, sizes: Optional[ResolutionSchedule], image_size: int,
                  plan: BatchPlan, run_dir: Path) -> StepOutOfMemoryError:
    """The loop's out-of-memory error in the run's terms: the batch and the side it failed at, the
    settings to lower, and how to go on. The checkpoints written before are untouched; a resume
    may change accumulation_steps (the same global batch in smaller micro-batches) but not the
    sides or the global batch (``largebatch.engine.resume.RUN_KEYS``), so those take a new run_dir."""
    from largebatch.engine.checkpoint import list_checkpoints
    from largebatch.resolution import side_setting

    side = sizes.size_at(err.epoch) if sizes is not None else image_size
    lower_side = f"the side ({side_setting(sizes, image_size, side)})"
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


def eval_out_of_memory(err: EvalOutOfMemoryError, *, eval_side: int, plan: BatchPlan,
                       run_dir: Path) -> EvalOutOfMemoryError:
    """An evaluation out of memory in the run's terms: the epoch's checkpoint (saved before the
    error was raised) and the settings to lower. Evaluation batches hold the images of one
    training micro-batch, so ``accumulation_steps`` lowers them too and a resume may change it."""
    from largebatch.engine.checkpoint import list_checkpoints

    saved = list_checkpoints(run_dir / "checkpoints")
    kept = f"the epoch is saved ({saved[-1].name})" if saved else "no checkpoint could be written"
    halves = err.per_device_batch % 2 == 0 and err.per_device_batch > 1
    lower = (f"accumulation_steps={2 * plan.accumulation_steps} (evaluation batches of {err.per_device_batch // 2}, "
             f"global_batch_size={plan.global_batch_size} kept)" if halves else "the evaluation side")
    return EvalOutOfMemoryError(
        f"the evaluation after epoch {err.epoch} ran out of memory: {err.per_device_batch} images per device at "
        f"{eval_side} px ({err.cause}); {kept}: set {lower} and resume=auto run_dir={run_dir} continues with it",
        step=err.step, epoch=err.epoch, per_device_batch=err.per_device_batch, cause=err.cause)


def raise_if_stopped(trainer: Trainer, hooks: RunHooks, run_dir: Path) -> None:
    """After the loop: raise the run-file error that ended it (a checkpoint was saved), or the
    stop by signal as ``Preempted`` (:func:`preempted`); nothing after a run to its end."""
    if trainer.failure is not None:
        raise trainer.failure
    stopped = preempted(trainer, hooks, run_dir)
    if stopped is not None:
        raise stopped


def preempted(trainer: Trainer, hooks: RunHooks, run_dir: Path) -> Optional[Preempted]:
    """A stop by SIGTERM/SIGINT as ``Preempted`` (exit 75, resumable) naming how to continue, or None."""
    if not hooks.preemption.preempted:
        return None
    return Preempted(
        f"{trainer.stop_reason} at step {trainer.state.step}; checkpoint saved in "
        f"{run_dir / 'checkpoints'}; continue with resume=auto run_dir={run_dir}",
        signal_name=hooks.preemption.signal_name,
    )
