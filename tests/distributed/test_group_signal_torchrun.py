"""A scheduler's signal to the whole launch (``launch/torchrun.sh``, 2 gloo ranks): every rank
stops after the same step, the checkpoint is saved, and the script exits 75.

The group holds the launch shell and torchrun's agent (torchrun starts each worker in a
session of its own and passes the signal on, with ``--shutdown-timeout`` to save). Before the
shell trapped the signal it died at once with 143 and the workers' 75 was lost.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from largebatch.engine.checkpoint import list_checkpoints, load_checkpoint
from tests.signals import wait_for_checkpoint
from tests.smoke import smoke

LAUNCH = Path(__file__).resolve().parents[2] / "launch"

ARGS = smoke(
    "backend=cpu", "data.loader=torchvision", "data.workers=2", "data.synthetic.train_per_class=16",
    "epochs=3",  # 8 steps per epoch: 24 steps
    "checkpoint.every_steps=1", "precision=fp32",  # fp32: the subject is signals
)


def _default_signals() -> None:
    """The launch as a terminal starts it: a suite run in the background (``cmd &``) passes SIGINT
    ignored to its children, and one under ``nohup`` SIGHUP; bash can neither trap nor reset a
    signal that was ignored when it started, so the launch would not see the signal this test sends."""
    for sig in (signal.SIGINT, signal.SIGQUIT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


# SIGHUP (issue 43 case 2: a closed terminal, a dropped ssh session) killed the ranks with
# torchrun's SignalException traceback and exit 1; it is a stop signal like SIGTERM now
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=lambda s: s.name)
def test_a_group_signal_to_a_torchrun_launch_saves_one_step_and_exits_75(tmp_path: Path, sig: signal.Signals) -> None:
    run = tmp_path / "run"
    env = {**os.environ, "TORCHRUN": str(Path(sys.executable).with_name("torchrun")), "NPROC_PER_NODE": "2",
           "OMP_NUM_THREADS": "1"}
    env.pop("LB_DRY_RUN", None)
    proc = subprocess.Popen(["bash", str(LAUNCH / "torchrun.sh"), *ARGS, f"run_dir={run}"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=_default_signals)
    wait_for_checkpoint(run / "checkpoints", proc)
    os.killpg(proc.pid, sig)  # the launch's whole group, as SLURM or kill -- -PGID does
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 75, (out[-3000:], err[-3000:])
    # both ranks got the signal (from torchrun's agent) and logged it once
    assert (out + err).count(f"{sig.name} received: finishing the current step") == 2, (out + err)[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    last = load_checkpoint(list_checkpoints(run / "checkpoints")[-1])["train_state"]["step"]
    assert summary["stop_reason"].startswith(f"preempted ({sig.name})") and summary["steps"] == last < 24
    assert "Traceback" not in out  # the workers' output; torchrun's agent prints its own on stderr
    assert err.strip().splitlines()[-1].startswith("largebatch: preempted:"), err[-3000:]  # the last line is ours
