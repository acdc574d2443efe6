"""Preemption: SIGTERM/SIGINT/SIGHUP (``largebatch.errors.STOP_SIGNALS``) finish the current step on every rank, then save and exit.

A signal handler only sets a flag (nothing else is safe inside a handler). After a step the
:class:`PreemptionHook` decides, on all ranks together, whether to stop: the flag of each
rank is all-reduced in a small tensor, so ranks that got the signal a step apart (or
not at all: a scheduler may signal one node) still stop after the same step. The loop then
ends, the checkpoint hook saves (its ``after_train``), and :func:`largebatch.run.run` raises
``Preempted``, which the command line exits with as ``EXIT_PREEMPTED``. A second SIGINT
interrupts at once (``KeyboardInterrupt``).

The same agreement carries a second flag: rank 0 could not write a run file
(``trainer.failure``, see :mod:`largebatch.engine.run_files`). Every rank then stops after
the agreed step, the checkpoint hook saves it, and the run exits 74 instead of 75.

Cost: at world size 1 the flag is a Python bool read every step (free). With several ranks
the agreement is a collective and a host read, so it runs every ``check_every`` steps;
``largebatch.run`` passes 1 on CPU/gloo (a tiny all-reduce there is microseconds next to a
step) and the log interval on accelerators (where it would be a per-step host sync). A batch
scheduler's grace period (typically 30 s or more) covers that many steps.
"""

from __future__ import annotations

import logging
import os
import signal
from types import FrameType
from typing import Any, Optional

import torch

from largebatch.engine.loop import Hook
from largebatch.errors import STOP_SIGNALS, Preempted, RunFileError

__all__ = ["Preempted", "PreemptionHook"]

log = logging.getLogger("largebatch")

_SIGNALS = STOP_SIGNALS

# the torchrun agent's pid, which largebatch.launch.torchrun leaves to its ranks
# (largebatch.launch.lifetime.AGENT_PID; read, not imported: the engine does not import the edge)
_AGENT_PID = "LARGEBATCH_AGENT_PID"


def _launcher_gone() -> bool:
    """Whether this rank's torchrun agent has ended: the stop signal is then the one its death
    sent (``PR_SET_PDEATHSIG``), not a scheduler's or a user's."""
    try:
        return os.getppid() != int(os.environ[_AGENT_PID])
    except (KeyError, ValueError):
        return False


class PreemptionHook(Hook):
    """Turns SIGTERM/SIGINT/SIGHUP into a stop after the current step, agreed by all ranks.

    Args:
        check_every: steps between the all-rank agreements (world size > 1).
    """

    def __init__(self, check_every: int = 1) -> None:
        self.check_every = max(1, check_every)
        self.signal_name: Optional[str] = None  # set on the rank(s) that got a signal
        self.cause: Optional[str] = None  # why it came, where known (the launcher died)
        self.preempted = False  # True on every rank once they agreed to stop
        self._previous: dict[int, Any] = {}

    # set once a hook took the stop signals over (largebatch.launch.lifetime's start-up handlers
    # read it: back after the last checkpoint, they must not say "before the first step")
    took_over = False

    def _handle(self, signum: int, frame: Optional[FrameType]) -> None:
        if self.signal_name is not None:
            # Under torchrun a rank is in a session of its own: a terminal's Ctrl-C reaches it
            # only through the agent, so a second SIGINT is the same stop delivered twice (to
            # every process, and passed on by the agent), not a second Ctrl-C. Raising there
            # ended a run 130 without its checkpoint, depending on when the two arrived.
            if signum == signal.SIGINT and self.signal_name == "SIGINT" and "TORCHELASTIC_RUN_ID" not in os.environ:
                raise KeyboardInterrupt  # second Ctrl-C: stop now
            return  # already stopping after this step
        self.signal_name = signal.Signals(signum).name
        if _launcher_gone():
            self.cause = "its launcher, torchrun's agent, ended"
        log.warning("%s received%s: finishing the current step, then saving a checkpoint", self.signal_name,
                    f" ({self.cause})" if self.cause else "")

    def before_train(self) -> None:
        PreemptionHook.took_over = True
        for sig in _SIGNALS:
            try:
                self._previous[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread (embedded use): no handler
                pass

    def after_step(self) -> None:
        t = self.trainer
        failed = t.failure is not None  # rank 0 could not write a run file (engine.run_files)
        if t.backend.world_size == 1:
            signalled = self.signal_name is not None
        elif t.state.step % self.check_every == 0:
            flags = torch.tensor([float(self.signal_name is not None), float(failed)], device=t.backend.device)
            signalled, failed = (v > 0 for v in t.backend.all_reduce_sum(flags).tolist())
        else:
            return
        if failed:
            if t.failure is None:
                t.failure = RunFileError("rank 0 could not write a file of the run (its error line names it); "
                                         "the run stopped after saving a checkpoint", path=None, errno=None)
            t.request_stop("a file of the run could not be written")
        if signalled:
            self.preempted = True
            why = f": {self.cause}" if self.cause else ""
            t.request_stop(f"preempted ({self.signal_name or 'signal on another rank'}{why})")

    def uninstall(self) -> None:
        """Put the previous handlers back (``largebatch.run`` calls it after the final
        checkpoint, so a second SIGTERM during that write does not kill it halfway: it is
        atomic anyway).

        After a stop by signal the handlers ignore further stop signals instead: the run ends 75
        with its "checkpoint saved" line, and a stop delivered again (torchrun's agent passes on
        the signal every process already got, and a loaded machine can deliver it after this
        point) must not replace that line with the start-up handlers' "nothing more to save"."""
        for sig, handler in self._previous.items():
            signal.signal(sig, signal.SIG_IGN if self.signal_name is not None else handler)
        self._previous.clear()
