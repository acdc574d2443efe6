"""Non-finite loss guard: per-step detection on the device, host checks on log steps only.

Every step the guard records, on the device, whether this rank's loss was NaN or infinite
(a count and the first such step). Nothing is read back until :meth:`NonFiniteGuard.check`,
which the loop calls on log steps (where it reads the loss anyway), before a checkpoint and
at the end; it all-reduces one small per-rank vector so every rank takes the same decision
and the message names the step and the rank(s).

Policies (``non_finite`` in the config):

* ``stop``: the check raises :class:`NonFiniteLossError` naming the first non-finite step
  and rank. Costs nothing per step; the weights may be non-finite by the time it is seen.
* ``skip``: a non-finite step changes nothing, decided on the device. Without a loss
  scaler, the guard keeps a copy of the parameters, buffers (BN statistics) and optimizer
  state, and after the optimizer step puts the copy back where the step was non-finite
  (``torch.where``: no host sync, the same kernels every step, so XLA graphs stay fixed).
  The step's flag is all-reduced first (one scalar) so all ranks skip together. With an
  fp16 loss scaler the scaler already skips the optimizer step when gradients are not
  finite (and the loop does not advance the LR schedule for it), so only the buffers are
  copied: the forward pass of a NaN batch would otherwise leave NaN BN statistics. After more than
  ``max_skipped_steps`` skipped steps the check raises. Host-side counters (a Python
  ``step`` int of a custom optimizer) and the LR schedule still count a skipped step.
  Each check that finds new skipped steps logs the running count (and the run's summary
  holds it as ``skipped_steps``).

Before a checkpoint, :meth:`NonFiniteGuard.check_state` also checks every parameter and
buffer: a finite loss can come with non-finite state (an exploding LR that drives a BN
``running_var`` to inf), and such state is never saved.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Optional

import torch
from torch import nn

from largebatch.errors import NonFiniteLossError, UsageError

if TYPE_CHECKING:
    from largebatch.backends.base import Backend

__all__ = ["NonFiniteGuard", "NonFiniteLossError"]

log = logging.getLogger("largebatch")


_FIX = "lower optimizer.lr, raise schedule.warmup_epochs, or use precision=fp32 to find the cause"


class NonFiniteGuard:
    """Counts non-finite losses on the device; undoes non-finite steps under ``skip``.

    Args:
        policy: ``"stop"`` or ``"skip"``.
        max_skipped_steps: with ``skip``, the most steps that may be skipped in the run.
        backend: the run's backend (device, rank, world size, ``all_reduce_sum``).
        model: the module whose parameters and buffers a skipped step must not change.
        optimizer: the optimizer whose state a skipped step must not change.
        scaler_skips: True when an fp16 loss scaler already skips non-finite steps.
    """

    def __init__(
        self,
        *,
        policy: str,
        max_skipped_steps: int,
        backend: Backend,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        scaler_skips: bool = False,
    ) -> None:
        if policy not in ("stop", "skip"):
            raise UsageError(f"non_finite must be 'stop' or 'skip', got {policy!r}")
        self.policy = policy
        self.max_skipped_steps = max_skipped_steps
        self.backend = backend
        self.model = model
        self.optimizer = optimizer
        self.restores = policy == "skip"
        self.restores_params = policy == "skip" and not scaler_skips
        device = backend.device
        self._bad_count = torch.zeros((), dtype=torch.int64, device=device)  # this rank
        self._first_bad = torch.full((), -1, dtype=torch.int64, device=device)  # this rank
        self._skipped = torch.zeros((), dtype=torch.int64, device=device)  # all ranks agree
        # The step number lives on the device too: a Python int baked into each step's ops
        # would be a new constant per step (an XLA recompile per step).
        self._step = torch.zeros((), dtype=torch.int64, device=device)
        self._backup: list[torch.Tensor] = []
        self._live: list[torch.Tensor] = []
        self._state_keys: Optional[list[tuple[int, str]]] = None
        self.skipped_before = 0  # skipped steps of earlier processes (resumed run)
        self._logged_skipped = 0

    def start(self, *, step: int, skipped_steps: int) -> None:
        """Continue the counts of a resumed run: ``step`` steps done, ``skipped_steps`` skipped."""
        self._step.fill_(step)
        self.skipped_before = skipped_steps
        self._logged_skipped = skipped_steps

    # -- per step, no host read ----------------------------------------------------------
    def before_step(self) -> None:
        """Snapshot what a skipped step must leave untouched (``skip`` without a scaler)."""
        if not self.restores:
            return
        live = self._tensors()
        if [t.data_ptr() for t in live] != [t.data_ptr() for t in self._live]:
            self._live = live
            self._backup = [t.detach().clone() for t in live]
        else:
            torch._foreach_copy_(self._backup, live)

    def observe(self, step_loss: torch.Tensor) -> torch.Tensor:
        """Record whether the step's loss is finite; return the step's skip flag (device)."""
        self._step += 1
        bad = ~torch.isfinite(step_loss.detach())
        self._bad_count += bad.to(torch.int64)
        self._first_bad = torch.where(bad & (self._first_bad < 0), self._step, self._first_bad)
        if self.policy != "skip":
            return bad
        if self.backend.world_size > 1:
            # One scalar all-reduce: a NaN on any rank reaches every rank's gradients through
            # the gradient all-reduce, so every rank must skip the same steps.
            bad = self.backend.all_reduce_sum(bad.to(torch.float32)) > 0
        self._skipped += bad.to(torch.int64)
        return bad

    def after_optimizer_step(self, bad: torch.Tensor) -> None:
        """Put back the snapshot where the step was non-finite (device-side select)."""
        if not self.restores:
            return
        for live, saved in zip(self._live, self._backup):
            live.copy_(torch.where(bad, saved, live))
        if self.restores_params:
            self._drop_new_state(bad)

    # -- host checks ---------------------------------------------------------------------
    def check(self, step: int) -> int:
        """Read the counters (all ranks together); raise per the policy; return skipped steps."""
        world, rank = self.backend.world_size, self.backend.rank
        vec = torch.zeros(2 * world, dtype=torch.float64, device=self.backend.device)
        vec[rank] = self._bad_count.to(torch.float64)
        vec[world + rank] = self._first_bad.to(torch.float64)
        vec = self.backend.all_reduce_sum(vec)
        counts, firsts = vec[:world].tolist(), vec[world:].tolist()
        skipped = self.skipped_before + int(self._skipped.item()) if self.policy == "skip" else 0
        bad_ranks = [r for r in range(world) if counts[r] > 0]
        if skipped > self._logged_skipped and skipped <= self.max_skipped_steps:
            self._logged_skipped = skipped
            log.warning("step %d: %d step(s) skipped so far for a non-finite loss (non_finite=skip, "
                        "max_skipped_steps=%d)", step, skipped, self.max_skipped_steps)
        if not bad_ranks:
            return skipped
        first_step = int(min(firsts[r] for r in bad_ranks))
        where = ", ".join(str(r) for r in bad_ranks if int(firsts[r]) == first_step)
        if self.policy == "stop":
            raise NonFiniteLossError(
                f"the training loss is not finite at step {first_step} on rank {where} "
                f"(non_finite=stop); {_FIX}, or set non_finite=skip"
            )
        if skipped > self.max_skipped_steps:
            raise NonFiniteLossError(
                f"{skipped} steps skipped for a non-finite loss, more than "
                f"max_skipped_steps={self.max_skipped_steps} (by step {step}; first at step "
                f"{first_step} on rank {where}); {_FIX}"
            )
        return skipped

    def check_state(self, step: int) -> None:
        """Raise unless every floating-point parameter and buffer is finite on every rank.

        One host read (and one all-reduce) per call: the loop calls it before a checkpoint.
        """
        named = [(n, t) for n, t in (*self.model.named_parameters(), *self.model.named_buffers())
                 if t.is_floating_point()]
        if not named:
            return
        finite = torch.stack([torch.isfinite(t.detach()).all() for _, t in named])
        count = (~finite).sum().to(torch.float32)
        if self.backend.world_size > 1:
            count = self.backend.all_reduce_sum(count)
        if count.item() == 0:
            return
        names = [n.removeprefix("module.") for (n, _), ok in zip(named, finite.tolist()) if not ok]
        where = f"e.g. {', '.join(names[:3])}" if names else "on another rank"
        raise NonFiniteLossError(
            f"{int(count.item())} parameter/buffer tensor(s) are not finite at step {step} "
            f"({where}, rank {self.backend.rank}'s view) although the loss was checked; the "
            f"checkpoint was not saved (non_finite={self.policy}); {_FIX}"
        )

    # -- internals -----------------------------------------------------------------------
    def _tensors(self) -> list[torch.Tensor]:
        """Parameters, buffers and optimizer-state tensors on the guard's device."""
        out = [b for b in self.model.buffers()]
        self._state_keys = []
        if not self.restores_params:
            return out
        out += [p.data for p in self.model.parameters()]
        for i, p in enumerate(self._params()):
            for key, value in self.optimizer.state.get(p, {}).items():
                self._state_keys.append((i, key))
                # Host-side or other-device counters (Adam's CPU 'step') are not restored:
                # moving the flag there would be a host sync.
                if isinstance(value, torch.Tensor) and value.device == self._bad_count.device:
                    out.append(value)
        return out

    def _params(self) -> list[torch.Tensor]:
        return [p for group in self.optimizer.param_groups for p in group["params"]]

    def _drop_new_state(self, bad: torch.Tensor) -> None:
        """Optimizer state created by a skipped first step is removed (a one-time host read).

        State appears only on the first step(s) of a run; the snapshot has no copy of it,
        so whether to keep it needs the flag on the host, once.
        """
        had_state = {i for i, _ in self._state_keys or []}
        new = [
            p for i, p in enumerate(self._params())
            if i not in had_state and self.optimizer.state.get(p)
        ]
        if new and bool(bad.item()):
            for p in new:
                del self.optimizer.state[p]
