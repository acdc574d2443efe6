"""The training loop: a few dozen lines, with hooks around it.

Event order (each hook sees the events it defines, in the order the hooks were given)::

    before_train
    for epoch in epochs:
        before_epoch                      # data order for the epoch (resumable mid-epoch)
        for step in epoch:                # one optimizer step = accumulation_steps micro-batches
            run_step                      # no host read here (see largebatch.engine.nonfinite):
                after_backward(i)             #   after micro-batch i's backward (i = 0..n-1), before
                                          #   the optimizer step; at i = n-1 .grad is the step's
                                          #   (all-reduced) gradient, still loss-scaled; a failed
                                          #   allocation here or reading the step's batch is
                                          #   StepOutOfMemoryError (engine.out_of_memory)
            after_step                    # checkpoints every N steps, stop requests (preemption)
            after_log(metrics)            # every log_every steps and at an epoch's last step:
                                          # the one read-back: the loss and the hooks'
                                          # log_values (device scalars), and the non-finite
                                          # check (policy stop|skip)
        after_epoch                       # state.epoch now counts this epoch as done:
                                          # evaluation (-> after_eval(metrics)), checkpoint
    after_train                           # summary; runs in `finally`, also on errors

The loss is accumulated on the device and read back to the host only on log steps, so a
step never waits for the device (and on XLA the step graph stays the same). The LR schedule
advances once per optimizer step that ran: a step an fp16 loss scaler skipped (overflow)
does not move it. ``max_steps`` is checked before each step, so a run resumed at
``max_steps`` runs no further step.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from largebatch.defaults import LOG_EVERY, MAX_SKIPPED_STEPS
from largebatch.engine.nonfinite import NonFiniteGuard, NonFiniteLossError
from largebatch.engine.out_of_memory import step_memory
from largebatch.errors import UsageError

if TYPE_CHECKING:
    from largebatch.backends.base import Backend
    from largebatch.batch_schedule import BatchSchedule
    from largebatch.data.contract import Loader

__all__ = ["Hook", "NonFiniteLossError", "StepSettings", "StepView", "Trainer", "TrainState"]


@dataclass
class TrainState:
    """What the loop has done; checkpointed and restored with the run."""

    epoch: int = 0  # epochs completed (= the 0-based index of the current epoch)
    step: int = 0  # optimizer steps done in the whole run
    epoch_step: int = 0  # optimizer steps done in the current epoch
    images_seen: int = 0
    skipped_steps: int = 0
    best_top1: float = -1.0
    best_epoch: int = -1
    time_to_target_s: Optional[float] = None
    elapsed_s: float = 0.0  # training wall time before this process (resumed runs)
    batch_factors: list[int] = field(default_factory=list)  # an adaptive batch schedule's decisions, per epoch
    evals: list[dict[str, Any]] = field(default_factory=list)

    def state_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)


@dataclass(frozen=True)
class StepView:
    """The optimizer step being run, as the loop publishes it for hooks (``Trainer.step_view``,
    read in ``after_backward`` and in the optimizer's step hooks): its micro-batches (a batch
    schedule may add some), the loss its backward differentiates, and the loss scale its
    gradients carry. ``loss(images, labels)`` is the mean loss of a batch under the step's
    autocast (:meth:`Trainer.loss`), before loss scaling."""

    micro_batches: tuple[Any, ...]
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    scaler: Any = field(default=None, repr=False)  # the fp16 loss scaler (None: none)

    def scaled(self, loss: torch.Tensor) -> torch.Tensor:
        """``loss`` as the step's backward takes it: times the loss scale under fp16, else itself."""
        return self.scaler.scale(loss) if self.scaler is not None else loss

    def loss_scale(self, like: torch.Tensor) -> Optional[torch.Tensor]:
        """The scale the step's gradients carry, a 0-dim tensor of ``like``'s device and dtype
        read on the device (no host read, unlike ``GradScaler.get_scale()``); None without loss
        scaling. Asked after a backward of the step, when the scaler has its scale."""
        if self.scaler is None or not self.scaler.is_enabled():
            return None
        return self.scaler.scale(torch.ones((), device=like.device)).to(like)


class Hook:
    """Base class of loop hooks: override the events you need; ``self.trainer`` is set."""

    trainer: "Trainer"

    def before_train(self) -> None: ...
    def before_epoch(self) -> None: ...
    def after_backward(self, micro_batch: int) -> None: ...
    def after_step(self) -> None: ...
    def after_log(self, metrics: dict[str, Any]) -> None: ...
    def after_epoch(self) -> None: ...
    def after_eval(self, metrics: dict[str, float]) -> None: ...
    def after_train(self) -> None: ...


@dataclass(frozen=True)
class StepSettings:
    """How the loop runs each optimizer step, and when it stops (read by :class:`Trainer`).

    ``global_batch_size`` counts the images of one optimizer step on all ranks (the
    ``images_seen`` unit); ``accumulation_steps`` micro-batches make one step. ``non_finite``:
    ``stop`` or ``skip`` (:mod:`largebatch.engine.nonfinite`), with at most
    ``max_skipped_steps`` skips. ``cuda_graph_steps``: the model is compiled with CUDA graphs
    (``reduce-overhead``), which overwrite their outputs at each replay; the loop marks each
    micro-step so that the previous one's outputs are known dead. ``batch_schedule``: the global
    batch per epoch (:class:`~largebatch.batch_schedule.BatchSchedule`; ``global_batch_size`` is
    then its base): a step of factor k reads k base steps' batches, as k times the micro-batches
    or k-times larger ones (its ``via``).
    """

    epochs: int
    global_batch_size: int
    accumulation_steps: int = 1
    label_smoothing: float = 0.0
    autocast_dtype: Optional[torch.dtype] = None
    log_every: int = LOG_EVERY
    max_steps: Optional[int] = None
    non_finite: str = "stop"
    max_skipped_steps: int = MAX_SKIPPED_STEPS
    cuda_graph_steps: bool = False
    batch_schedule: Optional[BatchSchedule] = None

    def __post_init__(self) -> None:
        if self.cuda_graph_steps and self.accumulation_steps > 1:
            # Each replay reuses the previous replay's buffers, .grad included (pytorch
            # issue 169545): the accumulated gradients would be overwritten, silently.
            raise UsageError(
                f"a model compiled with CUDA graphs cannot accumulate gradients over "
                f"{self.accumulation_steps} micro-steps; compile without CUDA graphs "
                "(max-autotune-no-cudagraphs) or use accumulation_steps=1"
            )
        if self.cuda_graph_steps and self.batch_schedule is not None and self.batch_schedule.via == "accumulation":
            raise UsageError(
                "a model compiled with CUDA graphs cannot accumulate gradients, as a batch schedule raised by "
                "accumulation does; use batch_schedule.via=per_device or compile without CUDA graphs"
            )

    def batch_factor(self, epoch: int) -> int:
        """Base steps per optimizer step in epoch ``epoch`` (1 without a batch schedule)."""
        return 1 if self.batch_schedule is None else self.batch_schedule.factor_at(epoch)


class Trainer:
    """Runs the optimizer steps of a run; everything else is a hook.

    ``train_loader``: this rank's training batches on the device (a loader of the contract,
    :class:`~largebatch.data.contract.Loader`, as ``backend.wrap_loader`` passes it on; a plain
    list of batches also serves where nothing sets the epoch: the loop itself only iterates it and
    takes its ``len``, ``EpochHook`` calls ``set_epoch``). ``settings`` says how a step runs
    (:class:`StepSettings`); ``scaler`` is the fp16 loss
    scaler (None: none); ``state`` the loop state to continue (a resumed run's).
    """

    def __init__(
        self,
        *,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: Any,
        train_loader: Loader | Sequence[tuple[torch.Tensor, torch.Tensor]],
        backend: Backend,
        settings: StepSettings,
        scaler: Any = None,
        hooks: Sequence[Hook] = (),
        state: Optional[TrainState] = None,
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.train_loader = train_loader
        self.backend = backend
        self.settings = settings
        self.scaler = scaler
        self.state = state or TrainState()
        self.hooks = list(hooks)
        for h in self.hooks:
            h.trainer = self
        self.steps_per_epoch = len(train_loader) // settings.accumulation_steps
        # images of one micro-batch on this device (a per_device batch schedule joins k of them)
        self._micro_batch_size = settings.global_batch_size // max(1, backend.world_size * settings.accumulation_steps)
        self._refuse_epochs_without_a_step()
        self.stop_reason: Optional[str] = None
        # A run file rank 0 could not write (largebatch.engine.run_files): the ranks stop
        # after an agreed step, save it, and the run raises this.
        self.failure: Optional[BaseException] = None
        self.start_time: Optional[float] = None  # wall clock at the first step of this process
        self.guard = NonFiniteGuard(
            policy=settings.non_finite,
            max_skipped_steps=settings.max_skipped_steps,
            backend=backend,
            model=model,
            optimizer=optimizer,
            scaler_skips=scaler is not None,
        )
        # The loss scaler skips optimizer.step() on overflow; this host counter (bumped by a
        # step post-hook, no device read) tells the loop whether the step ran.
        self._optimizer_steps = 0
        optimizer.register_step_post_hook(self._count_optimizer_step)
        self._loss_sum = torch.zeros((), device=backend.device)
        self._loss_steps = torch.zeros((), device=backend.device)
        self._log_time = 0.0
        self._log_images = 0
        # name -> a function returning a 0-dim device tensor: read with the loss on log steps
        # (one host read for all) and logged under its name
        self.log_values: dict[str, Callable[[], torch.Tensor]] = {}
        # the step being run, for hooks (e.g. the noise scale's): set by run_step
        self.step_view = StepView((), self.loss, scaler)

    def _refuse_epochs_without_a_step(self) -> None:
        """Every epoch has an optimizer step: the loader's batches fill the accumulation steps, and
        each epoch's global batch (a batch schedule's, raised) fits in an epoch's images."""
        settings = self.settings
        if self.steps_per_epoch == 0:
            raise UsageError(
                f"an epoch has no optimizer step: {len(self.train_loader)} batches per rank for "
                f"{settings.accumulation_steps} accumulation steps; use a smaller global_batch_size"
            )
        short = [e for e in range(settings.epochs) if self.steps_in_epoch(e) == 0]
        if short:
            raise UsageError(
                f"epoch {short[0]} has no optimizer step: its global batch "
                f"{settings.global_batch_size * settings.batch_factor(short[0])} is larger than the "
                f"{self.steps_per_epoch * settings.global_batch_size} images of an epoch; lower batch_schedule.steps"
            )

    # -- helpers for hooks -------------------------------------------------------------
    def call(self, event: str, *args: Any) -> None:
        for h in self.hooks:
            getattr(h, event)(*args)

    def steps_in_epoch(self, epoch: int) -> int:
        """Optimizer steps of epoch ``epoch`` (``steps_per_epoch`` is the base batch's)."""
        return self.steps_per_epoch // self.settings.batch_factor(epoch)

    @property
    def global_batch_size(self) -> int:
        """The global batch of the current epoch's steps (the batch schedule's, or the run's)."""
        return self.settings.global_batch_size * self.settings.batch_factor(self.state.epoch)

    def request_stop(self, reason: str) -> None:
        self.stop_reason = self.stop_reason or reason

    def elapsed(self) -> float:
        """Training wall time of the whole run so far (all processes of a resumed run)."""
        now = time.perf_counter()
        return self.state.elapsed_s + (now - self.start_time if self.start_time else 0.0)

    def current_lr(self) -> float:
        return self.optimizer.param_groups[0]["lr"]

    def check_non_finite(self) -> None:
        """Host check of the non-finite counters (all ranks): raise per policy, else record."""
        self.state.skipped_steps = self.guard.check(self.state.step)

    def loss(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The mean training loss of a batch: the model's forward under the step's autocast,
        cross-entropy in fp32 (the step's loss, before its 1/accumulation_steps scaling)."""
        s = self.settings
        with self.backend.autocast(s.autocast_dtype):
            logits = self.model(images)
        return F.cross_entropy(logits.float(), labels, label_smoothing=s.label_smoothing)

    def _count_optimizer_step(self, *_: Any) -> None:
        self._optimizer_steps += 1

    def _should_stop(self) -> bool:
        max_steps = self.settings.max_steps
        if max_steps is not None and self.state.step >= max_steps:
            self.request_stop(f"max_steps={max_steps} reached")
        return self.stop_reason is not None

    # -- the loop ------------------------------------------------------------------------
    def train(self) -> TrainState:
        self.guard.start(step=self.state.step, skipped_steps=self.state.skipped_steps)
        s = self.settings
        self.call("before_train")
        try:
            while self.state.epoch < s.epochs and not self._should_stop():
                self.call("before_epoch")
                batches = iter(self.train_loader)
                k, steps = s.batch_factor(self.state.epoch), self.steps_in_epoch(self.state.epoch)
                joined = k > 1 and s.batch_schedule is not None and s.batch_schedule.via == "per_device"
                while self.state.epoch_step < steps and not self._should_stop():
                    with step_memory(step=self.state.step + 1, epoch=self.state.epoch,
                                     per_device_batch=self._micro_batch_size * (k if joined else 1)):
                        micro = list(itertools.islice(batches, s.accumulation_steps * k))
                        if len(micro) < s.accumulation_steps * k:
                            break  # the loader ended early (e.g. skipped unreadable files)
                        self.run_step(_joined(micro, k) if joined else micro)
                    self.call("after_step")
                    if self.state.step % max(1, s.log_every) == 0 or self.state.epoch_step == steps:
                        self.call("after_log", self._read_metrics())
                if self.state.epoch_step < steps and self._should_stop():
                    break  # stopped mid-epoch
                self.state.epoch += 1
                self.state.epoch_step = 0
                self.call("after_epoch")
            self.check_non_finite()
        finally:
            self.state.elapsed_s = self.elapsed()
            self.start_time = None
            self.call("after_train")
        return self.state

    def run_step(self, micro_batches: list[Any]) -> None:
        """Forward/backward over the micro-batches, then one optimizer step."""
        if self.start_time is None:
            self.start_time = time.perf_counter()
            self._log_time = self.start_time
        s = self.settings
        n = len(micro_batches)
        self.guard.before_step()
        self.step_view = view = StepView(tuple(micro_batches), self.loss, self.scaler)
        step_loss = torch.zeros((), device=self.backend.device)
        for i, (images, labels, *_) in enumerate(micro_batches):
            sync = contextlib.nullcontext() if i == n - 1 else self.backend.no_sync(self.model)
            with sync:
                if s.cuda_graph_steps:
                    torch.compiler.cudagraph_mark_step_begin()  # gpu-only
                loss = self.loss(images, labels) / n
                view.scaled(loss).backward()
            self.call("after_backward", i)
            step_loss += loss.detach()
            self._log_images += images.shape[0] * self.backend.world_size
        bad = self.guard.observe(step_loss)
        ran_before = self._optimizer_steps
        self.backend.optimizer_step(self.optimizer, self.scaler)
        self.guard.after_optimizer_step(bad)
        self.optimizer.zero_grad(set_to_none=True)
        if self._optimizer_steps > ran_before:
            self.scheduler.step()
        self.backend.mark_step()
        # Non-finite losses stay out of the logged mean (they are counted by the guard).
        self._loss_sum += torch.where(bad, torch.zeros_like(step_loss), step_loss)
        self._loss_steps += (~bad).to(self._loss_steps.dtype)
        self.state.step += 1
        self.state.epoch_step += 1
        self.state.images_seen += self.global_batch_size

    def _read_metrics(self) -> dict[str, Any]:
        """The one host read-back: mean finite loss since the last log step, the hooks'
        ``log_values``, lr, throughput.

        ``loss`` is None when every step since the last log step was skipped for a non-finite
        loss (there is no loss to show, and 0 would read as a perfect one); under
        ``non_finite=skip`` the metrics also hold ``skipped_steps``, the run's count so far.
        Also the non-finite check, which raises per policy (``stop``, or too many skips).
        """
        self.check_non_finite()
        loss = self._loss_sum / self._loss_steps.clamp(min=1)
        names = list(self.log_values)
        values = torch.stack([loss, self._loss_steps.to(loss), *(self.log_values[n]().to(loss) for n in names)]).tolist()
        now = time.perf_counter()
        ips = self._log_images / max(now - self._log_time, 1e-9)
        self._loss_sum.zero_()
        self._loss_steps.zero_()
        self._log_images = 0
        self._log_time = now
        skipped = {"skipped_steps": self.state.skipped_steps} if self.settings.non_finite == "skip" else {}
        return {"loss": values[0] if values[1] > 0 else None, "lr": self.current_lr(), "img_per_s": ips,
                **skipped, **dict(zip(names, values[2:]))}


def _joined(batches: list[Any], k: int) -> list[Any]:
    """``batch_schedule.via=per_device``: each run of ``k`` loader batches becomes one batch of
    ``k`` times the per-device size (every tensor of the batch tuple concatenated)."""
    return [tuple(torch.cat(parts) if isinstance(parts[0], torch.Tensor) else parts[0]
                  for parts in zip(*batches[i:i + k]))
            for i in range(0, len(batches), k)]
