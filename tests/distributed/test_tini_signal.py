"""``docker stop`` / a cloud preemption, without a container runtime: the image's entry points run
exactly as the image runs them, under ``tini``, and SIGTERM goes to the top process alone (what
``docker stop`` and Kubernetes send to a container's PID 1). Every entry point must save a
checkpoint and exit 75, with 1 and 2 ranks.

- ``tini -- largebatch-train``: the image's default entry point;
- ``tini -- launch/torchrun.sh``: tini passes the signal to the launch shell only, which must
  forward it to torchrun (before, the shell waited for torchrun and never passed it on: docker
  stop SIGKILLed the job after 10 s, exit 137, no checkpoint);
- ``launch/torchrun.sh`` as PID 1 of a PID namespace (``docker run --entrypoint
  /opt/largebatch/launch/torchrun.sh``): the script starts again under tini, so tini is PID 1.

Skipped with the reason where ``tini`` is absent (``apt-get install tini``).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from largebatch.engine.checkpoint import list_checkpoints, load_checkpoint
from tests.signals import wait_for_checkpoint
from tests.smoke import smoke

LAUNCH = Path(__file__).resolve().parents[2] / "launch"
TINI = shutil.which("tini")
pytestmark = pytest.mark.skipif(TINI is None, reason="tini is not installed (apt-get install -y tini)")

# resnet10t, named (it is also the default): the subject is the signal's path, not the model;
# 10 epochs leave the signal time to arrive
ARGS = smoke(
    "backend=cpu", "model=resnet10t", "data.loader=torchvision", "data.workers=1", "data.synthetic.train_per_class=16",
    "epochs=10",  # 8 steps per epoch: 80 steps
    "checkpoint.every_steps=1", "precision=fp32",
)
STEPS = 80


def _env(nproc: int) -> dict[str, str]:
    env = {**os.environ, "TORCHRUN": str(Path(sys.executable).with_name("torchrun")),
           "NPROC_PER_NODE": str(nproc), "OMP_NUM_THREADS": "1"}
    env.pop("LB_DRY_RUN", None)
    return env


def _train_command() -> list[str]:
    """The image's ``largebatch-train``; this environment's console script where it is installed."""
    script = Path(sys.executable).with_name("largebatch-train")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "largebatch.train"]


def _stop_and_check(proc: subprocess.Popen, run: Path, target: int, ranks: int,
                    sig: signal.Signals = signal.SIGTERM, steps: int = STEPS, pids_here: bool = True) -> float:
    """``sig`` to ``target`` alone once training is under way: checkpoint saved, exit 75, before
    the run's ``steps``. Returns the seconds from the signal to the exit."""
    try:
        wait_for_checkpoint(run / "checkpoints", proc)
        # the run's rank 0 holds its lock, which names its pid (in its own PID namespace)
        rank0 = json.loads((run / ".lock").read_text())["pid"] if pids_here else None
        sent = time.monotonic()
        os.kill(target, sig)
        out, err = proc.communicate(timeout=180)
        took = time.monotonic() - sent
        # issue 90 case 8: the launch returned 75 while a rank still ran for 1-3 s
        assert rank0 is None or not _running(rank0), f"rank 0 (pid {rank0}) still runs after the launch returned"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == 75, (out[-3000:], err[-3000:])
    assert (out + err).count(f"{sig.name} received: finishing the current step") == ranks, (out + err)[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    last = load_checkpoint(list_checkpoints(run / "checkpoints")[-1])["train_state"]["step"]
    assert summary["stop_reason"].startswith(f"preempted ({sig.name})") and summary["steps"] == last < steps
    assert not list((run / "checkpoints").glob("*.tmp*")), "a partial checkpoint was left"
    return took


def _running(pid: int) -> bool:
    """Whether ``pid`` runs (not gone, not a zombie waiting to be reaped)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def _start(argv: list[str], env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


# SIGHUP (issue 43 case 2): tini passes it on and the run treats it as SIGTERM (it was exit 129)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
def test_default_entry_point_under_tini_saves_and_exits_75(tmp_path: Path, sig: signal.Signals) -> None:
    run = tmp_path / "run"
    proc = _start([TINI, "--", *_train_command(), *ARGS, f"run_dir={run}"], _env(1))
    _stop_and_check(proc, run, proc.pid, ranks=1, sig=sig)


# 2 ranks under plain ``tini --``: test_docker_stop_of_two_ranks_... below (the same entry point)
@pytest.mark.parametrize(("nproc", "tini_args"), [(1, []), (2, ["-g"])])
def test_torchrun_entry_point_under_tini_saves_and_exits_75(tmp_path: Path, nproc: int, tini_args: list[str]) -> None:
    """With ``tini -g`` the launch shell's whole group gets the signal: torchrun must get it once, not
    also from the shell's forwarding (a second one ends its wait for the saving workers)."""
    run = tmp_path / "run"
    proc = _start([TINI, *tini_args, "--", str(LAUNCH / "torchrun.sh"), *ARGS, f"run_dir={run}"], _env(nproc))
    _stop_and_check(proc, run, proc.pid, ranks=nproc)


def _pid1_of(unshare_pid: int, timeout_s: float = 30) -> int:
    """The host pid of the namespace's PID 1: the child ``unshare --fork`` started."""
    children = Path(f"/proc/{unshare_pid}/task/{unshare_pid}/children")
    deadline = time.time() + timeout_s
    while not children.read_text().split():
        assert time.time() < deadline, "unshare started no child"
        time.sleep(0.05)
    return int(children.read_text().split()[0])


def test_torchrun_script_as_pid1_restarts_under_tini_and_exits_75(tmp_path: Path) -> None:
    """``docker run --entrypoint /opt/largebatch/launch/torchrun.sh``: bash is PID 1."""
    probe = subprocess.run(["unshare", "--pid", "--fork", "true"], capture_output=True, timeout=30)
    if probe.returncode != 0:
        pytest.skip(f"cannot make a PID namespace here (unshare --pid needs root): {probe.stderr!r}")
    run = tmp_path / "run"
    proc = _start(["unshare", "--pid", "--fork", "--kill-child", str(LAUNCH / "torchrun.sh"), *ARGS,
                   f"run_dir={run}"], _env(2))
    pid1 = _pid1_of(proc.pid)
    wait_for_checkpoint(run / "checkpoints", proc)
    assert Path(f"/proc/{pid1}/comm").read_text().strip() == "tini", "PID 1 is not tini"
    _stop_and_check(proc, run, pid1, ranks=2, pids_here=False)  # the lock's pid is the namespace's


def test_docker_stop_of_two_ranks_with_loader_workers_exits_75_within_the_grace(tmp_path: Path) -> None:
    """``docker stop``'s default grace is 10 s. Rank 1 once spent ~20 s after the checkpoint
    joining its loader workers (torch's 5 s join timeouts, in the garbage collection of the
    process-group shutdown): the runtime SIGKILLed the job, exit 137 (issue 60). The issue's
    command, as a cloud job runs it. Also ``tini -- launch/torchrun.sh`` with 2 ranks: the shell
    passes the signal on, each rank saves, exit 75 (debug=smoke: 4 steps an epoch)."""
    run = tmp_path / "run"
    args = ["backend=cpu", "debug=smoke", "progress=false", "epochs=400", "data.loader=torchvision", "data.workers=1", f"run_dir={run}"]
    proc = _start([TINI, "--", str(LAUNCH / "torchrun.sh"), *args], _env(2))
    took = _stop_and_check(proc, run, proc.pid, ranks=2, steps=4 * 400)
    assert took < 10, f"exit 75 came {took:.1f} s after SIGTERM: docker stop would have SIGKILLed it (137)"
