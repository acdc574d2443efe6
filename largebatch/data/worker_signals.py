"""Loader worker processes outlive a SIGTERM/SIGINT to the whole job until the main process ends them.

Why: schedulers signal every process of a job, not one: SLURM signals each process of a
step (time limit, ``scancel``), ``kill -- -PGID`` and a terminal's Ctrl-C signal the process
group. A DataLoader worker killed that way makes torch's SIGCHLD handler raise "DataLoader
worker (pid ...) is killed by signal" in the main process, wherever it is (mid-step, during
a checkpoint write), and the run ends with exit 1 and no preemption checkpoint. The main
process already turns the signal into a stop after the current step
(:mod:`largebatch.engine.preemption`); its workers only have to keep serving batches (the
rest of the step, an evaluation under way) until the main process shuts them down.

How:

* :func:`ignoring_stop_signals` is the workers' ``worker_init_fn``: each worker ignores
  SIGTERM/SIGINT while the main process runs. Once the main process has begun to exit (a
  shared byte its ``atexit`` hook sets), a stop signal ends the worker at once:
  ``multiprocessing`` terminates the daemonic workers still alive at interpreter exit (the
  loaders sit in reference cycles, or in a crash's traceback), and a worker that ignored
  that would keep the exit waiting on it forever. A main process killed outright leaves no waiter: torch's workers notice their
  parent is gone within seconds and exit.
* :func:`shutdown_workers` ends a DataLoader's workers at once, when the run is over: the
  workers' stop handler is switched to "exit" for it, and each worker is sent SIGTERM.
* :func:`stop_signals_blocked`: workers are forked with SIGTERM/SIGINT blocked, so a signal
  arriving between the fork and the ``worker_init_fn`` waits for the handler instead of
  killing the new worker (the main process gets it when the block ends).
* A worker whose main process was killed outright prints nothing: a worker hands a batch's
  tensors to its main process as file descriptors, served by ``multiprocessing``'s
  resource-sharer thread, and a main process killed (SIGKILL, the OOM killer) mid-handshake
  left that thread's ``ConnectionResetError`` traceback (15 lines) under torchrun's one line
  naming the killed rank. The thread reports through ``sys.excepthook``; the workers' hook
  drops a connection error raised in that thread and passes everything else on.

DALI pipelines run threads, not processes: a signal is handled by the main thread's
handler whichever thread the kernel picks, so they need neither.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import multiprocessing
import os
import signal
import sys
import traceback
from types import FrameType, TracebackType
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional, Type

from largebatch.errors import STOP_SIGNALS  # SIGTERM, SIGINT, SIGHUP

if TYPE_CHECKING:
    from torch.utils.data import DataLoader

__all__ = ["STOP_SIGNALS", "ignoring_stop_signals", "shutdown_workers", "stop_signals_blocked"]


_main_exiting: Any = None  # a shared byte: 1 once the main process runs its atexit hooks


def _exiting_flag() -> Any:
    """The shared "main process is exiting" byte, created (with its atexit hook) on first use.

    Registered after ``multiprocessing``'s own exit hook (imported with torch), so it runs
    first: the byte is set before that hook terminates the workers.
    """
    global _main_exiting
    if _main_exiting is None:
        _main_exiting = multiprocessing.RawValue("b", 0)  # lock-free: read in a signal handler
        atexit.register(_mark_exiting, _main_exiting)
    return _main_exiting


def _mark_exiting(flag: Any) -> None:
    flag.value = 1


def _on_stop_signal(flag: Any, signum: int, frame: Optional[FrameType]) -> None:
    if flag.value:
        # The main process is exiting and ends its workers. Exit 0, as torch's own worker
        # handler does for its parent's SIGTERM: death by a signal would make the parent's
        # SIGCHLD handler print "DataLoader worker ... is killed by signal" on the way out.
        os._exit(0)


def _quiet_when_the_main_process_is_gone(previous: Callable[..., Any], exc_type: Type[BaseException],
                                         exc: BaseException, tb: Optional[TracebackType]) -> None:
    """The workers' ``sys.excepthook``: nothing for a connection error of the fd-sharing thread."""
    in_the_sharer = any(frame.f_code.co_filename.endswith(os.path.join("multiprocessing", "resource_sharer.py"))
                        for frame, _ in traceback.walk_tb(tb))
    if in_the_sharer and issubclass(exc_type, (ConnectionError, EOFError)):
        return
    previous(exc_type, exc, tb)


def _init_worker(flag: Any, then: Optional[Callable[[int], None]], worker_id: int) -> None:
    sys.excepthook = functools.partial(_quiet_when_the_main_process_is_gone, sys.excepthook)
    handler = functools.partial(_on_stop_signal, flag)
    for sig in STOP_SIGNALS:
        signal.signal(sig, handler)
    # Blocked at the fork (stop_signals_blocked); one that arrived since meets the handler now.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    if then is not None:
        then(worker_id)


def ignoring_stop_signals(worker_init_fn: Optional[Callable[[int], None]] = None) -> Callable[[int], None]:
    """A DataLoader ``worker_init_fn``: ignore SIGTERM/SIGINT until the main process exits,
    then call ``worker_init_fn`` (if any). Picklable, so it also works with spawned workers."""
    return functools.partial(_init_worker, _exiting_flag(), worker_init_fn)


@contextlib.contextmanager
def stop_signals_blocked() -> Iterator[None]:
    """Block SIGTERM/SIGINT in the calling thread for the block (wrap the ``iter(loader)``
    that starts workers); a signal that arrives meanwhile is delivered when it ends."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def shutdown_workers(loader: DataLoader) -> None:
    """End the worker processes of ``loader`` (a ``DataLoader``) now, in well under a second.

    Why not leave it to torch: a DataLoader with persistent workers keeps their iterator and
    ends them only in its ``__del__`` (there is no public call), by a ``None`` on each index
    queue and a 5 s join, then SIGTERM and another 5 s join. Seen under torchrun at the end of
    a preempted run: the sentinel never reached the workers (the queue's feeder thread was
    gone), the workers ignore SIGTERM while the main process runs (this module), and each
    worker took the full 10 s, during garbage collection inside the process-group shutdown:
    20 s after the checkpoint, past docker's 10 s stop grace (exit 137 instead of 75). Here
    the stop handler of this process's workers exits for the duration, each worker gets
    SIGTERM and exits at once, and torch's own shutdown then finds them gone.
    """
    iterator = getattr(loader, "_iterator", None)  # torch's persistent-workers iterator
    workers = getattr(iterator, "_workers", None)
    if iterator is None or workers is None:
        return
    flag = _exiting_flag()
    previous = flag.value
    flag.value = 1
    try:
        for worker in workers:
            if worker.is_alive():
                worker.terminate()
        iterator._shutdown_workers()
    finally:
        flag.value = previous
    loader._iterator = None
