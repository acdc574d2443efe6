"""Issue 54 item 2: a stop is a stop under torchrun (``launch/torchrun.sh``, 2 gloo ranks).

- ``MAX_RESTARTS`` > 0: a rank that saved and exited 75 was read by torchrun as a failure; it
  restarted the group and the job trained on. Now the job ends 75, no restart.
- a stop while the ranks start (~10-15 s) ended 1, 129, 130 or 143 with a torchrun warning or a
  gloo traceback; now 75 and one line (nothing to save yet), so a requeue-on-75 wrapper requeues.
- SIGINT to every process mid-training once ended 130 without the checkpoint: each rank got it
  twice (directly and from the agent) and took the second for a second Ctrl-C, and the agent got
  it twice (directly and from the launch shell) and ended inside its wait for the saving ranks.
- a rank killed by SIGKILL ended with torchrun's ``=====`` box; now one line naming the rank,
  the signal and ``resume=auto``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from largebatch.engine.checkpoint import list_checkpoints
from tests.distributed.test_launcher_death import ARGS, LAUNCH, _children, _env, _processes_naming
from tests.signals import wait_for_checkpoint


def _default_signals() -> None:
    """As a terminal starts it: a suite run in the background passes SIGINT ignored to its children."""
    for sig in (signal.SIGINT, signal.SIGQUIT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


def _start(tmp_path: Path, run: Path, **extra: str) -> subprocess.Popen:
    return subprocess.Popen(["bash", str(LAUNCH / "torchrun.sh"), *ARGS, f"run_dir={run}"],
                            env={**_env(tmp_path), **extra}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True, preexec_fn=_default_signals)


def _ranks(run: Path) -> list[int]:
    """The ranks' pids (the agent's children; not their loader workers)."""
    agents = [pid for pid, cmd in _processes_naming(f"run_dir={run}").items() if "largebatch.launch.torchrun" in cmd]
    return _children(agents[0]) if agents else []


def _finish(proc: subprocess.Popen, run: Path, timeout_s: float = 90) -> tuple[str, str]:
    try:
        return proc.communicate(timeout=timeout_s)
    finally:
        if proc.poll() is None:
            for pid in _processes_naming(f"run_dir={run}"):
                os.kill(pid, signal.SIGKILL)
            proc.communicate()


def _last_line(err: str) -> str:
    lines = err.strip().splitlines()
    return lines[-1] if lines else ""


def test_a_stop_to_one_rank_with_restarts_left_ends_the_job_75(tmp_path: Path) -> None:
    run = tmp_path / "run"
    proc = _start(tmp_path, run, MAX_RESTARTS="3")
    wait_for_checkpoint(run / "checkpoints", proc)
    os.kill(_ranks(run)[0], signal.SIGTERM)
    out, err = _finish(proc, run)
    assert proc.returncode == 75, (out[-2000:], err[-3000:])
    assert _last_line(err).startswith("largebatch: preempted:"), err[-3000:]


def _until_the_ranks_run(proc: subprocess.Popen, run: Path, timeout_s: float = 60) -> None:
    """Until the agent has started both ranks (still importing: training is seconds away)."""
    deadline = time.monotonic() + timeout_s
    while len(_ranks(run)) < 2:
        assert proc.poll() is None and time.monotonic() < deadline, "the ranks never started"
        time.sleep(0.05)


@pytest.mark.parametrize("moment", ["launcher", "ranks"])
def test_a_stop_while_the_ranks_start_is_75_and_one_line(tmp_path: Path, moment: str) -> None:
    """SIGTERM to the job's group while the launcher starts (0.5 s in), or once the agent has
    started the ranks (they are importing)."""
    run = tmp_path / "run"
    proc = _start(tmp_path, run)
    if moment == "launcher":
        time.sleep(0.5)
    else:
        _until_the_ranks_run(proc, run)
    assert not list_checkpoints(run / "checkpoints"), "training began before the signal: lengthen nothing, shorten delay"
    os.killpg(proc.pid, signal.SIGTERM)
    out, err = _finish(proc, run)
    assert proc.returncode == 75, (out[-2000:], err[-3000:])
    assert "before the first step; nothing to save yet" in _last_line(err), err[-3000:]
    assert "Traceback" not in err and "WARNING" not in err, err[-3000:]


def test_sigint_to_every_process_saves_and_exits_75(tmp_path: Path) -> None:
    run = tmp_path / "run"
    proc = _start(tmp_path, run)
    wait_for_checkpoint(run / "checkpoints", proc)
    for pid in _processes_naming(f"run_dir={run}"):  # the shell, the agent, the ranks, their workers
        try:
            os.kill(pid, signal.SIGINT)
        except ProcessLookupError:
            pass
    out, err = _finish(proc, run)
    assert proc.returncode == 75, (out[-2000:], err[-3000:])
    assert (out + err).count("SIGINT received: finishing the current step") == 2, (out + err)[-3000:]
    assert _last_line(err).startswith("largebatch: preempted: preempted (SIGINT)"), err[-3000:]


def test_a_rank_killed_by_sigkill_is_one_line_naming_it(tmp_path: Path) -> None:
    run = tmp_path / "run"
    proc = _start(tmp_path, run)
    wait_for_checkpoint(run / "checkpoints", proc)
    os.kill(_ranks(run)[1], signal.SIGKILL)
    out, err = _finish(proc, run)
    assert proc.returncode == 137, (out[-2000:], err[-3000:])
    last = _last_line(err)
    assert "rank 1" in last and "SIGKILL" in last and "resume=auto" in last, err[-3000:]
    assert "=====" not in err, err[-3000:]
    assert err.strip() == last, err[-3000:]  # issue 75 item 6c: no gloo traceback from the surviving rank
