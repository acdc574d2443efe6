"""Run a function on N real gloo ranks (spawned processes) and collect what each returns; or a
command (torchrun) to its end, stopped in its own session if it overruns (:func:`run_to_end`).

Each rank joins a gloo process group through a ``file://`` rendezvous in a temporary
directory, runs ``fn(rank, world_size, *args)`` and saves the return value with
``torch.save``; the parent loads the values in rank order. ``fn`` must be defined at module
level (it is pickled by name for the spawned interpreter).
"""

from __future__ import annotations

import datetime
import os
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from largebatch.comm.reducers import destroy_process_groups

__all__ = ["run_ranks", "run_to_end"]

# What the forkserver imports once, before it forks any rank (run_ranks(fork=True)): torch and
# what DDP's first construction imports (torch._dynamo), ~5 s of a spawned rank's start.
_PRELOAD = ["torch", "torch.distributed", "torch.nn.parallel", "torch._dynamo", "torchvision", "timm",
            "largebatch.comm", "largebatch.backends.torch_dist", "largebatch.nn", "largebatch.engine.loop",
            "largebatch.engine.evaluate", "tests.distributed.harness"]


def run_to_end(cmd: list[str], *, env: dict[str, str], cwd: Path, log: Path, timeout_s: float) -> Optional[int]:
    """Run ``cmd`` in its own session with its output in ``log``; its exit code, or None when it
    ran past ``timeout_s`` (then SIGTERM, as torchrun stops its workers, and SIGKILL to the session
    a minute later)."""
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd, start_new_session=True)
        try:
            return proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            return None


def _entry(rank: int, fn: Callable[..., Any], world_size: int, workdir: str, args: tuple,
           timeout_s: Optional[float] = None, parent: Optional[tuple[dict[str, str], str]] = None) -> None:
    if parent is not None:  # forked from the forkserver: the caller's environment and directory, as spawn has
        os.environ.clear()
        os.environ.update(parent[0])
        os.chdir(parent[1])
    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    dist.init_process_group(
        "gloo", init_method=f"file://{workdir}/rendezvous", rank=rank, world_size=world_size,
        **({"timeout": datetime.timedelta(seconds=timeout_s)} if timeout_s is not None else {}),
    )
    try:
        result = fn(rank, world_size, *args)
        torch.save(result, os.path.join(workdir, f"result_{rank}.pt"))
        del result
    finally:
        destroy_process_groups()  # not dist.destroy_process_group(): see its docstring


def run_ranks(fn: Callable[..., Any], world_size: int, *args: Any, timeout_s: Optional[float] = None,
              fork: bool = False) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` gloo ranks; return the results.

    ``timeout_s``: the process group's collective timeout (torch's default is 30 minutes), for
    tests of code that could leave ranks waiting on each other.
    ``fork``: fork the ranks from multiprocessing's forkserver (started once per test process, with
    torch, torch._dynamo, timm and largebatch imported: :data:`_PRELOAD`) instead of spawning fresh
    interpreters, each ~5 s of imports; each rank still gets the caller's current environment and
    working directory. A fresh process all the same: its own gloo group, nothing of the caller's state.
    """
    parent = (dict(os.environ), os.getcwd()) if fork else None
    if fork:
        mp.set_forkserver_preload(_PRELOAD)  # no effect once this process's forkserver runs
    with tempfile.TemporaryDirectory(prefix="lb_dist_") as workdir:
        mp.start_processes(
            _entry,
            args=(fn, world_size, workdir, args, timeout_s, parent),
            nprocs=world_size,
            join=True,
            start_method="forkserver" if fork else "spawn",
        )
        return [
            torch.load(Path(workdir) / f"result_{r}.pt", weights_only=False)
            for r in range(world_size)
        ]
