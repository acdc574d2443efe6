"""Issue 54 item 1: nothing of a job outlives its launcher by more than about a step and a checkpoint.

``kill -KILL -- -PGID`` of ``launch/torchrun.sh`` (``timeout -s KILL``, a CI cancel, the OOM
killer) kills the launch shell's group only: torchrun's agent runs in a group of its own and each
rank in a session of its own. They trained on unsupervised, held the run lock (the relaunch was
refused as "in use") and one finished the run alone. SIGKILL of the agent alone left the ranks
the same way. Each now ends with its parent (``PR_SET_PDEATHSIG``: the preemption path, a
checkpoint and exit 75), and ``resume=auto`` continues: in this process, at world size 1 (what
is tested there is that the killed job left a whole checkpoint and no lock held; a relaunch
under torchrun would add seconds of imports to what this test is about).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from largebatch.cli import main
from largebatch.engine.checkpoint import list_checkpoints, load_checkpoint
from tests.signals import wait_for_checkpoint
from tests.smoke import smoke

LAUNCH = Path(__file__).resolve().parents[2] / "launch"
ROOT = LAUNCH.parent
ARGS = smoke(
    "backend=cpu", "data.loader=torchvision", "data.workers=1", "data.synthetic.train_per_class=16",
    "epochs=30",  # 8 steps per epoch: 240 steps, far more than the test waits for
    "checkpoint.every_steps=1", "precision=fp32",
)


def _env(tmp_path: Path) -> dict[str, str]:
    """The scripts' default TORCHRUN (python3 -m largebatch.launch.torchrun), this venv first."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "NPROC_PER_NODE": "2", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    for key in ("TORCHRUN", "LB_DRY_RUN", "LARGEBATCH_EXIT_DIR", "LARGEBATCH_LINE_BY_LAUNCHER", "MAX_RESTARTS"):
        env.pop(key, None)
    return env


def _processes_naming(text: str) -> dict[int, str]:
    """Live processes whose command line contains ``text`` (no psutil: /proc)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = next(line for line in (entry / "status").read_text().splitlines() if line.startswith("State:"))
        except (OSError, StopIteration):
            continue
        if text in cmdline and "zombie" not in state:
            found[int(entry.name)] = cmdline
    return found


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _wait_until_gone(run: Path, proc: subprocess.Popen, timeout_s: float = 20) -> dict[int, str]:
    deadline = time.monotonic() + timeout_s
    while (left := _processes_naming(f"run_dir={run}")) and time.monotonic() < deadline:
        proc.poll()  # reap the launch shell
        time.sleep(0.2)
    return left


@pytest.mark.parametrize("victim", ["launch group", "agent"])
def test_nothing_outlives_a_killed_launcher_and_resume_works(tmp_path: Path, victim: str) -> None:
    run = tmp_path / "run"
    err_file = tmp_path / "stderr"
    with open(err_file, "w") as err_out:
        proc = subprocess.Popen(["bash", str(LAUNCH / "torchrun.sh"), *ARGS, f"run_dir={run}"], env=_env(tmp_path),
                                stdout=subprocess.DEVNULL, stderr=err_out, start_new_session=True)
    try:
        wait_for_checkpoint(run / "checkpoints", proc)
        job = _processes_naming(f"run_dir={run}")
        assert len(job) >= 4, job  # the shell, the agent, 2 ranks
        if victim == "agent":
            agent = _children(proc.pid)[0]
            assert "largebatch.launch.torchrun" in job[agent], job
            os.kill(agent, signal.SIGKILL)
        else:
            os.killpg(proc.pid, signal.SIGKILL)  # timeout -s KILL, a CI cancel: the launch's group
        killed = time.monotonic()
        left = _wait_until_gone(run, proc)
        took = time.monotonic() - killed
    finally:
        for pid in _processes_naming(f"run_dir={run}"):
            os.kill(pid, signal.SIGKILL)
        proc.wait(timeout=30)
    assert not left, f"still running {took:.0f} s after the {victim} was killed: {left}"
    assert took < 15, took
    if victim == "agent":
        # issue 75 item 6b: the launch ended 137 with bash's "line 46: ... Killed" notice and no
        # line, while the ranks saved and printed a summary that read like a finished run; it
        # now waits for them and ends with their code and a line saying why and how to continue
        err = err_file.read_text()
        assert proc.returncode == 75, err[-3000:]
        assert "Killed" not in err, err[-3000:]
        last = err.strip().splitlines()[-1]
        # the rank names the launcher's end where it sees it first; a SIGTERM that reaches the rank
        # before it does (the agent's death signal) is the same stop, said as a plain SIGTERM
        assert last.startswith(("largebatch: preempted: preempted (SIGTERM: its launcher, torchrun's agent, ended)",
                                "largebatch: preempted: preempted (SIGTERM) at step")), last
        assert "checkpoint saved in" in last, last
        assert last.endswith(f"continue with resume=auto run_dir={run}"), last
    step = load_checkpoint(list_checkpoints(run / "checkpoints")[-1])["train_state"]["step"]
    assert step < 240, "a rank finished the run alone"
    # the run lock is free: not refused as "in use"
    assert main([*ARGS, f"max_steps={step + 2}", "resume=auto", f"run_dir={run}"]) == 0
    assert load_checkpoint(list_checkpoints(run / "checkpoints")[-1])["train_state"]["step"] == step + 2
