"""``python -m largebatch.launch.torchrun``: torchrun itself (``torch.distributed.run``: the same
arguments, rendezvous, agent and restarts), as the launch scripts start it, minus the wall of text
it adds after the ranks have already said why they stopped.

When a worker exits non-zero, torchrun's agent logs an error per rank and its entry point ends
with a ``ChildFailedError`` traceback and banner (34 lines for one bad override on 2 ranks); a
stop signal ends it with a ``SignalException`` traceback. Under ``launch/*.sh`` every rank has
written its documented exit code and its one line (:mod:`largebatch.launch.exit_code`), and the
script prints that line once, last. So, when the script asked for the codes
(``LARGEBATCH_EXIT_DIR``), the agent's log records are held back and its failure is not re-raised:
printed only where no rank wrote a code (a crash, a kill: then they are the only explanation).
Run without that variable, this is torchrun unchanged.

Under the launch scripts the agent also (issue 54):

* ends with the launch shell (``prctl(PR_SET_PDEATHSIG, SIGTERM)``, see
  :mod:`largebatch.launch.lifetime`): a ``kill -KILL -- -PGID`` of the launch used to leave the
  agent and its ranks training unsupervised, holding the run lock. Its ranks end with it alike;
* never restarts the group after a rank exited 75 (preempted: it saved, and so did the others):
  the job ends 75 whatever ``--max-restarts`` says, so a requeue-on-75 wrapper requeues it;
* passes on one stop signal, once: a second one (the signal sent to every process, plus the
  launch shell's forwarding of it) raised again inside torchrun's wait for the saving ranks and
  ended the agent before they reported (exit 130, no checkpoint);
* reports a stop that came before any rank could take it (while they start) as exit 75 with one
  line, not torchrun's 1, 129, 130 or 143, and a rank killed by a signal (SIGKILL: the OOM
  killer) with one line naming the rank and the signal instead of torchrun's box;
* returns only once its ranks have ended (at most :data:`RANKS_END_S` seconds): a rank writes its
  exit code after saving and may still be shutting down (its loader workers, its process group)
  when torchrun's wait ends, and a container runtime that sees the launch end takes the rank's
  files and processes with it.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from collections import deque
from pathlib import Path
from types import FrameType
from typing import Any, Callable, Optional, Sequence

from largebatch.launch.exit_code import ENV
from largebatch.launch.lifetime import AGENT_PID, LAUNCHER_PID, die_with_parent, expected_parent

__all__ = ["main"]

_HELD = 2000  # agent records kept for the end (a long elastic job logs a few per restart)
RANKS_END_S = 30.0  # the longest the agent waits for its ranks to end before it returns
_RANK_PIDS: set[int] = set()  # every rank process the agent started (all restarts)


class _Held(logging.Handler):
    """Keeps the agent's records until the end of the run."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: deque[logging.LogRecord] = deque(maxlen=_HELD)

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def _ranks_reported(directory: str) -> bool:
    return any(Path(directory).glob("exit-*-*"))


def _all_preempted(directory: str) -> bool:
    """Whether every rank of the latest group wrote 75 (each took the stop: saved, or nothing to
    save yet), read as the launch scripts read it (``launch/lib.sh``'s ``latest_restart``)."""
    codes: dict[int, list[str]] = {}
    for path in Path(directory).glob("exit-*-*"):
        try:
            restart = int(path.name.split("-")[1])
            first = path.read_text().split("\n", 1)[0].strip()
        except (OSError, ValueError):
            return False
        codes.setdefault(restart, []).append(first)
    return bool(codes) and all(code == str(_PREEMPTED) for code in codes[max(codes)])


_PREEMPTED = 75  # largebatch.errors.EXIT_PREEMPTED
_STOPS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)  # largebatch.errors.STOP_SIGNALS (no torch import here)


def _agent_class(directory: str) -> type:
    """torchrun's ``LocalElasticAgent``, reading each failed group's exit codes before torchrun
    decides on a restart (``_monitor_workers`` is the agent's documented extension point; torch
    itself sets ``_remaining_restarts = 0`` to rule out a restart)."""
    from torch.distributed.elastic.agent.server.api import WorkerState
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

    class _Agent(LocalElasticAgent):
        def _start_workers(self, worker_group: Any) -> Any:
            pids = super()._start_workers(worker_group)
            _RANK_PIDS.update(pids.values())
            return pids

        def _monitor_workers(self, worker_group: Any) -> Any:
            result = super()._monitor_workers(worker_group)
            if result.state == WorkerState.FAILED:
                restart = worker_group.spec.max_restarts - self._remaining_restarts
                codes = {rank: failure.exitcode for rank, failure in result.failures.items()}
                stopped = any(code < 0 and -code in _STOPS for code in codes.values())  # see _report_killed
                if _PREEMPTED in codes.values() or stopped:
                    self._remaining_restarts = 0  # a stop: the job ends 75, no restart
                for rank, code in codes.items():
                    if code < 0:
                        _report_killed(directory, restart, rank, signal.Signals(-code).name)
            return result

    return _Agent


def _alive(pid: int) -> bool:
    """Whether process ``pid`` still runs (a zombie, dead but not yet reaped, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def _wait_for_ranks(pids: set[int], timeout_s: float = RANKS_END_S) -> None:
    """Wait, at most ``timeout_s``, until none of ``pids`` runs; reap those that are this process's
    children (torchrun's ranks are, and it may not have reaped them yet)."""
    import time

    deadline = time.monotonic() + timeout_s
    while True:
        for pid in list(pids):
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass  # not ours, or reaped already
        if not any(_alive(pid) for pid in pids) or time.monotonic() >= deadline:
            return
        time.sleep(0.05)


def _write_code(directory: str, restart: int, rank: int, code: int, line: str) -> None:
    """Write a rank's code and line for the launch script. The folder may not exist yet (under
    ``launch/slurm.sbatch`` it is in a run directory the ranks have not made yet), and this runs
    inside signal handlers: an exception here would surface in whatever the main thread was
    doing (an import that swallows ``OSError``, say) and the stop would be lost, so nothing is
    raised; the exit code itself still reaches the script."""
    try:
        Path(directory).mkdir(parents=True, exist_ok=True)
        (Path(directory) / f"exit-{restart}-{rank}").write_text(f"{code}\n{line}\n")
    except OSError:
        pass


def _report_killed(directory: str, restart: int, rank: int, signal_name: str) -> None:
    """The line and code of a rank a signal killed before it could write its own: 128 + signal,
    or 75 for a stop signal. A rank turns every stop signal into a save and exit 75 from its
    first line of Python on; one that died of a stop signal got it while its interpreter was
    still starting, before the first step: a stop with nothing to save (a requeue-on-75 wrapper
    requeues it), not a failure."""
    path = Path(directory) / f"exit-{restart}-{rank}"
    if path.exists():
        return
    number = int(getattr(signal, signal_name))
    if number in _STOPS:
        line = (f"largebatch: preempted: {signal_name} reached rank {rank} as it started, before the first step; "
                "nothing to save yet: rerun the same command (resume=auto)")
        _write_code(directory, restart, rank, _PREEMPTED, line)
        return
    line = (f"largebatch: error: rank {rank} was killed by {signal_name} (the out-of-memory killer or a kill -9?); "
            "the other ranks were stopped: continue from the last checkpoint with resume=auto and the same run_dir")
    _write_code(directory, restart, rank, 128 + number, line)


def _once(handler: Callable[[int, Optional[FrameType]], None]) -> Callable[[int, Optional[FrameType]], None]:
    """torchrun's stop handler, passing on the first stop signal only (the rest would end the
    agent inside its wait for the ranks' checkpoints)."""
    stopping: list[int] = []

    def first_only(signum: int, frame: Optional[FrameType]) -> None:
        if stopping:
            return
        stopping.append(signum)
        handler(signum, frame)

    return first_only


def _report_early_stop(directory: str, sigval: int) -> None:
    """A stop signal before any rank could take it: exit 75, one line (nothing to save yet)."""
    name = signal.Signals(sigval).name
    line = f"largebatch: preempted: {name} before the first step; nothing to save yet: rerun the same command"
    _write_code(directory, 0, 0, _PREEMPTED, line)


def _exit_early(directory: str, signum: int) -> None:
    _report_early_stop(directory, signum)
    os._exit(_PREEMPTED)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    directory = os.environ.get(ENV)
    if directory:
        # until torchrun's own handlers are in (when it starts the ranks), a stop has nothing to
        # stop: importing torch alone takes seconds, and the default action was exit 143
        for sig in _STOPS:
            signal.signal(sig, lambda signum, frame: _exit_early(directory, signum))
        if LAUNCHER_PID in os.environ:  # under launch/*.sh: end with the launch shell, from before
            # the seconds of torch imports on (a SIGKILL of the shell then left this agent to start
            # its ranks unsupervised); the SIGTERM it sends is the early stop above until torchrun's
            # handlers are in
            die_with_parent(expected_parent(LAUNCHER_PID))

    import torch.distributed.elastic.multiprocessing.api as processes
    import torch.distributed.launcher.api as launcher
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun_main
    from torch.distributed.run import parse_args, run

    if not directory:
        torchrun_main(args)
        return 0
    os.environ[AGENT_PID] = str(os.getpid())  # the parent each rank expects (largebatch.launch.lifetime)
    launcher.LocalElasticAgent = _agent_class(directory)
    processes._terminate_process_handler = _once(processes._terminate_process_handler)
    held = _Held()
    # torch's own logging set-up gives "torch.distributed" a stderr handler (and no propagation):
    # the agent's records go to the held ones instead
    agent_log = logging.getLogger("torch.distributed")
    agent_log.handlers = [held]
    agent_log.propagate = False
    code, failure = 0, None
    try:
        run(parse_args(args))
    except ChildFailedError as e:
        code, failure = 1, e.format_msg()
    except SignalException as e:
        code = 128 + int(e.sigval)
        if e.sigval in _STOPS and not _ranks_reported(directory):
            _report_early_stop(directory, e.sigval)
            return _PREEMPTED
        if e.sigval in _STOPS and _all_preempted(directory):
            return _PREEMPTED  # the ranks took the stop (saved, or had nothing to save yet)
    finally:
        _wait_for_ranks(_RANK_PIDS)
    if code and not _ranks_reported(directory):
        formatter = logging.Formatter("%(levelname).1s%(asctime)s %(process)d %(name)s] %(message)s")
        for record in held.records:
            print(formatter.format(record), file=sys.stderr)
        if failure:
            print(failure, file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
