"""A sweep stops on the first SIGTERM/SIGINT: the running job saves and ends with 75, the
later jobs are not started, the table lists them, and the printed command resumes the sweep."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from largebatch.engine.checkpoint import list_checkpoints, load_checkpoint
from largebatch.errors import EXIT_PREEMPTED
from largebatch.multirun import resume_command
from tests.signals import wait_for_checkpoint
from tests.smoke import smoke

SWEEP = smoke(
    "backend=cpu",
    "epochs=3",  # 4 steps per epoch: 12 steps a job
    "checkpoint.every_steps=1",
    # fp32: the subject is signals. (bf16 on an AVX-512-BF16 CPU: a later in-process job of a
    # resumed sweep sometimes stopped with non-finite weights; an open question, not this test's.)
    "precision=fp32",
)


def _start(args: list[str], cwd: Path) -> subprocess.Popen:
    # A session of its own, so the signal goes to the whole group, as a scheduler sends it.
    return subprocess.Popen([sys.executable, "-m", "largebatch.train", *args], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=dict(os.environ), start_new_session=True)


# SIGHUP: a closed terminal or a dropped ssh session (issue 43 case 2), a stop signal like SIGTERM
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=lambda s: s.name)
def test_a_signal_stops_the_sweep_after_the_running_jobs_checkpoint(tmp_path: Path, sig: signal.Signals) -> None:
    sweep = tmp_path / "sweep"
    args = ["-m", *SWEEP, f"hydra.sweep.dir={sweep}", "seed=0,1,2"]
    proc = _start(args, tmp_path)
    wait_for_checkpoint(sweep / "0" / "checkpoints", proc)
    os.killpg(proc.pid, sig)
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == EXIT_PREEMPTED, (out, err)
    assert "Traceback" not in err, err

    stopped = load_checkpoint(list_checkpoints(sweep / "0" / "checkpoints")[-1])["train_state"]["step"]
    assert 1 <= stopped < 12
    assert not (sweep / "1" / "summary.json").exists() and not (sweep / "2" / "summary.json").exists()
    assert not list((sweep / "1").glob("checkpoints/*.pt"))
    rows = {line.split()[0]: line for line in out[out.index("largebatch: 3 job(s)"):].splitlines()[2:5]}
    assert rows["0"].split()[-1].startswith("preempted") or " 75 preempted" in rows["0"], rows
    assert rows["1"].rstrip().endswith("75 not started") and rows["2"].rstrip().endswith("75 not started"), rows
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"largebatch: sweep stopped ({sig.name}); jobs not started: 1 2; continue with: ")
    command = last.split("continue with: ", 1)[1]
    assert command == resume_command(args[1:], str(sweep.resolve()))
    if sig is not signal.SIGTERM:
        # The stop left the same state as SIGTERM's (asserted above: the checkpoint, the table,
        # the command, which names no signal); resuming it is the same run, done once (SIGTERM).
        return

    # The printed command, as the user runs it: job 0 continues, jobs 1-2 start; all finish.
    resumed = subprocess.run([sys.executable, "-m", "largebatch.train", *shlex.split(command)[1:]], cwd=tmp_path,
                             capture_output=True, text=True, env=dict(os.environ), timeout=300)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    for job in ("0", "1", "2"):
        summary = json.loads((sweep / job / "summary.json").read_text())
        assert summary["steps"] == 12 and summary["epochs"] == 3
    assert "resumed from" in (sweep / "0" / "train.log").read_text()


def test_resume_command_replaces_the_sweep_dir_and_resume() -> None:
    command = resume_command(["optimizer=sgd,lars", "hydra.sweep.dir=/old", "resume=null", "epochs=2"], "/s dir")
    assert command == "largebatch-train -m optimizer=sgd,lars epochs=2 'hydra.sweep.dir=/s dir' resume=auto"


def test_the_signal_that_stopped_a_job_is_carried_by_its_error_not_searched_for_in_its_text() -> None:
    import pickle

    from largebatch.errors import Preempted
    from largebatch.multirun import stopping_signal

    carried = Preempted("SIGINT before the job's first step; nothing to save", signal_name="SIGINT")
    assert stopping_signal(carried) == "SIGINT"
    assert stopping_signal(pickle.loads(pickle.dumps(carried))) == "SIGINT"  # across a launcher's process
    # a rank stopped by another rank's signal got none; a signal's name in a path is not one
    other = Preempted("preempted (signal on another rank) at step 3; checkpoint saved in /runs/SIGTERM-sweep")
    assert stopping_signal(other) == "a signal"
