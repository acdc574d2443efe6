"""The line and code the torchrun agent writes for a rank a signal killed (largebatch.launch.torchrun).

A rank dies of a stop signal only while its interpreter is still starting (from its first line
of Python on, every stop is a save and exit 75): the chaos soak met it 2 times in 34 stop
signals (129, 143). That is a stop with nothing to save: 75. SIGKILL stays a failure, 137.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from largebatch.launch.torchrun import _report_killed


@pytest.mark.parametrize("name", ["SIGTERM", "SIGINT", "SIGHUP"])
def test_a_rank_a_stop_signal_killed_as_it_started_is_a_stop(tmp_path: Path, name: str) -> None:
    _report_killed(str(tmp_path), 0, 1, name)
    code, line = (tmp_path / "exit-0-1").read_text().splitlines()
    assert code == "75"
    assert line == (f"largebatch: preempted: {name} reached rank 1 as it started, before the first step; "
                     "nothing to save yet: rerun the same command (resume=auto)")


def test_a_rank_sigkill_killed_is_a_failure_that_names_it(tmp_path: Path) -> None:
    _report_killed(str(tmp_path), 2, 0, "SIGKILL")
    code, line = (tmp_path / "exit-2-0").read_text().splitlines()
    assert code == "137" and line.startswith("largebatch: error: rank 0 was killed by SIGKILL")


def test_a_rank_that_wrote_its_own_code_keeps_it(tmp_path: Path) -> None:
    (tmp_path / "exit-0-0").write_text("75\nlargebatch: preempted: ...\n")
    _report_killed(str(tmp_path), 0, 0, "SIGTERM")
    assert (tmp_path / "exit-0-0").read_text() == "75\nlargebatch: preempted: ...\n"


def _catches(pid: int, signum: int) -> bool:
    """Whether process ``pid`` has a handler for ``signum`` (its /proc status's SigCgt mask)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    mask = next((int(line.split()[1], 16) for line in status.splitlines() if line.startswith("SigCgt:")), 0)
    return bool(mask >> (signum - 1) & 1)


@pytest.mark.parametrize("delay_s", [0.0, 0.5, 1.5])
def test_a_stop_as_the_agent_starts_under_an_exit_folder_not_made_yet_is_75(tmp_path: Path, delay_s: float) -> None:
    """launch/slurm.sbatch puts the exit codes in the run directory, which a new job's ranks make
    later. The agent's early-stop handler wrote there without making it: the FileNotFoundError
    rose inside whatever the main thread was importing; a traceback and exit 1, or (CI, a SIGTERM
    0.1 s in) swallowed by an import's own except, and the job trained to the end, exit 0, no
    requeue. Now: 75 and the code written, at every moment of the start from the handler's first
    instant (its module's first lines; before them the interpreter itself is starting, and
    SIGTERM's default action ends it, as for any program). The signal goes ``delay_s`` after the
    start, but never before the agent catches SIGTERM: 0.0 is that first instant, so a loaded
    machine's slow interpreter start cannot make the case race (a fixed 0.1 s did, under load)."""
    folder = tmp_path / "run" / ".exit-codes"
    proc = subprocess.Popen(
        [sys.executable, "-m", "largebatch.launch.torchrun", "--nproc-per-node=1", "-m", "largebatch.train",
         f"run_dir={tmp_path / 'run'}", "debug=smoke"],
        env={**os.environ, "LARGEBATCH_EXIT_DIR": str(folder)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    started = time.monotonic()
    deadline = started + 60
    while not _catches(proc.pid, signal.SIGTERM) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.002)
    assert _catches(proc.pid, signal.SIGTERM), "the agent never caught SIGTERM"
    time.sleep(max(0.0, started + delay_s - time.monotonic()))
    proc.send_signal(signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 75, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    code, line = (folder / "exit-0-0").read_text().splitlines()
    assert code == "75" and "before the first step; nothing to save yet" in line
