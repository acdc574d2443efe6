"""A launched process's life: it ends with its parent, and a stop signal before training is a stop.

**Parent death.** ``kill -KILL -- -PGID`` of the launch shell (what ``timeout -s KILL``, a CI
cancel or the OOM killer does), or SIGKILL of torchrun's agent, used to leave the agent and the
ranks (each in a session of its own, so the group kill missed them) training unsupervised: they
held the run lock, kept writing checkpoints, and the relaunch was refused as "in use". Linux's
``prctl(PR_SET_PDEATHSIG, SIGTERM)`` turns the parent's death into the ordinary preemption path
(the agent passes SIGTERM to its ranks; a rank saves at the next step boundary and exits 75).
The signal is sent when the *thread* that forked the process ends: torchrun starts its workers
with ``subprocess.Popen`` from the agent's main thread (``PContext.start``), and the launch shell
is single-threaded, so the thread's end is the process's end. A parent that died before the
``prctl`` call gives no signal: :func:`die_with_parent` then compares ``os.getppid()`` with the
parent expected and signals itself.

**A stop while a rank starts.** For the ~10-15 s a rank imports, joins the process group and
builds its loaders, SIGTERM/SIGHUP killed it (143/129) and SIGINT gave a traceback, and torchrun
reported 1; so did ``largebatch-train`` run by itself. :func:`stop_before_training` installs handlers that end the rank at once with exit 75
and one line ("nothing to save yet"), as a requeue-on-75 wrapper expects; the training loop's
:class:`~largebatch.engine.preemption.PreemptionHook` replaces them once training begins.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from types import FrameType
from typing import Optional

# no torch: a stop before training must not wait for seconds of imports
from largebatch.errors import EXIT_PREEMPTED, STOP_SIGNALS

__all__ = [
    "AGENT_PID", "EXIT_PEER_LOST", "LAUNCHER_PID", "die_with_parent", "expected_parent", "peer_lost", "start_rank",
    "stop_before_training", "under_torchrun",
]

# set by launch/lib.sh (the launch shell's pid) and by largebatch.launch.torchrun (the agent's
# pid, for its ranks): the parent each expects, to catch one that died before the prctl call
LAUNCHER_PID = "LARGEBATCH_LAUNCHER_PID"
AGENT_PID = "LARGEBATCH_AGENT_PID"

_PR_SET_PDEATHSIG = 1  # linux/prctl.h


# A rank whose collective failed because another rank is gone exits 1, as torchrun reads any
# failure, with one line and no traceback; it reports no code to the launch scripts: the rank that
# ended (or the agent, for one a signal killed) reports why, and that line is the one to read.
EXIT_PEER_LOST = 1

# what gloo (and the TCP store) say when the other end of a rank's connection is gone
_PEER_GONE = ("Connection reset by peer", "Connection closed by peer", "Broken pipe")


def peer_lost(err: BaseException) -> bool:
    """Whether ``err`` is a collective that failed because another rank ended (killed, crashed),
    in a rank of a torchrun job; not a bug of this rank."""
    return under_torchrun() and isinstance(err, RuntimeError) and any(text in str(err) for text in _PEER_GONE)


def under_torchrun() -> bool:
    """Whether this process is a rank torchrun's agent started."""
    return "TORCHELASTIC_RUN_ID" in os.environ and "LOCAL_RANK" in os.environ


def die_with_parent(expected_parent: Optional[int], sig: signal.Signals = signal.SIGTERM) -> bool:
    """Have the kernel send ``sig`` to this process when its parent ends; ``sig`` at once if the
    parent (``expected_parent``, or the parent now when None) is gone already. False where the
    platform has no ``prctl`` (not Linux): nothing is set."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    if expected_parent is not None and os.getppid() != expected_parent:
        os.kill(os.getpid(), sig)  # the parent died before prctl: the signal it would have sent
    return True


def expected_parent(variable: str) -> Optional[int]:
    """The parent pid a launcher left in ``variable``; None when unset or not a number."""
    try:
        return int(os.environ[variable])
    except (KeyError, ValueError):
        return None


def _stop_now(signum: int, frame: Optional[FrameType]) -> None:
    from largebatch.launch.exit_code import LINE_BY_LAUNCHER, report_exit_code

    name = signal.Signals(signum).name
    # the training loop's hook restores these handlers after its last checkpoint (read without
    # an import: before training, importing the engine would take seconds of torch imports)
    hook = getattr(sys.modules.get("largebatch.engine.preemption"), "PreemptionHook", None)
    if getattr(hook, "took_over", False):
        line = f"largebatch: preempted: {name} after the run's last checkpoint; nothing more to save"
    else:
        line = (f"largebatch: preempted: {name} before the first step; nothing to save yet: rerun the same "
                "command (resume=auto)")
    if not os.environ.get(LINE_BY_LAUNCHER):
        print(line, file=sys.stderr)
    report_exit_code(EXIT_PREEMPTED, line)
    sys.stdout.flush()
    sys.stderr.flush()
    # not an exception: the rank may be inside a blocking C call (the process group's
    # rendezvous) that would hold it until its timeout; nothing is written yet that could be torn
    os._exit(EXIT_PREEMPTED)


def stop_before_training() -> None:
    """SIGTERM/SIGINT/SIGHUP end this process with exit 75 and one line until the training loop
    installs its own handlers (a stop before the first step has nothing to save)."""
    for sig in STOP_SIGNALS:
        try:
            signal.signal(sig, _stop_now)
        except ValueError:  # not the main thread (embedded use)
            return


def start_rank(*, command_line: bool = False) -> None:
    """A training process's first act: a stop before training exits 75 in a torchrun rank and in
    a command-line process (``command_line``: ``largebatch-train`` run directly, which without
    it was killed silently, 143, for the seconds of its start-up, where the launch scripts said
    75 "nothing to save yet"); under torchrun the agent's death is a stop too. A ``main()``
    called inside another program (its tests, a notebook) keeps that program's handlers."""
    if under_torchrun() or command_line:
        stop_before_training()
    if under_torchrun():
        die_with_parent(expected_parent(AGENT_PID))
