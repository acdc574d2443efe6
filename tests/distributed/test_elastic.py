"""Elastic restarts and multi-rank preemption under real torchrun (gloo, CPU).

* A rank SIGKILLed mid-run: ``torchrun --max-restarts=2`` restarts the worker group, which
  finds the same run directory (named after torchrun's run id: no ``run_dir=`` given) and
  resumes by itself (no ``resume=`` given) from the last checkpoint, reaching the expected
  final step; the checkpoint it leaves (written at world size 2) then resumes at world
  size 1.
* SIGTERM to one rank only: both ranks stop after the same step, one checkpoint is saved,
  and the workers exit with EXIT_PREEMPTED.

Faults are injected by ``faults/sitecustomize.py`` (on PYTHONPATH, read only by these
tests): ``LARGEBATCH_TEST_FAULT=RANK:STEP:SIGNAL``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


from largebatch.cli import main
from largebatch.engine.checkpoint import list_checkpoints, load_checkpoint
from tests.distributed.harness import run_to_end
from tests.smoke import smoke

ROOT = Path(__file__).resolve().parents[2]
FAULTS = Path(__file__).resolve().parent / "faults"
TIMEOUT_S = 240  # a healthy run takes ~30 s on 2 idle cores

# 4 classes x 8 images, global batch 8 (4 per rank at world size 2): 4 steps per epoch.
JOB = smoke("backend=cpu", "checkpoint.every_steps=2", "checkpoint.keep=0")


def _torchrun(root: Path, fault: str, *extra: str, max_restarts: int) -> tuple[int, str]:
    """Run the job under torchrun; return its exit code and its output (stdout + stderr)."""
    env = dict(os.environ, LARGEBATCH_TEST_FAULT=fault, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(FAULTS), str(ROOT), env.get("PYTHONPATH")] if p)
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
        f"--max-restarts={max_restarts}", "--monitor-interval=0.2",
        "-m", "largebatch.train", *JOB, f"output_root={root / 'runs'}", *extra,
    ]
    log = root / "torchrun.log"
    code = run_to_end(cmd, env=env, cwd=ROOT, log=log, timeout_s=TIMEOUT_S)
    text = log.read_text()
    assert code is not None, f"torchrun timed out:\n{text[-4000:]}"
    return code, text


def _steps(run_dir: Path) -> list[int]:
    return [load_checkpoint(p)["train_state"]["step"] for p in list_checkpoints(run_dir / "checkpoints")]


def _only_run_dir(root: Path) -> Path:
    runs = list((root / "runs").iterdir())
    assert len(runs) == 1, runs  # one directory for all restarts
    return runs[0]


def test_killed_rank_restarts_from_checkpoint_then_resumes_at_world_size_1(tmp_path: Path) -> None:
    # rank 1 dies (SIGKILL) after step 3; the last checkpoint is step 2; the job stops at 6.
    code, out = _torchrun(tmp_path, "1:3:SIGKILL", "max_steps=6", max_restarts=2)
    assert code == 0, out[-4000:]
    assert "failed (exitcode: -9) local_rank: 1" in out  # the fault happened
    assert "resumed from" in out and "s000000002.pt" in out  # the restarted group resumed
    run = _only_run_dir(tmp_path)
    ckpt = load_checkpoint(list_checkpoints(run / "checkpoints")[-1])
    assert ckpt["train_state"]["step"] == 6 and ckpt["world_size"] == 2
    assert json.loads((run / "summary.json").read_text())["steps"] == 6

    # The same run continues on one process: per-device batch 4 -> 8, global batch 8 kept.
    assert main([*JOB, f"run_dir={run}", "resume=auto", "max_steps=null"]) == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 8 and summary["epochs"] == 2 and summary["world_size"] == 1
    assert summary["per_device_batch_size"] == 8


def test_sigterm_on_one_rank_stops_both_at_the_same_step(tmp_path: Path) -> None:
    code, out = _torchrun(tmp_path, "0:3:SIGTERM", max_restarts=0)
    # Both workers exit with EXIT_PREEMPTED (75); torchrun reports the failed group.
    assert code != 0
    assert out.count("largebatch: preempted:") == 2, out[-4000:]
    assert "exitcode: 75" in out, out[-4000:]
    assert _steps(_only_run_dir(tmp_path))[-1] == 3  # saved after the step the signal came in, by agreement
