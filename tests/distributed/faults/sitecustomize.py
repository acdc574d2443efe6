"""Test-only fault injection for torchrun workers (put this folder on PYTHONPATH).

``LARGEBATCH_TEST_FAULT=RANK:STEP:SIGNAL`` makes the worker of that rank send itself SIGNAL
(e.g. SIGKILL, SIGTERM) right after optimizer step STEP, in the first attempt only
(``TORCHELASTIC_RESTART_COUNT`` 0), so a restarted worker group runs clean. Nothing here is
imported by largebatch itself; Python imports ``sitecustomize`` at start-up when it is on
the path.

``LARGEBATCH_TEST_EXIT_THREADS=1`` makes each worker print, as the interpreter starts to
exit (the last ``atexit`` handler, before finalization), how many native threads (not
Python threads) are still running. A gloo process group that is still alive then has its
worker threads there, and one of them may need the GIL during finalization (see
``largebatch.backends.torch_dist.TorchDistributedBackend.shutdown``).

``LARGEBATCH_TEST_NOISE_SIZES=PREFIX`` makes each worker append, per noise-scale update, the
two batch sizes the tracker is handed (``B_small B_big``, one line) to ``PREFIX.rank<RANK>``.
"""

import os
import signal


def _install(spec: str) -> None:
    rank, step, name = spec.split(":")
    if os.environ.get("RANK") != rank or os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0":
        return
    from largebatch.engine import loop

    real_run_step = loop.Trainer.run_step

    def run_step(self, micro_batches):  # type: ignore[no-untyped-def]
        real_run_step(self, micro_batches)
        if self.state.step == int(step):
            os.kill(os.getpid(), getattr(signal, name))

    loop.Trainer.run_step = run_step


if os.environ.get("LARGEBATCH_TEST_FAULT"):
    import faulthandler

    faulthandler.register(signal.SIGUSR1)  # `kill -USR1 <pid>` prints every thread's stack

if os.environ.get("LARGEBATCH_TEST_FAULT") and "RANK" in os.environ:
    _install(os.environ["LARGEBATCH_TEST_FAULT"])


def _report_native_threads() -> None:
    import threading

    native = len(os.listdir("/proc/self/task")) - threading.active_count()
    if native:
        print(f"largebatch-test: {native} native thread(s) alive at exit (rank {os.environ['RANK']})", flush=True)


if os.environ.get("LARGEBATCH_TEST_EXIT_THREADS") and "RANK" in os.environ and os.path.isdir("/proc/self/task"):
    import atexit

    atexit.register(_report_native_threads)  # registered first: runs last


def _record_noise_sizes(prefix: str) -> None:
    from largebatch.diagnostics.noise_scale import GradientNoiseScale

    real_update = GradientNoiseScale.update
    path = f"{prefix}.rank{os.environ['RANK']}"

    def update(self, sq_small, b_small, sq_big, b_big):  # type: ignore[no-untyped-def]
        with open(path, "a") as f:
            f.write(f"{int(b_small)} {int(b_big)}\n")
        real_update(self, sq_small, b_small, sq_big, b_big)

    GradientNoiseScale.update = update


if os.environ.get("LARGEBATCH_TEST_NOISE_SIZES") and "RANK" in os.environ:
    _record_noise_sizes(os.environ["LARGEBATCH_TEST_NOISE_SIZES"])
