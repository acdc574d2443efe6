"""Batch-size control: the global batch as a function of the epoch.

Mikami et al. 2018 ("ImageNet/ResNet-50 Training in 224 Seconds", arXiv 1811.05233, sec. 3.1)
train with a smaller global batch in the first epochs and raise it in steps later; Smith et
al. 2017 ("Don't Decay the Learning Rate, Increase the Batch Size", arXiv 1711.00489) show that
raising the batch by a factor where the lr would fall by it gives the same curve in fewer
steps. :class:`BatchSchedule` is that schedule: from each listed epoch on, a global batch
that is a whole multiple ``k`` of ``global_batch_size`` (the base).

One optimizer step of factor ``k`` reads the next ``k`` base steps' batches of the epoch's
order (the data order does not depend on the schedule, so every phase reads each image once
per epoch and a run resumed anywhere continues with the next unseen ones). Two ways reach
the larger batch (``via``):

* ``accumulation``: ``k`` times the micro-batches, each its own forward and backward (no
  new shapes; BN sees the base per-device batch);
* ``per_device``: the ``k`` batches of each micro-step are concatenated into one of ``k``
  times the per-device batch (BN sees the larger batch, as in Mikami et al.; one new shape
  per factor for a compiled model).

On XLA the whole step is one graph, so either form compiles one new step graph per factor.

The learning rate follows the run's scaling rule per phase (``lr="scale"``: a factor ``k``
multiplies it by ``k`` under ``lr_scaling=linear``, ``sqrt(k)`` under ``sqrt``) or stays
(``lr="hold"``, Smith et al.'s form). The warmup and decay run over samples, not steps
(:meth:`BatchSchedule.epoch_position`): a phase change never jumps along the schedule.

:class:`AdaptiveBatchSchedule` decides each epoch's batch as the run goes, from the gradient
noise scale measured so far: it multiplies the batch by ``growth`` at the start of an epoch when
the measured B_simple has grown past ``raise_at`` times the current global batch (McCandlish et
al. 2018, arXiv 1812.06162, Appendix D's adaptive batch; the "batch size warmup" of Merrill et al.
2025, arXiv 2505.23971, which raises the batch as the measured critical batch grows). Its
decisions are part of the run's state (checkpointed), so a resumed run trains the same batches.

:func:`batch_schedule_of` maps the ``batch_schedule`` config section to its schedule, once: the
config checks (``largebatch.config.checks``) call it to validate the section and the run
(``largebatch.run``) to train by it. Ground under both and the loop: it imports only
``largebatch.errors`` (the config's type only for annotations). Epochs count from 0, as in
``metrics.jsonl``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional, Sequence

from largebatch.errors import ConfigError

if TYPE_CHECKING:
    from largebatch.config.schema import TrainConfig

__all__ = ["AdaptiveBatchSchedule", "BatchSchedule", "GROWTH", "LR_RULES", "batch_schedule_of"]

GROWTH = ("accumulation", "per_device")  # how a larger global batch is reached
LR_RULES = ("scale", "hold")  # the lr per phase: by the scaling rule, or held


@dataclass(frozen=True)
class BatchSchedule:
    """The global batch per epoch (see the module docstring).

    Args:
        base: the global batch of the epochs before the first step (``global_batch_size``).
        steps: ``((epoch, global_batch), ...)``: from that epoch on, that global batch, a
            whole multiple of ``base``; epochs ascending.
        via: ``accumulation`` or ``per_device`` (:data:`GROWTH`).
        lr: ``scale`` or ``hold`` (:data:`LR_RULES`).
        lr_scaling: the run's rule (``linear``, ``sqrt``, ``none``), for ``lr="scale"``.
    """

    base: int
    steps: tuple[tuple[int, int], ...]
    via: str = "accumulation"
    lr: str = "scale"
    lr_scaling: str = "linear"

    @classmethod
    def of(cls, steps: Sequence[Sequence[int]], *, global_batch_size: int, epochs: int, via: str = "accumulation",
           lr: str = "scale", lr_scaling: str = "linear") -> Optional["BatchSchedule"]:
        """The schedule of the ``batch_schedule`` settings (None when ``steps`` is empty), checked:
        a bad value raises a one-line :class:`ConfigError` naming the key."""
        if via not in GROWTH:
            raise ConfigError(f"batch_schedule.via={via} is not one of {', '.join(GROWTH)}; set one of them")
        if lr not in LR_RULES:
            raise ConfigError(f"batch_schedule.lr={lr} is not one of {', '.join(LR_RULES)}; set one of them")
        if not steps:
            return None
        must = (f"[[epoch, global_batch], ...] with epochs ascending in 1..{epochs - 1} (epochs={epochs}) and each "
                f"batch a whole multiple of global_batch_size ({global_batch_size})")
        pairs: list[tuple[int, int]] = []
        for pair in steps:
            if len(pair) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) for v in pair):
                _bad(steps, must)
            epoch, batch = int(pair[0]), int(pair[1])
            if epoch >= epochs >= 1 and not (pairs and epoch <= pairs[-1][0]):
                _past_the_end(steps, epoch, epochs)
            if not 1 <= epoch < epochs or (pairs and epoch <= pairs[-1][0]):
                _bad(steps, must)
            if batch < global_batch_size or batch % global_batch_size:
                _bad(steps, must)
            pairs.append((epoch, batch))
        return cls(global_batch_size, tuple(pairs), via=via, lr=lr, lr_scaling=lr_scaling)

    def batch_at(self, epoch: int) -> int:
        """The global batch of epoch ``epoch`` (0-based)."""
        batch = self.base
        for start, size in self.steps:
            if epoch >= start:
                batch = size
        return batch

    def factor_at(self, epoch: int) -> int:
        """``batch_at(epoch) / base``: base steps per optimizer step in that epoch."""
        return self.batch_at(epoch) // self.base

    def steps_in_epoch(self, epoch: int, base_steps: int) -> int:
        """Optimizer steps of epoch ``epoch`` when the base batch makes ``base_steps`` a epoch
        (a tail shorter than one step is dropped, as the base drops its tail)."""
        return base_steps // self.factor_at(epoch)

    def total_steps(self, epochs: int, base_steps: int) -> int:
        """Optimizer steps of ``epochs`` epochs."""
        return sum(self.steps_in_epoch(e, base_steps) for e in range(epochs))

    def epoch_position(self, step: int, base_steps: int) -> float:
        """Epochs trained (fractional) after ``step`` optimizer steps of the whole run: the
        samples' clock the lr schedule runs on. Past the listed epochs the last phase goes on."""
        epoch = 0
        while True:
            n = self.steps_in_epoch(epoch, base_steps)
            if n <= 0:
                return float(epoch)
            if step < n:
                return epoch + step / n
            step -= n
            epoch += 1

    def lr_ratio(self, epoch: int) -> float:
        """The lr of epoch ``epoch`` over the base batch's (1.0 with ``lr="hold"``)."""
        k = self.factor_at(epoch)
        if self.lr == "hold" or self.lr_scaling == "none":
            return 1.0
        return float(k) if self.lr_scaling == "linear" else math.sqrt(k)

    def lr_ratio_at_step(self, step: int, base_steps: int) -> float:
        """:meth:`lr_ratio` of the epoch optimizer step ``step`` falls in."""
        return self.lr_ratio(int(self.epoch_position(step, base_steps)))

    def describe(self) -> str:
        """``256, 512 from epoch 3, 1024 from epoch 6 (by accumulation; lr scaled)``."""
        phases = ", ".join(f"{b} from epoch {e}" for e, b in self.steps)
        lr = f"lr {self.lr_scaling}-scaled per phase" if self.lr == "scale" else "lr held"
        return f"{self.base}, {phases} ({self.via.replace('_', '-')}; {lr})"


@dataclass(frozen=True)
class AdaptiveBatchSchedule(BatchSchedule):
    """The global batch decided per epoch from the measured noise scale (module docstring).

    ``factors`` holds the decisions so far, one per epoch from epoch 0 (:meth:`decide` appends);
    an epoch not decided yet has the last decision's factor. ``raise_at``: raise when B_simple >=
    raise_at x the current global batch; ``growth``: the factor of each raise; ``max_batch``: no
    raise past this global batch (None: while an epoch still has a whole step).
    """

    raise_at: float = 2.0
    growth: int = 2
    max_batch: Optional[int] = None
    factors: list[int] = field(default_factory=list)

    @classmethod
    def of_adaptive(cls, *, global_batch_size: int, raise_at: float, growth: int, max_batch: Optional[int],
                    via: str = "accumulation", lr: str = "scale", lr_scaling: str = "linear") -> "AdaptiveBatchSchedule":
        """The schedule of the ``batch_schedule.adaptive`` settings, checked: a bad value raises a
        one-line :class:`ConfigError` naming the key."""
        BatchSchedule.of([], global_batch_size=global_batch_size, epochs=1, via=via, lr=lr)  # checks via, lr
        key = "batch_schedule.adaptive"
        if raise_at == math.inf:  # would never raise: the fixed batch, which is the switch's job
            raise ConfigError(f"{key}.raise_at=inf never raises the batch: to keep global_batch_size, set "
                              f"{key}.enabled=false; to raise it, set {key}.raise_at= to a finite number > 0")
        if isinstance(raise_at, bool) or not isinstance(raise_at, (int, float)) or not 0 < raise_at < math.inf:
            raise ConfigError(f"{key}.raise_at={raise_at} is out of range: it must be a finite number > 0; set "
                              f"{key}.raise_at= to such a value")
        if isinstance(growth, bool) or not isinstance(growth, int) or growth < 2:
            raise ConfigError(f"{key}.growth={growth} is out of range: it must be an integer >= 2; set "
                              f"{key}.growth= to such a value")
        if max_batch is not None and (isinstance(max_batch, bool) or not isinstance(max_batch, int)
                                      or max_batch < global_batch_size or max_batch % global_batch_size):
            raise ConfigError(f"{key}.max_global_batch={max_batch} is out of range: it must be null or a whole "
                              f"multiple of global_batch_size ({global_batch_size}); set {key}.max_global_batch= "
                              "to such a value")
        return cls(global_batch_size, (), via=via, lr=lr, lr_scaling=lr_scaling, raise_at=float(raise_at),
                   growth=growth, max_batch=max_batch)

    def factor_at(self, epoch: int) -> int:
        if not self.factors:
            return 1
        return self.factors[min(epoch, len(self.factors) - 1)]

    def batch_at(self, epoch: int) -> int:
        return self.base * self.factor_at(epoch)

    def decide(self, epoch: int, noise_scale: float, base_steps: int) -> bool:
        """Decide epoch ``epoch``'s factor (epochs in order, each once) from the noise scale
        measured so far (nan or inf: not resolved yet, no raise); True when it raised."""
        if epoch != len(self.factors):
            raise ValueError(f"epoch {epoch} decided out of order (decided: {len(self.factors)} epochs)")
        k = self.factors[-1] if self.factors else 1
        raise_ = epoch > 0 and self.why_kept(k, noise_scale, base_steps) is None
        self.factors.append(k * self.growth if raise_ else k)
        return raise_

    def why_kept(self, k: int, noise_scale: float, base_steps: int) -> Optional[str]:
        """Why a decision at factor ``k`` keeps the batch, in words for the log (None: it raises):
        the noise scale below the threshold, the raised batch past ``max_batch``, or past the
        epoch's images (``base_steps`` base batches; not one whole step)."""
        up = k * self.growth
        if not (math.isfinite(noise_scale) and noise_scale >= self.raise_at * self.base * k):
            return f"a raise needs >= {self.raise_at:g} x {self.base * k}"
        if self.max_batch is not None and self.base * up > self.max_batch:
            return f"{self.base * up} would pass batch_schedule.adaptive.max_global_batch={self.max_batch}"
        if base_steps // up < 1:
            return f"{self.base * up} would exceed the {self.base * base_steps} images of an epoch"
        return None

    def possible_factors(self, base_steps: Optional[int] = None, most: int = 6) -> list[int]:
        """The factors a run may reach: growth**i within max_batch (and an epoch's steps), at
        most ``most`` raises."""
        out, k = [1], 1
        while len(out) <= most:
            k *= self.growth
            if (self.max_batch is not None and self.base * k > self.max_batch) or (base_steps is not None
                                                                                and base_steps // k < 1):
                break
            out.append(k)
        return out

    def describe(self) -> str:
        cap = f", at most {self.max_batch}" if self.max_batch is not None else ""
        lr = f"lr {self.lr_scaling}-scaled per phase" if self.lr == "scale" else "lr held"
        return (f"{self.base}, x{self.growth} at an epoch start when the noise scale >= {self.raise_at:g} x the "
                f"global batch{cap} (adaptive; {self.via.replace('_', '-')}; {lr})")


def batch_schedule_of(cfg: TrainConfig) -> Optional[BatchSchedule]:
    """The ``batch_schedule`` section's global batch per epoch, checked (a bad value raises one-line
    ``ConfigError`` naming the key): a ``BatchSchedule``, with ``adaptive.enabled`` an
    ``AdaptiveBatchSchedule`` (whose decisions the run makes: build it once per run), None when off.
    ``cfg`` is the composed config with its choices as plain strings (``to_train_config``)."""
    bs = cfg.batch_schedule
    if not bs.adaptive.enabled:
        return BatchSchedule.of([list(p) for p in bs.steps], global_batch_size=cfg.global_batch_size,
                                epochs=cfg.epochs, via=bs.via, lr=bs.lr, lr_scaling=cfg.lr_scaling)
    if len(bs.steps):
        raise ConfigError("batch_schedule.adaptive.enabled=true decides the batch itself: set "
                          "batch_schedule.steps=[] or batch_schedule.adaptive.enabled=false")
    a = bs.adaptive
    return AdaptiveBatchSchedule.of_adaptive(global_batch_size=cfg.global_batch_size, raise_at=a.raise_at,
                                             growth=a.growth, max_batch=a.max_global_batch, via=bs.via, lr=bs.lr,
                                             lr_scaling=cfg.lr_scaling)


def _past_the_end(steps: Sequence[Sequence[int]], epoch: int, epochs: int) -> None:
    """A step at or after the run's last epoch: ``epochs`` is as likely the cause as the step."""
    shown = [list(p) for p in steps]
    if epochs < 2:
        raise ConfigError(f"batch_schedule.steps={shown} needs epochs >= 2 (a step's epoch lies in 1..epochs-1), but "
                          f"epochs={epochs}: set epochs= above {epoch}, or batch_schedule.steps=[]")
    raise ConfigError(f"batch_schedule.steps={shown} is out of range: epoch {epoch} is not below epochs={epochs} "
                      f"(a step's epoch lies in 1..{epochs - 1}); set epochs= above {epoch}, or move the step to an "
                      f"epoch in 1..{epochs - 1}")


def _bad(steps: Sequence[Sequence[int]], must: str) -> None:
    shown = [list(p) for p in steps]
    raise ConfigError(f"batch_schedule.steps={shown} is out of range: it must be {must}; set batch_schedule.steps= to such a value")
