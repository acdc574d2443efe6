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
import time
from pathlib import Path

import pytest

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
