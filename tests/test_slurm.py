"""launch/slurm.sbatch on a real SLURM cluster: one node on localhost (scripts/slurm_cluster.sh,
tests/fixtures/slurm/slurm.conf), CPU-only, a tiny training run per job.

A job runs to completion; a job stopped by ``scancel --signal=TERM --full``, by the time limit
warning (``--signal=B:TERM@...``) or by a ``high`` partition job preempting it saves a
checkpoint, exits 75, requeues itself (same job id, same run directory) and finishes from that
checkpoint; so does one stopped while torchrun is still starting (nothing saved yet). A plain
``scancel`` cancels the job for good. Skipped, with the reason, where SLURM is not installed
(``apt-get install slurm-wlm munge``) or its cluster cannot be started; under CI a cluster that
does not start is a failure.
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

from tests.smoke import smoke

ROOT = Path(__file__).resolve().parents[1]
CLUSTER = ROOT / "scripts" / "slurm_cluster.sh"

pytestmark = [
    pytest.mark.slurm,
    pytest.mark.slow,
    # one pytest-xdist worker runs them all, in order: they share the session's cluster
    pytest.mark.xdist_group("slurm"),
    pytest.mark.skipif(shutil.which("sbatch") is None,
                       reason="SLURM is not installed: apt-get install slurm-wlm munge (or scripts/slurm_cluster.sh "
                              "--install start, as root)"),
]

# 8 steps per epoch, a checkpoint every step (the first one says the run can save: a stop now is
# resumed); fp32 and one loader worker: the subject is SLURM. 3 epochs (24 steps) outlast a stop
# sent at the first checkpoint many times over, and the requeued run has little left to do.
ARGS = smoke("backend=cpu", "data.workers=1", "data.synthetic.train_per_class=16", "checkpoint.every_steps=1",
             "precision=fp32")
STEPS = 24  # epochs=3
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


def _submit(env: dict[str, str], out_dir: Path, *args: str, sbatch: tuple[str, ...] = ()) -> str:
    """sbatch launch/slurm.sbatch ARGS args, with SBATCH_CPU then ``sbatch`` options (the later one wins)."""
    proc = subprocess.run(
        ["sbatch", "--parsable", *SBATCH_CPU, *sbatch, f"--output={out_dir}/slurm-%j.out",
         str(ROOT / "launch" / "slurm.sbatch"), *ARGS, *args],
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
        time.sleep(0.5)
    return info


def _tail(path: Path) -> str:
    return path.read_text()[-4000:] if path.exists() else f"({path} missing)"


def _wait_for_checkpoint(env: dict[str, str], job: str, run_dir: Path, out: Path, timeout_s: float = 240) -> None:
    """Until the running job has saved its first checkpoint (so a stop now has something to resume)."""
    deadline = time.time() + timeout_s
    while not list((run_dir / "checkpoints").glob("ckpt-*.pt")):
        assert _job(env, job)["JobState"] in {"PENDING", "CONFIGURING", "RUNNING"}, _tail(out)
        assert time.time() < deadline, f"no checkpoint in {run_dir}; output:\n{_tail(out)}"
        time.sleep(0.2)


def _assert_saved_requeued_finished(info: dict[str, str], job: str, out: Path, run_dir: Path, steps: int,
                                    restarts: int | None = 1) -> None:
    """The job completed after ``restarts`` requeues (any number >= 1 if None), each stop saved a
    checkpoint that the next run resumed from, and the run did all ``steps``."""
    log = out.read_text()
    assert (info["JobState"], info["ExitCode"]) == ("COMPLETED", "0:0"), log[-4000:]
    if restarts is None:
        assert int(info["Restarts"]) >= 1, log[-4000:]
    else:
        assert info["Restarts"] == str(restarts), log[-4000:]
    # every rank says where it stopped; steps only grow from one run to the next
    saved = list(dict.fromkeys(re.findall(r"preempted \(SIGTERM\) at step (\d+); checkpoint saved", log)))
    resumed = re.findall(r"resumed from \S+ckpt-\S+\.pt \(epoch \d+, step (\d+)\)", log)
    assert saved and saved == resumed, log[-4000:]
    assert all(int(step) < steps for step in saved)
    assert log.count(f"requeueing job {job}") == int(info["Restarts"]), log[-4000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == steps and summary["stop_reason"] is None
    assert not (run_dir / ".exit-codes").exists()


def test_a_cpu_job_runs_to_completion(slurm_env: dict[str, str], tmp_path: Path) -> None:
    job = _submit(_job_env(slurm_env, tmp_path / "runs"), tmp_path, "epochs=2", "checkpoint.every_steps=0")
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
    job = _submit(_job_env(slurm_env, tmp_path / "runs"), tmp_path, "epochs=3")
    out = tmp_path / f"slurm-{job}.out"
    run_dir = tmp_path / "runs" / f"slurm-{job}"
    _wait_for_checkpoint(slurm_env, job, run_dir, out)
    subprocess.run(["scancel", "--signal=TERM", "--full", job], env=slurm_env, check=True, timeout=30)
    _assert_saved_requeued_finished(_wait_until_final(slurm_env, job, out), job, out, run_dir, STEPS)


def _ranks(run_dir: Path) -> list[str]:
    """The pids of the training processes of ``run_dir`` (the ranks and their loader workers, not
    torchrun's agent, whose command line names the module after its own options)."""
    found = subprocess.run(["pgrep", "-f", "--", f"-u -m largebatch[.]train run_dir={re.escape(str(run_dir))} "],
                           capture_output=True, text=True)
    return found.stdout.split()


def test_the_time_limit_warning_saves_requeues_and_the_job_finishes(slurm_env: dict[str, str],
                                                                    tmp_path: Path) -> None:
    """The script's --signal=B:TERM@<s> warns the batch shell before the time limit: the run
    saves, requeues, and finishes from there. slurmctld checks time limits every 30 s and sends
    the warning up to 30 s early (warn time + its 30 s period), so with a fixed limit the
    warning could come before the first checkpoint or again in every rerun. The test therefore
    submits a 10-minute limit, cuts it to 1 minute once a checkpoint exists (the warning then
    comes at the next check, within 30 s), and gives the requeued job 10 minutes again. Until the
    warning reaches the batch shell the ranks are stopped (SIGSTOP), so that a short run outlasts
    that wait however fast it trains; they continue (SIGCONT) once the script passes it on."""
    job = _submit(_job_env(slurm_env, tmp_path / "runs"), tmp_path, "epochs=3",
                  sbatch=("--time=10", "--signal=B:TERM@30"))
    out = tmp_path / f"slurm-{job}.out"
    run_dir = tmp_path / "runs" / f"slurm-{job}"
    _wait_for_checkpoint(slurm_env, job, run_dir, out)
    ranks = _ranks(run_dir)
    assert ranks, f"no training process of {run_dir} found; output:\n{_tail(out)}"
    subprocess.run(["kill", "-STOP", *ranks], check=True)
    try:
        subprocess.run(["scontrol", "update", f"JobId={job}", "TimeLimit=1"], env=slurm_env, check=True,
                       timeout=30)
        deadline = time.time() + 90
        while "SIGTERM received: passing it on to the training" not in out.read_text():
            info = _job(slurm_env, job)
            assert info["JobState"] == "RUNNING", \
                f"job {job} is {info['JobState']} before the time limit's warning:\n{_tail(out)}"
            assert time.time() < deadline, f"no warning 90 s after the cut to 1 minute; output:\n{_tail(out)}"
            time.sleep(0.2)
    finally:
        subprocess.run(["kill", "-CONT", *ranks])
    deadline = time.time() + 120
    while f"requeueing job {job}" not in out.read_text():
        info = _job(slurm_env, job)
        assert info["JobState"] in {"RUNNING", "COMPLETING"}, \
            f"job {job} is {info['JobState']} after the time limit's warning:\n{_tail(out)}"
        assert time.time() < deadline, f"no requeue after the warning; output:\n{_tail(out)}"
        time.sleep(0.2)
    subprocess.run(["scontrol", "update", f"JobId={job}", "TimeLimit=10"], env=slurm_env, check=True, timeout=30)
    info = _wait_until_final(slurm_env, job, out)
    _assert_saved_requeued_finished(info, job, out, run_dir, STEPS)


def test_a_high_partition_job_preempts_a_low_one_which_saves_requeues_and_finishes(
        slurm_env: dict[str, str], tmp_path: Path) -> None:
    """A job in the `high` partition preempts a `low` job holding every CPU of the node
    (PreemptMode=REQUEUE): SLURM sends SIGTERM to the low job's steps at the start of its
    GraceTime; the script's relay step passes it on, the run saves and requeues itself, the
    high job runs, and the low job then finishes from its checkpoint."""
    cpus = subprocess.run(["sinfo", "--noheader", "--nodes=localhost", "--format=%c"], env=slurm_env, check=True,
                          capture_output=True, text=True, timeout=30).stdout.split()[0]
    env = _job_env(slurm_env, tmp_path / "runs")
    job = _submit(env, tmp_path, "epochs=3", sbatch=(f"--cpus-per-task={cpus}",))
    out = tmp_path / f"slurm-{job}.out"
    run_dir = tmp_path / "runs" / f"slurm-{job}"
    _wait_for_checkpoint(slurm_env, job, run_dir, out)
    high = subprocess.run(
        ["sbatch", "--parsable", "--partition=high", "--nodes=1", "--cpus-per-task=1",
         f"--output={tmp_path}/high-%j.out", "--wrap=sleep 2"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60, check=True,
    ).stdout.strip().split(";")[0]
    info = _wait_until_final(slurm_env, job, out)
    assert _job(slurm_env, high)["JobState"] == "COMPLETED"
    _assert_saved_requeued_finished(info, job, out, run_dir, STEPS)


def test_a_sigterm_before_the_ranks_can_save_still_requeues(slurm_env: dict[str, str], tmp_path: Path) -> None:
    """SIGTERM while torchrun is still starting (what a time limit's early warning does to a
    requeued run) leaves no checkpoint and no worker code: the script exits 75 and requeues,
    rather than failing the job with torchrun's 1 or 143."""
    job = _submit(_job_env(slurm_env, tmp_path / "runs"), tmp_path, "epochs=2")  # 16 steps
    out = tmp_path / f"slurm-{job}.out"
    deadline = time.time() + 120
    # the cluster is this machine: torchrun's process (its rendezvous id is the job id) is visible
    while subprocess.run(["pgrep", "-f", f"rdzv-id={job} "], capture_output=True).returncode != 0:
        assert _job(slurm_env, job)["JobState"] in {"PENDING", "CONFIGURING", "RUNNING"}, _tail(out)
        assert time.time() < deadline, f"torchrun of job {job} never started; output:\n{_tail(out)}"
        time.sleep(0.05)
    subprocess.run(["scancel", "--signal=TERM", "--batch", job], env=slurm_env, check=True, timeout=30)
    info = _wait_until_final(slurm_env, job, out)
    log = out.read_text()
    assert (info["JobState"], info["ExitCode"], info["Restarts"]) == ("COMPLETED", "0:0", "1"), log[-4000:]
    # one line says why, whoever took the signal: torchrun's agent once its handler is in place
    # (largebatch.launch.torchrun: exit 75), or the script when torchrun died of it before that
    # (launch/slurm.sbatch turns its 1 or 143 into 75); which one depends on the moment
    said = ("preempted: SIGTERM before the first step; nothing to save yet" in log
            or "stopped by SIGTERM before the training could save" in log)
    assert said, log[-4000:]
    assert f"requeueing job {job}" in log and "resumed from" not in log, log[-4000:]
    summary = json.loads((tmp_path / "runs" / f"slurm-{job}" / "summary.json").read_text())
    assert summary["steps"] == 16 and summary["stop_reason"] is None


def test_two_ranks_on_one_node_save_requeue_and_finish(slurm_env: dict[str, str], tmp_path: Path) -> None:
    """NPROC_PER_NODE=2 (--cpus-per-task=2): torchrun starts two gloo ranks in the batch step;
    scancel --signal=TERM --full reaches both, they agree on the stop step, save, and the
    requeued job finishes on two ranks again."""
    env = _job_env(slurm_env, tmp_path / "runs")
    env["NPROC_PER_NODE"] = "2"
    job = _submit(env, tmp_path, "epochs=3", sbatch=("--cpus-per-task=2",))  # steps of 2 x 4 images
    out = tmp_path / f"slurm-{job}.out"
    run_dir = tmp_path / "runs" / f"slurm-{job}"
    _wait_for_checkpoint(slurm_env, job, run_dir, out)
    subprocess.run(["scancel", "--signal=TERM", "--full", job], env=slurm_env, check=True, timeout=30)
    info = _wait_until_final(slurm_env, job, out)
    _assert_saved_requeued_finished(info, job, out, run_dir, STEPS)
    assert out.read_text().count("rank 0/2 (local 0/2)") == 2, _tail(out)  # both runs had two ranks


def _job_processes(job: str, run_dir: Path) -> list[str]:
    """The pids of the job's batch script (in slurmd's spool), its torchrun agent and its ranks."""
    found = [subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True, check=False).stdout.split()
             for pattern in (f"/job{int(job):05d}/slurm_script", f"rdzv-id={job} ")]
    return [pid for pids in found for pid in pids] + _ranks(run_dir)


def test_a_plain_scancel_cancels_the_job_without_a_requeue(slurm_env: dict[str, str], tmp_path: Path) -> None:
    """scancel without --signal is the user's "stop": SLURM records the job CANCELLED at once
    (ExitCode 143:0) and it does not come back, although the ranks do get SIGTERM and save; an
    LB_RUN_DIR job can continue the run."""
    job = _submit(_job_env(slurm_env, tmp_path / "runs"), tmp_path, "epochs=3")
    out = tmp_path / f"slurm-{job}.out"
    run_dir = tmp_path / "runs" / f"slurm-{job}"
    _wait_for_checkpoint(slurm_env, job, run_dir, out)
    subprocess.run(["scancel", job], env=slurm_env, check=True, timeout=30)
    # SLURM records the job CANCELLED at once, while the script may still run: wait until the
    # script, torchrun and the ranks are gone (the cluster is this machine), after which nobody can
    # requeue the job any more
    deadline = time.time() + 120
    while _job_processes(job, run_dir):
        assert time.time() < deadline, f"job {job}'s processes outlived its cancel by 120 s:\n{_tail(out)}"
        time.sleep(0.2)
    info = _job(slurm_env, job)
    assert (info["JobState"], info["Restarts"]) == ("CANCELLED", "0"), _tail(out)
    assert f"requeueing job {job}" not in out.read_text()
    assert list((run_dir / "checkpoints").glob("ckpt-*.pt"))
