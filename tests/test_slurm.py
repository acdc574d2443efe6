"""launch/slurm.sbatch on a real SLURM cluster: one node on localhost (scripts/slurm_cluster.sh,
tests/fixtures/slurm/slurm.conf), CPU-only, a tiny training run per job.

A job runs to completion; a job stopped by ``scancel --signal=TERM --full`` saves a
checkpoint, exits 75, requeues itself (same job id, same run directory) and finishes from that
checkpoint. Skipped, with the reason, where SLURM is not installed (``apt-get install
slurm-wlm munge``) or its cluster cannot be started; under CI a cluster that does not start is a
failure.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

ROOT = Path(__file__).resolve().parents[1]
CLUSTER = ROOT / "scripts" / "slurm_cluster.sh"

pytestmark = [
    pytest.mark.slurm,
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("sbatch") is None,
                       reason="SLURM is not installed: apt-get install slurm-wlm munge (or scripts/slurm_cluster.sh "
                              "--install start, as root)"),
]

# 8 steps per epoch, a checkpoint every step; fp32 and one loader worker: the subject is SLURM
ARGS = [
    "backend=cpu", "debug=smoke", "progress=false", "tensorboard=false", "data.workers=1",
    "global_batch_size=8", "data.synthetic.train_per_class=16", "data.synthetic.val_per_class=2",
    "data.image_size=16", "checkpoint.every_steps=1", "precision=fp32",
]
# what a CPU-only cluster needs instead of the script's 8 GPUs and 64 CPUs per task
SBATCH_CPU = ["--nodes=1", "--gpus-per-node=0", "--cpus-per-task=1"]
FINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL",
         "DEADLINE"}


@pytest.fixture(scope="session")
def slurm_env() -> Iterator[dict[str, str]]:
    """The environment of sbatch/scancel/scontrol for the test cluster, started if it is not up."""
    env = dict(os.environ)
    env["SLURM_CONF"] = subprocess.run([str(CLUSTER), "conf"], capture_output=True, text=True,
                                       check=True).stdout.strip()
    was_up = subprocess.run([str(CLUSTER), "status"], env=env, capture_output=True).returncode == 0
    if not was_up:
        proc = subprocess.run([str(CLUSTER), "start"], env=env, capture_output=True, text=True, timeout=180)
        if proc.returncode != 0:
            message = f"the one-node SLURM cluster did not start: {proc.stderr.strip()[-1000:]}"
            if os.environ.get("CI"):
                pytest.fail(message)
            pytest.skip(message)
    yield env
    if not was_up:
        subprocess.run([str(CLUSTER), "stop"], env=env, timeout=120)


def _job_env(slurm_env: dict[str, str], run_root: Path) -> dict[str, str]:
    """What sbatch exports to the job: this Python's torchrun, this checkout, the run root."""
    env = {k: v for k, v in slurm_env.items() if not k.startswith(("LB_", "LARGEBATCH_"))}
    env.update({
        "PATH": f"{Path(sys.executable).parent}:{env.get('PATH', '/usr/bin:/bin')}",
        "PYTHONPATH": str(ROOT),
        "OMP_NUM_THREADS": "1",
        "LB_RUN_ROOT": str(run_root),
    })
    return env


def _submit(env: dict[str, str], out_dir: Path, *args: str) -> str:
    proc = subprocess.run(
        ["sbatch", "--parsable", *SBATCH_CPU, f"--output={out_dir}/slurm-%j.out", str(ROOT / "launch" / "slurm.sbatch"),
         *ARGS, *args],
        env=env, cwd=out_dir, capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().split(";")[0]


def _job(env: dict[str, str], job: str) -> dict[str, str]:
    """``scontrol show job`` as a dict (JobState, ExitCode, Restarts, ...)."""
    out = subprocess.run(["scontrol", "--oneliner", "show", "job", job], env=env, capture_output=True, text=True,
                         check=True, timeout=30).stdout
    return dict(re.findall(r"(\w+)=(\S*)", out))


def _wait_until_final(env: dict[str, str], job: str, out: Path, timeout_s: float = 400) -> dict[str, str]:
    deadline = time.time() + timeout_s
    while (info := _job(env, job))["JobState"] not in FINAL:
        assert time.time() < deadline, f"job {job} still {info['JobState']}; output:\n{_tail(out)}"
        time.sleep(1)
    return info


def _tail(path: Path) -> str:
    return path.read_text()[-4000:] if path.exists() else f"({path} missing)"


def test_a_cpu_job_runs_to_completion(slurm_env: dict[str, str], tmp_path: Path) -> None:
    job = _submit(_job_env(slurm_env, tmp_path / "runs"), tmp_path, "epochs=2")
    out = tmp_path / f"slurm-{job}.out"
    info = _wait_until_final(slurm_env, job, out)
    assert (info["JobState"], info["ExitCode"], info["Restarts"]) == ("COMPLETED", "0:0", "0"), _tail(out)
    run_dir = tmp_path / "runs" / f"slurm-{job}"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 16 and summary["stop_reason"] is None
    assert not (run_dir / ".exit-codes").exists()


def test_scancel_full_saves_requeues_and_the_job_finishes(slurm_env: dict[str, str], tmp_path: Path) -> None:
    """scancel --signal=TERM --full signals every process of the job (the batch shell, torchrun,
    the ranks, their loader workers): the run saves, exits 75 and requeues itself."""
    job = _submit(_job_env(slurm_env, tmp_path / "runs"), tmp_path, "epochs=12")  # 96 steps
    out = tmp_path / f"slurm-{job}.out"
    run_dir = tmp_path / "runs" / f"slurm-{job}"
    deadline = time.time() + 240
    while not list((run_dir / "checkpoints").glob("ckpt-*.pt")):
        assert _job(slurm_env, job)["JobState"] in {"PENDING", "CONFIGURING", "RUNNING"}, _tail(out)
        assert time.time() < deadline, f"no checkpoint in {run_dir}; output:\n{_tail(out)}"
        time.sleep(0.2)
    subprocess.run(["scancel", "--signal=TERM", "--full", job], env=slurm_env, check=True, timeout=30)

    info = _wait_until_final(slurm_env, job, out)
    log = out.read_text()
    assert (info["JobState"], info["ExitCode"], info["Restarts"]) == ("COMPLETED", "0:0", "1"), log[-4000:]
    saved = re.search(r"preempted \(SIGTERM\) at step (\d+); checkpoint saved", log)
    resumed = re.search(r"resumed from \S+ckpt-\S+\.pt \(epoch \d+, step (\d+)\)", log)
    assert saved and resumed, log[-4000:]
    assert saved.group(1) == resumed.group(1) and int(saved.group(1)) < 96
    assert f"requeueing job {job}" in log
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 96 and summary["stop_reason"] is None
    assert not (run_dir / ".exit-codes").exists()
