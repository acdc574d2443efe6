"""Loop hooks, one concern each: data order, progress, metrics files, evaluation,
time-to-accuracy, checkpoints, summary. Only rank 0 writes files or prints progress."""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

import torch

from largebatch.engine.checkpoint import CheckpointSaveError, checkpoint_name, save_checkpoint
from largebatch.engine.checkpoint_format import RunCheckpoint, RunIdentity
from largebatch.engine.checkpoint_retention import prune_checkpoints
from largebatch.engine.compile import unwrap_model
from largebatch.engine.evaluate import evaluate
from largebatch.engine.loop import Hook
from largebatch.engine.out_of_memory import allocation_text, is_allocation_failure
from largebatch.engine.rng_state import capture_rng_state
from largebatch.engine.run_files import AppendLog, record_failure, run_file_error
from largebatch.errors import EvalOutOfMemoryError

__all__ = [
    "BatchLogHook",
    "CheckpointHook",
    "CheckpointSettings",
    "DataOrderHook",
    "EvalHook",
    "EvalSettings",
    "JsonlHook",
    "LogOnChangeHook",
    "ProgressHook",
    "ResolutionLogHook",
    "SummaryHook",
    "TensorBoardHook",
    "target_check",
]

log = logging.getLogger("largebatch")


class DataOrderHook(Hook):
    """Sets the epoch's shuffle and skips the batches a resumed run has already seen.

    The position is ``epoch_step x accumulation_steps x per-device batch`` samples of this
    rank's part (times the epoch's factor under a batch schedule). ``ShardedSampler`` deals one permutation round-robin (``perm[r::w]``), so
    after k steps of global batch B the ranks together have read ``perm[:k*B]`` at any world
    size: a run resumed at another world size (same global batch) continues with the next
    unseen images.

    The loader does the skip: ``set_epoch(epoch, skip_batches=k)`` (the torchvision loader
    turns it into ``sampler.set_start(k x batch_size)``; the DALI loader never reads them).
    """

    def before_epoch(self) -> None:
        t = self.trainer
        # loader batches this rank has read: a step of batch factor k reads k base steps' batches
        done = t.state.epoch_step * t.settings.accumulation_steps * t.settings.batch_factor(t.state.epoch)
        if done:
            t.train_loader.set_epoch(t.state.epoch, skip_batches=done)
        else:
            t.train_loader.set_epoch(t.state.epoch)


class ProgressHook(Hook):
    """tqdm bar per epoch (img/s, loss, lr) and one log line per log step and epoch."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.bar: Any = None

    def before_epoch(self) -> None:
        if not self.enabled:
            return
        from tqdm import tqdm

        t = self.trainer
        self.bar = tqdm(
            total=t.steps_in_epoch(t.state.epoch),
            initial=t.state.epoch_step,
            desc=f"epoch {t.state.epoch + 1}/{t.settings.epochs}",
            unit="step",
            leave=False,
            dynamic_ncols=True,
        )

    def after_step(self) -> None:
        if self.bar is not None:
            self.bar.update(1)

    def after_log(self, metrics: dict[str, Any]) -> None:
        if self.bar is not None:
            loss = "skipped" if metrics["loss"] is None else f"{metrics['loss']:.3f}"  # every step non-finite
            self.bar.set_postfix(loss=loss, lr=f"{metrics['lr']:.3g}", img_s=f"{metrics['img_per_s']:.0f}")

    def after_epoch(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def after_eval(self, metrics: dict[str, float]) -> None:
        t = self.trainer
        ema = (f"  EMA top-1 {metrics['ema_top1']:.2f}%  top-5 {metrics['ema_top5']:.2f}%"
               if "ema_top1" in metrics else "")
        log.info(
            "epoch %d/%d  step %d  val top-1 %.2f%%  top-5 %.2f%%%s  (%d images)  elapsed %.1fs",
            t.state.epoch, t.settings.epochs, t.state.step, metrics["top1"], metrics["top5"], ema,
            metrics["total"], t.elapsed(),
        )

    def after_train(self) -> None:
        self.after_epoch()


class LogOnChangeHook(Hook):
    """One log line before an epoch whose value differs from the previous epoch's (and before the
    first epoch this process trains, a resumed one included). A subclass says what the value is
    (:meth:`value`; None: nothing to report this epoch, and the previous value is kept) and the
    line (:meth:`line`, given the previous value or None)."""

    def __init__(self) -> None:
        self._last: Any = None

    def value(self) -> Any:
        raise NotImplementedError

    def line(self, value: Any, was: Any) -> str:
        raise NotImplementedError

    def before_epoch(self) -> None:
        value = self.value()
        if value is None:
            return
        if value != self._last:
            log.info("%s", self.line(value, self._last))
        self._last = value


class ResolutionLogHook(LogOnChangeHook):
    """Progressive resizing: the epoch's training crop side, when it changes.

    ``sizes`` has ``size_at(epoch)`` (a :class:`~largebatch.resolution.ResolutionSchedule`)."""

    def __init__(self, sizes: Any) -> None:
        super().__init__()
        self.sizes = sizes

    def value(self) -> int:
        return int(self.sizes.size_at(self.trainer.state.epoch))

    def line(self, value: int, was: Optional[int]) -> str:
        t = self.trainer
        since = f" (was {was} px)" if was is not None else ""
        return f"epoch {t.state.epoch + 1}/{t.settings.epochs}: training crops of {value} px{since}"


class BatchLogHook(LogOnChangeHook):
    """Batch-size control: the epoch's global batch, when it changes, with the lr the phase starts at."""

    def value(self) -> Optional[int]:
        t = self.trainer
        return None if t.settings.batch_schedule is None else int(t.global_batch_size)

    def line(self, value: int, was: Optional[int]) -> str:
        t = self.trainer
        s, epoch = t.settings, t.state.epoch
        k = s.batch_factor(epoch)
        how = (f"{s.accumulation_steps * k} micro-batch(es)" if s.batch_schedule.via == "accumulation"
               else f"{s.accumulation_steps} micro-batch(es) of {k}x the per-device batch")
        since = f" (was {was})" if was is not None else ""
        return (f"epoch {epoch + 1}/{s.epochs}: global batch {value}{since}, {how} per step, "
                f"{t.steps_in_epoch(epoch)} steps this epoch, lr x{s.batch_schedule.lr_ratio(epoch):.4g} of the base batch's")


class _ScalarWriter(Hook):
    """Common timing bookkeeping for the metric writers."""

    def before_epoch(self) -> None:
        self._epoch_start = time.perf_counter()

    def epoch_time(self) -> float:
        return time.perf_counter() - getattr(self, "_epoch_start", time.perf_counter())


class TensorBoardHook(_ScalarWriter):
    """Scalars: train loss, lr, img/s, val top-1/top-5, epoch time, time to target (once).

    ``SummaryWriter`` writes from a background thread; a failed write (disk full, a
    directory turned read-only) ends that thread and surfaces at the next call. The hook then
    turns TensorBoard off with one log line naming the file and the errno (the thread's own
    traceback is not printed); training and checkpoints go on, and the failure is raised when
    training ends (exit 74).
    """

    def __init__(self, log_dir: str | os.PathLike) -> None:
        import threading

        from torch.utils.tensorboard import SummaryWriter

        self.log_dir = Path(log_dir)
        self.failure: Any = None
        self.wrote_time_to_target = False
        self._thread_error: Optional[BaseException] = None
        self._threads_before = set(threading.enumerate())
        self._previous_excepthook = threading.excepthook
        threading.excepthook = self._excepthook  # before the writer starts its thread
        try:
            self.writer: Any = SummaryWriter(log_dir=str(log_dir))  # writes its first event at once
        except OSError as e:
            self.writer = None
            self._turn_off(e, step=0)

    def _excepthook(self, args: Any) -> None:
        """The writer thread's failure is kept for the main thread to report (no traceback)."""
        if args.thread not in self._threads_before and type(args.thread).__module__.startswith("tensorboard"):
            self._thread_error = args.exc_value
        else:
            self._previous_excepthook(args)

    def _restore_excepthook(self) -> None:
        import threading

        if threading.excepthook == self._excepthook:
            threading.excepthook = self._previous_excepthook

    def _call(self, method: str, *args: Any) -> None:
        if self.writer is None:
            return
        try:
            if self._thread_error is not None:
                raise self._thread_error
            getattr(self.writer, method)(*args)
        except OSError as e:
            self._turn_off(e, step=self.trainer.state.step)

    def _turn_off(self, err: OSError, *, step: int) -> None:
        writer, self.writer = self.writer, None
        try:
            if writer is not None:
                writer.close()
        except OSError:
            pass  # the same failure again: already being reported
        self._restore_excepthook()
        events = sorted(self.log_dir.glob("events.out.tfevents.*"), key=lambda p: p.stat().st_mtime)
        self.failure = run_file_error(
            "TensorBoard events", events[-1] if events else self.log_dir, err,
            f"TensorBoard was turned off at step {step}; training went on and its checkpoints were written")
        log.error("%s", self.failure)

    def after_log(self, metrics: dict[str, Any]) -> None:
        step = self.trainer.state.step
        if metrics["loss"] is not None:  # None: every step since the last log skipped (non-finite)
            self._call("add_scalar", "train/loss", metrics["loss"], step)
        self._call("add_scalar", "train/lr", metrics["lr"], step)
        self._call("add_scalar", "train/img_per_s", metrics["img_per_s"], step)
        for key in ("noise_scale", "grad_sq_norm", "noise_trace"):  # where the run measures it
            if key in metrics:
                self._call("add_scalar", f"train/{key}", metrics[key], step)

    def after_eval(self, metrics: dict[str, float]) -> None:
        s = self.trainer.state
        self._call("add_scalar", "val/top1", metrics["top1"], s.step)
        self._call("add_scalar", "val/top5", metrics["top5"], s.step)
        self._call("add_scalar", "val/loss", metrics["loss"], s.step)
        if "ema_top1" in metrics:
            self._call("add_scalar", "val/ema_top1", metrics["ema_top1"], s.step)
            self._call("add_scalar", "val/ema_top5", metrics["ema_top5"], s.step)
        self._call("add_scalar", "val/top1_vs_wall_s", metrics["top1"], int(self.trainer.elapsed()))
        if s.time_to_target_s is not None and not self.wrote_time_to_target:
            self.wrote_time_to_target = True  # once, at the evaluation that reached the target
            self._call("add_scalar", "val/time_to_target_s", s.time_to_target_s, s.step)

    def after_epoch(self) -> None:
        self._call("add_scalar", "train/epoch_time_s", self.epoch_time(), self.trainer.state.epoch)
        self._call("flush")

    def after_train(self) -> None:
        self._call("close")
        self._restore_excepthook()
        if self.failure is not None and self.trainer.failure is None:
            self.trainer.failure = self.failure  # raised once training has ended: exit 74


class JsonlHook(_ScalarWriter):
    """``metrics.jsonl``: one JSON object a line for train logs, evaluations and the summary."""

    def __init__(self, path: str | os.PathLike, *, train_sizes: Any = None) -> None:
        self.path = Path(path)
        self.file = AppendLog(self.path, "the metrics file")
        self.train_sizes = train_sizes  # progressive resizing: the epoch record's image_size

    def write(self, kind: str, **fields: Any) -> None:
        s = self.trainer.state
        record = {"kind": kind, "epoch": s.epoch, "step": s.step, "time_s": round(self.trainer.elapsed(), 3)}
        record.update(fields)
        record_failure(self.trainer, self.file.write_line(json.dumps(record)))

    def before_train(self) -> None:
        """A resumed run (or one started again in the same directory) continues from the step
        its checkpoint holds: the records of later steps, which a stopped run wrote and this one
        does again, are moved to ``metrics-abandoned.jsonl`` so the file stays one timeline
        (before, a SIGKILL's redone steps appeared twice, ``time_s`` going backwards)."""
        step = self.trainer.state.step
        aside = self.path.with_name("metrics-abandoned.jsonl")
        moved = self.file.set_aside(lambda line: _record_step(line) <= step, aside)
        if moved:
            log.warning("%s: %d record(s) of steps past %d, which this run trains again, moved to %s",
                        self.path, moved, step, aside)

    def after_log(self, metrics: dict[str, Any]) -> None:
        self.write("train", **metrics)

    def after_eval(self, metrics: dict[str, float]) -> None:
        self.write("eval", **metrics)

    def before_epoch(self) -> None:
        super().before_epoch()
        self._epoch = self.trainer.state.epoch  # the epoch trained (state.epoch moves on at its end)

    def after_epoch(self) -> None:
        extra: dict[str, Any] = {} if self.train_sizes is None else {"image_size": self.train_sizes.size_at(self._epoch)}
        if self.trainer.settings.batch_schedule is not None:  # batch-size control: the epoch's global batch
            extra["global_batch_size"] = self.trainer.settings.batch_schedule.batch_at(self._epoch)
        self.write("epoch", epoch_time_s=round(self.epoch_time(), 3), **extra)

    def after_train(self) -> None:
        record_failure(self.trainer, self.file.close())


def _record_step(line: str) -> float:
    """The ``step`` of a metrics.jsonl line (-inf for one without: it is kept)."""
    try:
        step = json.loads(line).get("step")
    except (ValueError, AttributeError):
        return float("-inf")
    return step if isinstance(step, (int, float)) else float("-inf")


def target_check(
    top1: float,
    wall_s: float,
    *,
    target_top1: Optional[float],
    stop_at_target: bool,
    time_to_target_s: Optional[float],
) -> tuple[Optional[float], bool]:
    """The time-to-accuracy rule for one evaluation: ``(time_to_target_s, stop)``.

    The time to target is the ``wall_s`` of the *first* evaluation with ``top1 >=
    target_top1`` (percent) and never changes after; ``stop`` is true when this evaluation
    is at or above target and ``stop_at_target`` is set. No target: ``(None, False)``.
    """
    reached = target_top1 is not None and top1 >= target_top1
    if reached and time_to_target_s is None:
        time_to_target_s = wall_s
    return time_to_target_s, reached and stop_at_target


@dataclass(frozen=True)
class EvalSettings:
    """What :class:`EvalHook` does: evaluate every ``every`` epochs (and after the last), stop at
    ``target_top1`` with ``stop_at_target``, feed channels-last batches; ``top1_of`` (``raw`` |
    ``ema``) names the top-1 that the best top-1 and the time to target use."""

    every: int = 1
    target_top1: Optional[float] = None
    stop_at_target: bool = False
    channels_last: bool = False
    top1_of: str = "raw"


class EvalHook(Hook):
    """Exact evaluation every ``every`` epochs and after the last; time-to-accuracy.

    The time to target is the training wall time (evaluation included, as MLPerf counts it)
    from the first training step to the end of the first evaluation at or above
    ``target_top1``; with ``stop_at_target`` the run stops there (:class:`EvalSettings`).

    With a weight EMA (``ema_model`` returns its module, the same on every rank) the EMA is
    evaluated too: the metrics gain ``ema_top1``, ``ema_top5``, ``ema_loss``; the settings'
    ``top1_of`` (``raw`` | ``ema``) names the top-1 that the best top-1 and the time to target use.
    """

    def __init__(
        self,
        val_loader: Iterable,
        settings: EvalSettings = EvalSettings(),
        *,
        ema_model: Optional[Callable[[], torch.nn.Module]] = None,
    ) -> None:
        target = settings.top1_of
        if target not in ("raw", "ema") or (target == "ema" and ema_model is None):
            raise ValueError(f"top1_of={target!r}: 'raw', or 'ema' with an ema_model")
        self.val_loader = val_loader
        self.every = max(1, settings.every)
        self.target_top1 = settings.target_top1
        self.stop_at_target = settings.stop_at_target
        self.channels_last = settings.channels_last
        self.ema_model = ema_model
        self.target_key = "ema_top1" if target == "ema" else "top1"

    def after_epoch(self) -> None:
        t = self.trainer
        epoch = t.state.epoch
        if epoch % self.every and epoch != t.settings.epochs:
            return
        if hasattr(self.val_loader, "set_epoch"):  # a loader (a list of batches has no epoch)
            # the epoch just trained (state.epoch counts it done): its evaluation side and shape
            self.val_loader.set_epoch(epoch - 1)
        try:
            metrics = self._evaluate()
        except (RuntimeError, MemoryError) as err:  # torch.OutOfMemoryError is a RuntimeError
            if not is_allocation_failure(err):
                raise
            # Not raised from here: the epoch's checkpoint comes after the evaluation, and the
            # traceback would hold the evaluation's tensors while it is written. The run stops
            # (the checkpoint hook saves the epoch) and the loop's caller raises it (exit 4).
            cause, batch = allocation_text(err), getattr(self.val_loader, "batch_size", None) or 0
            t.failure = t.failure or EvalOutOfMemoryError(
                f"the evaluation after epoch {epoch} ran out of memory with {batch} images per device ({cause})",
                step=t.state.step, epoch=epoch, per_device_batch=batch, cause=cause)
            t.request_stop(f"the evaluation after epoch {epoch} ran out of memory")
            return
        metrics["epoch"] = epoch
        metrics["wall_s"] = round(t.elapsed(), 3)
        self._record(metrics)

    def _evaluate(self) -> dict[str, Any]:
        """The model's (and the EMA's) metrics on every validation image."""
        t = self.trainer
        metrics = evaluate(
            t.model, self.val_loader, backend=t.backend, autocast_dtype=t.settings.autocast_dtype,
            channels_last=self.channels_last,
        )
        if self.ema_model is not None:
            ema = evaluate(
                self.ema_model(), self.val_loader, backend=t.backend, autocast_dtype=t.settings.autocast_dtype,
                channels_last=self.channels_last,
            )
            metrics.update(ema_top1=ema["top1"], ema_top5=ema["top5"], ema_loss=ema["loss"],
                           top1_of="ema" if self.target_key == "ema_top1" else "raw")
        return metrics

    def _record(self, metrics: dict[str, Any]) -> None:
        """The evaluation into the loop state (best top-1, time to target) and the other hooks."""
        t = self.trainer
        epoch = metrics["epoch"]
        s = t.state
        s.evals.append(metrics)
        reported = metrics[self.target_key]
        if reported > s.best_top1:
            s.best_top1, s.best_epoch = reported, epoch
        s.time_to_target_s, stop = target_check(
            reported, metrics["wall_s"], target_top1=self.target_top1,
            stop_at_target=self.stop_at_target, time_to_target_s=s.time_to_target_s,
        )
        if stop:
            t.request_stop(f"target top-1 {self.target_top1}% reached")
        t.call("after_eval", metrics)


@dataclass(frozen=True)
class CheckpointSettings:
    """When :class:`CheckpointHook` writes: every ``every_epochs`` epochs (0: only at the end),
    every ``every_steps`` optimizer steps (0: never mid-epoch); it keeps the newest ``keep``."""

    every_epochs: int = 1
    every_steps: int = 0
    keep: int = 3


class CheckpointHook(Hook):
    """Atomic checkpoints every N epochs / N steps and at the end; keeps the newest K.

    A checkpoint holds a :class:`~largebatch.engine.checkpoint_format.RunCheckpoint` (what it
    holds, and its format, are written down there): the model, optimizer, LR schedule and
    loss-scaler states, the loop state, the RNG states, the run's shape (world size, global
    batch, steps per epoch), ``identity`` (model name, config, resolved settings) and, given
    ``ema`` (the :class:`~largebatch.engine.ema.EmaHook`), the EMA weights, and given
    ``noise_scale`` (the ``NoiseScaleHook``), the noise scale's averages. Only rank 0
    writes: every rank seeds the same global RNG and draws from it in step, so rank 0's RNG
    state is every rank's.
    Before writing, the non-finite loss counters are checked and then every parameter and
    buffer (a finite loss can come with an infinite BN ``running_var``): non-finite state is
    never saved, under either policy. A failed write (disk full) is raised on every rank as
    :class:`CheckpointSaveError`.
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        settings: CheckpointSettings = CheckpointSettings(),
        *,
        identity: RunIdentity = RunIdentity(),
        ema: Any = None,
        noise_scale: Any = None,
    ) -> None:
        self.directory = Path(directory)
        self.every_epochs = settings.every_epochs
        self.every_steps = settings.every_steps
        self.keep = settings.keep
        self.identity = identity
        self.ema = ema
        self.noise_scale = noise_scale
        self.last_saved_step: Optional[int] = None

    def state(self, rng: Optional[dict[str, Any]] = None) -> dict[str, Any]:
        """The checkpoint's contents; ``rng`` from :func:`capture_rng_state` (a collective,
        which :meth:`save` makes on every rank), or this rank's own when None."""
        t = self.trainer
        return RunCheckpoint(
            model=unwrap_model(t.model).state_dict(),  # DDP / torch.compile wrappers add key prefixes
            optimizer=t.optimizer.state_dict(),
            scheduler=t.scheduler.state_dict(),
            scaler=t.scaler.state_dict() if t.scaler is not None else None,
            train_state=t.state.state_dict() | {"elapsed_s": t.elapsed()},
            rng=rng if rng is not None else capture_rng_state(t.backend),
            ema=self.ema.state_dict() if self.ema is not None else None,
            noise_scale=self.noise_scale.tracker.state_dict() if self.noise_scale is not None else None,
            world_size=t.backend.world_size,
            global_batch_size=t.settings.global_batch_size,
            accumulation_steps=t.settings.accumulation_steps,
            steps_per_epoch=t.steps_per_epoch,
            identity=self.identity,
        ).to_state()

    def save(self) -> None:
        t = self.trainer
        if t.state.step == self.last_saved_step:
            return
        t.check_non_finite()
        t.guard.check_state(t.state.step)
        self.last_saved_step = t.state.step
        rng = capture_rng_state(t.backend)  # every rank: each rank's device generator goes in
        failure: Optional[tuple[str, str, Optional[int]]] = None
        if t.backend.is_main:
            try:
                path = save_checkpoint(self.state(rng), self.directory, checkpoint_name(t.state.epoch, t.state.step))
                log.debug("saved %s", path)
                if self.keep > 0:
                    prune_checkpoints(self.directory, self.keep, written=path)
            except CheckpointSaveError as e:
                failure = (str(e), str(e.path), e.errno)
        # Doubles as the barrier: no rank goes on before rank 0 has written (or failed).
        failure = t.backend.broadcast_object(failure)
        if failure is not None:
            raise CheckpointSaveError(failure[0], path=Path(failure[1]), errno=failure[2])

    def before_train(self) -> None:
        if self.trainer.state.step:  # resumed: the checkpoint of this step is on disk
            self.last_saved_step = self.trainer.state.step

    def after_step(self) -> None:
        t = self.trainer
        if self.every_steps and t.state.step % self.every_steps == 0 and t.state.epoch_step < t.steps_in_epoch(t.state.epoch):
            self.save()

    def after_epoch(self) -> None:
        t = self.trainer
        if (self.every_epochs and t.state.epoch % self.every_epochs == 0) or t.state.epoch == t.settings.epochs:
            self.save()

    def after_train(self) -> None:
        t = self.trainer
        if t.stop_reason is not None:
            self.save()  # stopped early: keep the position (a no-op if just saved)


def _batches_trained(t: Any) -> dict[str, Any]:
    """The global batch each epoch trained with (``global_batch_size`` is the base batch, which a
    batch schedule or the adaptive batch raises): one entry per epoch begun, and the last one."""
    s = t.state
    begun = s.epoch + (1 if s.epoch_step else 0)  # an epoch stopped inside it counts
    batches = [t.settings.global_batch_size * t.settings.batch_factor(e) for e in range(begun)]
    return {"global_batch_size_per_epoch": batches, "final_global_batch_size": batches[-1] if batches else None}


class SummaryHook(Hook):
    """The final summary line and ``summary.json`` (and, given ``noise_scale``, the noise scale's
    ``noise_scale_final`` and line). ``global_batch_size`` there is the base batch; the batches
    trained are ``global_batch_size_per_epoch`` (one per epoch begun) and ``final_global_batch_size``."""

    def __init__(self, path: Optional[str | os.PathLike], *, target_top1: Optional[float], extra: dict[str, Any],
                 noise_scale: Any = None) -> None:
        self.path = Path(path) if path else None
        self.noise_scale = noise_scale  # a NoiseScaleHook: summary field and closing line
        self.target_top1 = target_top1
        self.extra = extra
        self.summary: dict[str, Any] = {}

    def after_train(self) -> None:
        t = self.trainer
        s = t.state
        last = s.evals[-1] if s.evals else {}
        self.summary = {
            "best_top1": round(s.best_top1, 3) if s.evals else None,
            "best_epoch": s.best_epoch if s.evals else None,
            "final_top1": round(last["top1"], 3) if last else None,
            "final_top5": round(last["top5"], 3) if last else None,
            **({"final_ema_top1": round(last["ema_top1"], 3), "final_ema_top5": round(last["ema_top5"], 3)}
               if "ema_top1" in last else {}),
            "epochs": s.epoch,
            "steps": s.step,
            "wall_time_s": round(s.elapsed_s, 2),
            "img_per_s": round(s.images_seen / s.elapsed_s, 1) if s.elapsed_s > 0 else None,
            "target_top1": self.target_top1,
            "time_to_target_s": s.time_to_target_s,
            "stop_reason": t.stop_reason,
            "skipped_steps": s.skipped_steps,
            **self.extra,
            **_batches_trained(t),
        }
        noise_line = None
        if self.noise_scale is not None:
            fields, noise_line = self.noise_scale.report(t.global_batch_size)
            self.summary.update(fields)
        if not t.backend.is_main:
            return
        if self.path is not None:
            try:
                self.path.write_text(json.dumps(self.summary, indent=2) + "\n", encoding="utf-8")
            except OSError as e:
                record_failure(t, run_file_error(
                    "the run summary", self.path, e,
                    "training ended and its checkpoints were written; resume=auto continues from the last one"))
        best = f"{s.best_top1:.2f}% (epoch {s.best_epoch})" if s.evals else "n/a (no evaluation)"
        weights = " (EMA weights)" if self.extra.get("top1_of") == "ema" else ""
        if self.target_top1 is None:
            target = "no target set"
        elif s.time_to_target_s is not None:
            target = f"time to {self.target_top1:g}%: {s.time_to_target_s:.1f}s"
        else:
            target = f"target {self.target_top1:g}% not reached"
        skipped = f", {s.skipped_steps} step(s) skipped for a non-finite loss" if s.skipped_steps else ""
        print(
            f"largebatch: best val top-1{weights} {best}, {s.epoch} epochs, {s.step} steps{skipped}, "
            f"training wall time {s.elapsed_s:.1f}s, {target}",
            flush=True,
        )
        if noise_line is not None:
            print(f"largebatch: {noise_line}", flush=True)
