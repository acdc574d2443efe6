"""Weight EMA: an exponential moving average of the model's weights, evaluated beside them.

The average is timm's ``ModelEmaV3`` (``timm/utils/model_ema.py``), kept on the model's
device: after the n-th update the EMA copy holds ``ema <- decay_n * ema + (1 - decay_n) *
model`` for every floating-point parameter and buffer (BN running statistics included, as
the EfficientNet reference's ``tf.train.ExponentialMovingAverage`` over trainable and moving
variables), and integer buffers (``num_batches_tracked``) are copied. timm's ``decay_n``,
with ``k = n - 1 - update_after_step``:

* k <= 0 (the first update, by default): 0, the EMA becomes a copy of the weights;
* without warmup: ``decay``;
* with warmup: ``clamp(1 - (1 + k / warmup_gamma) ** -warmup_power, min_decay, decay)``.

``update_after_step=-2, warmup_gamma=9, warmup_power=1`` is TensorFlow's
``tf.train.ExponentialMovingAverage(decay, num_updates=step)`` (the EfficientNet
reference's): ``min(decay, (1 + n) / (10 + n))``, since ``1 - (1 + (n + 1) / 9) ** -1 = 1 - 9 /
(10 + n)``.

:class:`EmaHook` updates it after every ``every``-th optimizer step with n = step // every,
the loop's step count (plain Python arithmetic: no host read, the update is foreach lerps
queued on the device). The step count is checkpointed with the loop state, so a resumed run
continues the same decay sequence and, with the EMA's weights in the checkpoint, is
bit-identical to a run that never stopped. A step the loss scaler or ``non_finite=skip``
skipped still counts and updates the EMA (towards unchanged weights), as timm's train loop does.

Data parallel: the parameters are the same on every rank, so their averages are too; with
per-rank BN (``bn.group_size=1``) each rank's BN running statistics, and so their averages,
differ, as DDP leaves the trained model's between forwards. :func:`sync_from_rank0` copies
rank 0's EMA (the one checkpoints hold) to every rank before it is evaluated, so every rank
evaluates the same weights.
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Iterator, Optional

import torch
import torch.distributed as dist
from torch import nn

from largebatch.engine.compile import unwrap_model
from largebatch.engine.evaluate import copy_from_rank0
from largebatch.engine.loop import Hook

if TYPE_CHECKING:
    from largebatch.backends.base import Backend

__all__ = ["EmaHook", "EmaSettings", "build_model_ema", "load_ema_state", "sync_from_rank0"]


@dataclass(frozen=True)
class EmaSettings:
    """A run's weight EMA (``ema.*``): timm's decay schedule (:func:`build_model_ema`'s
    options, the module docstring) and ``every``, the optimizer steps between updates
    (:class:`EmaHook`). :meth:`hook` builds both for a model."""

    decay: float = 0.9999
    warmup: bool = False
    warmup_gamma: float = 1.0
    warmup_power: float = 2 / 3
    min_decay: float = 0.0
    update_after_step: int = 0
    every: int = 1

    def hook(self, model: nn.Module) -> "EmaHook":
        """An :class:`EmaHook` over a new ``ModelEmaV3`` of ``model``."""
        options = asdict(self)
        every = options.pop("every")
        return EmaHook(build_model_ema(model, **options), every=every)


def build_model_ema(
    model: nn.Module,
    *,
    decay: float = 0.9999,
    warmup: bool = False,
    warmup_gamma: float = 1.0,
    warmup_power: float = 2 / 3,
    min_decay: float = 0.0,
    update_after_step: int = 0,
) -> Any:
    """timm's ``ModelEmaV3`` of ``model`` (unwrapped from DDP / ``torch.compile``), on its device.

    ``ModelEmaV3`` makes a ``torch.Generator`` on the model's device (for stochastic rounding
    of bfloat16 EMA tensors), which XLA devices do not have: there the EMA is built from a
    CPU copy and then moved to the device, with stochastic rounding off. That changes
    nothing here: the model's weights, and so the EMA's, are float32 (autocast computes in
    low precision, the weights stay float32), and rounding is used for bfloat16 tensors only.
    """
    from timm.utils import ModelEmaV3

    model = unwrap_model(model)
    options: dict[str, Any] = dict(decay=decay, min_decay=min_decay, use_warmup=warmup, warmup_gamma=warmup_gamma,
                   warmup_power=warmup_power, update_after_step=update_after_step)
    device = next(model.parameters()).device
    with _process_groups_set_aside(model) as held:
        if _has_generator(device):
            ema = ModelEmaV3(model, **options)
        else:
            ema = ModelEmaV3(copy.deepcopy(model).cpu(), stochastic_rounding=False, **options)
            ema.module.to(device)
    for (name, group), copied in zip(held, _holders(ema.module, [name for name, _ in held])):
        setattr(copied, "process_group", group)  # a handle, not a Tensor or Module: nn.Module's typed __setattr__ says no
    return ema


def _holders(model: nn.Module, names: list[str]) -> list[nn.Module]:
    modules = dict(model.named_modules())
    return [modules[name] for name in names]


@contextlib.contextmanager
def _process_groups_set_aside(model: nn.Module) -> Iterator[list[tuple[str, dist.ProcessGroup]]]:
    """Hold back the process groups of ``model``'s modules while it is deep-copied.

    torch's ``SyncBatchNorm`` (what grouped BN is on CUDA) keeps its ``ProcessGroup``, a
    handle that cannot be pickled, so timm's ``deepcopy`` of the model raised ``TypeError:
    cannot pickle 'ProcessGroup'`` before the first step. A group is a handle, not state:
    the copy gets the same one back (the EMA only evaluates, which needs no collective).
    Yields ``(module name, group)`` of each module that held one.
    """
    held = [(name, m.process_group) for name, m in model.named_modules()
            if isinstance(getattr(m, "process_group", None), dist.ProcessGroup)]
    holders = _holders(model, [name for name, _ in held])
    for m in holders:
        setattr(m, "process_group", None)  # nn.Module's typed __setattr__ takes only a Tensor or Module
    try:
        yield held
    finally:
        for (_, group), m in zip(held, holders):
            setattr(m, "process_group", group)


def _has_generator(device: torch.device) -> bool:
    try:
        torch.Generator(device=device)
    except RuntimeError:
        return False
    return True


def sync_from_rank0(ema: Any, backend: Backend) -> None:
    """Overwrite every rank's EMA state with rank 0's (its floating-point tensors)."""
    copy_from_rank0((t for t in ema.module.state_dict().values() if t.is_floating_point()), backend)


class EmaHook(Hook):
    """Updates ``ema`` (a ``ModelEmaV3``) after every ``every``-th optimizer step.

    Comes before the checkpoint and evaluation hooks, so a checkpoint or an evaluation of
    step k holds the EMA of step k.
    """

    def __init__(self, ema: Any, *, every: int = 1) -> None:
        self.ema = ema
        self.every = max(1, every)

    def after_step(self) -> None:
        t = self.trainer
        if t.state.step % self.every == 0:
            self.ema.update(unwrap_model(t.model), step=t.state.step // self.every)

    def eval_model(self) -> nn.Module:
        """The EMA weights as every rank should evaluate them (rank 0's)."""
        sync_from_rank0(self.ema, self.trainer.backend)
        return self.ema.module

    def state_dict(self) -> dict[str, Any]:
        return self.ema.module.state_dict()


def load_ema_state(ema: Any, state: Optional[dict[str, Any]], model: nn.Module) -> bool:
    """Load a checkpoint's EMA weights; None (an older checkpoint): start from ``model``'s.

    Returns True when the checkpoint held EMA weights.
    """
    if state is None:
        ema.set(unwrap_model(model))
        return False
    ema.module.load_state_dict(state)
    return True
