"""Issue 44: a stop signal must turn into exit 75 inside the container runtime's default grace
(docker/podman stop wait 10 s, Kubernetes 30 s). With the torchrun entry point and 2 ranks, both
ranks had saved within ~4 s, but torchrun's agent took ~5 s more (printing its SignalException
traceback) and the container was killed: 137. launch/lib.sh now ends the wait as soon as every
local rank has written its exit code, and ends the agent.

The agent here is a stand-in for torchrun (a shell script given as TORCHRUN) so that the time
it lingers is fixed; tests/distributed/test_tini_signal.py stops real torchrun ranks."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.signals import wait_for_checkpoint

LAUNCH = Path(__file__).resolve().parents[1] / "launch"

# A torchrun whose ranks save and report 75 at once on SIGTERM, then whose agent lingers
# LINGER seconds (its traceback) before exiting 1, as torchrun does.
AGENT = """
trap 'for r in $(seq 0 $((REPORTING - 1))); do printf "75\\n" > "$LARGEBATCH_EXIT_DIR/exit-0-$r"; done
      sleep "$LINGER"; exit 1' TERM
echo "$$" > "$READY"
while :; do sleep 0.1; done
"""


def _stop(tmp_path: Path, script: str, reporting: int, linger: float) -> tuple[int, float, int]:
    agent = tmp_path / "agent.sh"
    agent.write_text(AGENT)
    ready = tmp_path / "ready"
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "TORCHRUN": f"bash {agent}", "NPROC_PER_NODE": "2",
           "READY": str(ready), "REPORTING": str(reporting), "LINGER": str(linger)}
    proc = subprocess.Popen(["bash", str(LAUNCH / script)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    deadline = time.monotonic() + 30
    while not ready.exists() or not ready.read_text().strip():
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    agent_pid = int(ready.read_text())
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)  # to the launch shell alone, as tini passes docker stop's on
    proc.communicate(timeout=60)
    return proc.returncode, time.monotonic() - t0, agent_pid


@pytest.mark.parametrize("script", ["torchrun.sh", "torchrun_multinode.sh"])
def test_exit_75_once_every_rank_has_saved_not_when_the_agent_is_done(tmp_path: Path, script: str) -> None:
    rc, elapsed, agent = _stop(tmp_path, script, reporting=2, linger=20)
    assert rc == 75 and elapsed < 5, (rc, elapsed)  # not the agent's 20 s
    time.sleep(0.2)
    with pytest.raises(ProcessLookupError):
        os.kill(agent, 0)  # the lingering agent was ended with the wait


def test_a_rank_that_has_not_reported_keeps_the_wait(tmp_path: Path) -> None:
    """One of two ranks reported: the wrapper waits for torchrun as before (its code decides)."""
    rc, elapsed, _ = _stop(tmp_path, "torchrun.sh", reporting=1, linger=2)
    assert rc == 75 and elapsed >= 2, (rc, elapsed)


# -- issue 44 item 3: one line on stderr, once, from the torchrun entry point ------------------
def _default_torchrun_env(tmp_path: Path) -> dict[str, str]:
    """The scripts' default TORCHRUN (python3 -m largebatch.launch.torchrun), this venv first."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "NPROC_PER_NODE": "2", "OMP_NUM_THREADS": "1", "LARGEBATCH_CACHE": str(tmp_path / "cache")}
    for key in ("TORCHRUN", "LB_DRY_RUN", "LARGEBATCH_EXIT_DIR", "LARGEBATCH_LINE_BY_LAUNCHER"):
        env.pop(key, None)
    return env


def test_bad_input_on_two_ranks_is_one_line(tmp_path: Path) -> None:
    """Was: the line once per rank on stderr, torchrun's per-rank errors, a 34-line
    ChildFailedError traceback and banner, then the line again."""
    proc = subprocess.run(["bash", str(LAUNCH / "torchrun.sh"), "backend=cpu", "debug=smoke", "epochs=0"],
                          cwd=tmp_path, env=_default_torchrun_env(tmp_path), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == [
        "largebatch: error: epochs=0 is out of range: it must be an integer >= 1; set epochs= to such a value"]


def test_preemption_on_two_ranks_is_one_line(tmp_path: Path) -> None:
    """Was: 'preempted' once per rank and torchrun's SignalException traceback."""
    run = tmp_path / "run"
    proc = subprocess.Popen(["bash", str(LAUNCH / "torchrun.sh"), "backend=cpu", "debug=smoke", "progress=false",
                             "tensorboard=false", "epochs=200", "checkpoint.every_steps=1", f"run_dir={run}"],
                            cwd=tmp_path, env=_default_torchrun_env(tmp_path), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        wait_for_checkpoint(run / "checkpoints", proc)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 75, err
    ours = [line for line in err.splitlines() if line.startswith("largebatch:")]
    assert len(ours) == 1 and ours[0].startswith("largebatch: preempted"), err
    assert "Traceback" not in err and "SignalException" not in err and "Killed" not in err, err


def test_a_crash_no_rank_reported_keeps_torchruns_report(tmp_path: Path) -> None:
    """Where no rank wrote a code (a crash, a kill), torchrun's own report is the only
    explanation: the shim prints the agent's records and the failure banner, as torchrun would."""
    script = tmp_path / "crash.py"
    script.write_text("import sys\nsys.exit(7)\n")
    env = {**_default_torchrun_env(tmp_path), "LARGEBATCH_EXIT_DIR": str(tmp_path / "codes")}
    proc = subprocess.run([sys.executable, "-m", "largebatch.launch.torchrun", "--standalone", "--nproc-per-node=1",
                           str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    assert "exitcode: 7" in proc.stderr and "Root Cause" in proc.stderr, proc.stderr
