"""launch/slurm.sbatch on a real SLURM cluster: one node on localhost (scripts/slurm_cluster.sh,
tests/fixtures/slurm/slurm.conf), CPU-only, a tiny training run per job.

A job runs to completion; a job stopped by ``scancel --signal=TERM --full``, by the time limit
warning (``--signal=B:TERM@...``) or by a ``high`` partition job preempting it saves a
checkpoint, exits 75, requeues itself (same job id, same run directory) and finishes from that
checkpoint; so does one stopped while torchrun is still starting (nothing saved yet). A plain
``scancel`` cancels the job for good. Skipped, with the reason, where SLURM is not installed
(``apt-get install slurm-wlm munge``) or its cluster cannot be started; under CI a cluster that
does not start is a failure.

The jobs run side by side: the first test of this file starts every selected test's scenario
(submit, wait, signal, wait for the end) in a thread of its own, and each test asserts on its
own scenario's job. The node declares more CPUs than the machine has (16) so that they all fit;
the preempted job runs in the ``low`` partition, the only one ``high`` jobs preempt (the others
run in ``main``, of the same tier as ``high``).
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import pytest

from tests.smoke import smoke

ROOT = Path(__file__).resolve().parents[1]
CLUSTER = ROOT / "scripts" / "slurm_cluster.sh"

pytestmark = [
    pytest.mark.slurm,
    pytest.mark.slow,
    # one pytest-xdist worker runs them all: their jobs share the session's cluster, side by side
    pytest.mark.xdist_group("slurm"),
    pytest.mark.skipif(shutil.which("sbatch") is None,
                       reason="SLURM is not installed: apt-get install slurm-wlm munge (or scripts/slurm_cluster.sh "
                              "--install start, as root)"),
]

# 8 steps per epoch, a checkpoint every step (the first one says the run can save: a stop now is
# resumed); fp32 and one loader worker: the subject is SLURM. 4 epochs (32 steps, ~12 s on a quiet
# machine) outlast a stop sent at the first checkpoint (it lands within a second), and the
# requeued run has little left to do.
ARGS = smoke("backend=cpu", "data.loader=torchvision", "data.workers=1", "data.synthetic.train_per_class=16", "checkpoint.every_steps=1",
             "precision=fp32")
STEPS = 32
EPOCHS = "epochs=4"  # STEPS steps
# The preempted job runs twice as long: SLURM decides a preemption in its scheduling pass, which
# it held back for ~15 s while the other scenarios' signalled jobs were saving (seen: the low job
# ran its 32 steps to the end, and the high job started only after it)
PREEMPTED_STEPS = 64
PREEMPTED_EPOCHS = "epochs=8"
# what a CPU-only cluster needs instead of the script's 8 GPUs and 64 CPUs per task
SBATCH_CPU = ["--nodes=1", "--gpus-per-node=0", "--cpus-per-task=1"]
# CPUs the jobs of every scenario but the preemption hold at most at once (two ranks take 2)
SIDE_CPUS = 7
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


@dataclass
class Ran:
    """A scenario's job at its end: ``scontrol show job``, its output file and run directory."""

    job: str
    info: dict[str, str]
    out: Path
    run_dir: Path
    more: dict[str, str] = field(default_factory=dict)


def _start(env: dict[str, str], tmp: Path, *args: str, sbatch: tuple[str, ...] = (),
           job_env: dict[str, str] | None = None) -> tuple[str, Path, Path]:
    """Submits the job; its id, output file and run directory."""
    job = _submit(job_env or _job_env(env, tmp / "runs"), tmp, *args, sbatch=sbatch)
    return job, tmp / f"slurm-{job}.out", tmp / "runs" / f"slurm-{job}"


def _run_to_completion(env: dict[str, str], tmp: Path) -> Ran:
    job, out, run_dir = _start(env, tmp, "epochs=2", "checkpoint.every_steps=0")
    return Ran(job, _wait_until_final(env, job, out), out, run_dir)


def _stop_by_scancel_full(env: dict[str, str], tmp: Path) -> Ran:
    job, out, run_dir = _start(env, tmp, EPOCHS)
    _wait_for_checkpoint(env, job, run_dir, out)
    subprocess.run(["scancel", "--signal=TERM", "--full", job], env=env, check=True, timeout=30)
    return Ran(job, _wait_until_final(env, job, out), out, run_dir)


def _ranks(run_dir: Path) -> list[str]:
    """The pids of the training processes of ``run_dir`` (the ranks and their loader workers, not
    torchrun's agent, whose command line names the module after its own options)."""
    found = subprocess.run(["pgrep", "-f", "--", f"-u -m largebatch[.]train run_dir={re.escape(str(run_dir))} "],
                           capture_output=True, text=True, check=False)
    return found.stdout.split()


def _seconds(clock: str) -> int:
    """scontrol's [D-]HH:MM:SS in seconds."""
    days, _, hms = clock.rpartition("-")
    hours, minutes, seconds = (int(x) for x in hms.split(":"))
    return int(days or 0) * 86400 + hours * 3600 + minutes * 60 + seconds


def _stop_by_time_limit(env: dict[str, str], tmp: Path) -> Ran:
    job, out, run_dir = _start(env, tmp, EPOCHS, sbatch=("--time=10",))  # the script's --signal=B:TERM@120
    _wait_for_checkpoint(env, job, run_dir, out)
    ranks = _ranks(run_dir)
    assert ranks, f"no training process of {run_dir} found; output:\n{_tail(out)}"
    subprocess.run(["kill", "-STOP", *ranks], check=True)
    try:
        # the limit ends 75-135 s from now: the next check (within 31 s) sends the warning (120 s
        # before the end, up to 30 s early), and the run has 44 s or more to save and requeue
        limit = math.ceil((_seconds(_job(env, job)["RunTime"]) + 75) / 60)
        subprocess.run(["scontrol", "update", f"JobId={job}", f"TimeLimit={limit}"], env=env, check=True,
                       timeout=30)
        deadline = time.time() + 90
        while "SIGTERM received: passing it on to the training" not in out.read_text():
            info = _job(env, job)
            # SIGNALING: SLURM is delivering the warning, which the script may not have printed yet
            assert info["JobState"] in {"RUNNING", "SIGNALING"}, \
                f"job {job} is {info['JobState']} before the time limit's warning:\n{_tail(out)}"
            assert time.time() < deadline, f"no warning 90 s after the cut to {limit} min; output:\n{_tail(out)}"
            time.sleep(0.2)
    finally:
        subprocess.run(["kill", "-CONT", *ranks], check=False)
    deadline = time.time() + 120
    while f"requeueing job {job}" not in out.read_text():
        info = _job(env, job)
        assert info["JobState"] in {"RUNNING", "SIGNALING", "COMPLETING"}, \
            f"job {job} is {info['JobState']} after the time limit's warning:\n{_tail(out)}"
        assert time.time() < deadline, f"no requeue after the warning; output:\n{_tail(out)}"
        time.sleep(0.2)
    # (fails where the job ended instead of coming back: the test says how it ended)
    subprocess.run(["scontrol", "update", f"JobId={job}", "TimeLimit=10"], env=env, check=False, timeout=30)
    return Ran(job, _wait_until_final(env, job, out), out, run_dir)


def _stop_by_preemption(env: dict[str, str], tmp: Path) -> Ran:
    cpus = int(subprocess.run(["sinfo", "--noheader", "--nodes=localhost", "--format=%c"], env=env, check=True,
                              capture_output=True, text=True, timeout=30).stdout.split()[0])
    # the low job and the high one each take what the other scenarios leave, more than half the
    # node: the high job fits only once the low one is gone, whatever the others hold
    take = cpus - SIDE_CPUS
    assert take > SIDE_CPUS, (f"the node has {cpus} CPUs, these tests need {2 * SIDE_CPUS + 1}: restart the "
                              f"cluster (scripts/slurm_cluster.sh stop; start) without LB_SLURM_CPUS")
    job, out, run_dir = _start(env, tmp, PREEMPTED_EPOCHS, sbatch=("--partition=low", f"--cpus-per-task={take}"))
    _wait_for_checkpoint(env, job, run_dir, out)
    high = subprocess.run(
        ["sbatch", "--parsable", "--partition=high", "--nodes=1", f"--cpus-per-task={take}",
         f"--output={tmp}/high-%j.out", "--wrap=sleep 2"], env=_job_env(env, tmp / "runs"), cwd=tmp,
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout.strip().split(";")[0]
    info = _wait_until_final(env, job, out)
    return Ran(job, info, out, run_dir, {"high": _job(env, high)["JobState"]})


def _stop_before_the_ranks_can_save(env: dict[str, str], tmp: Path) -> Ran:
    job, out, run_dir = _start(env, tmp, "epochs=2")  # 16 steps
    deadline = time.time() + 180
    # the cluster is this machine: torchrun's process (its rendezvous id is the job id) is visible
    while subprocess.run(["pgrep", "-f", f"rdzv-id={job} "], capture_output=True, check=False).returncode != 0:
        assert _job(env, job)["JobState"] in {"PENDING", "CONFIGURING", "RUNNING"}, _tail(out)
        assert time.time() < deadline, f"torchrun of job {job} never started; output:\n{_tail(out)}"
        time.sleep(0.05)
    subprocess.run(["scancel", "--signal=TERM", "--batch", job], env=env, check=True, timeout=30)
    return Ran(job, _wait_until_final(env, job, out), out, run_dir)


def _stop_two_ranks(env: dict[str, str], tmp: Path) -> Ran:
    job_env = _job_env(env, tmp / "runs")
    job_env["NPROC_PER_NODE"] = "2"
    job, out, run_dir = _start(env, tmp, EPOCHS, sbatch=("--cpus-per-task=2",), job_env=job_env)
    _wait_for_checkpoint(env, job, run_dir, out)
    subprocess.run(["scancel", "--signal=TERM", "--full", job], env=env, check=True, timeout=30)
    return Ran(job, _wait_until_final(env, job, out), out, run_dir)


def _job_processes(job: str, run_dir: Path) -> list[str]:
    """The pids of the job's batch script (in slurmd's spool), its torchrun agent and its ranks."""
    found = [subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True, check=False).stdout.split()
             for pattern in (f"/job{int(job):05d}/slurm_script", f"rdzv-id={job} ")]
    return [pid for pids in found for pid in pids] + _ranks(run_dir)


def _cancel(env: dict[str, str], tmp: Path) -> Ran:
    job, out, run_dir = _start(env, tmp, EPOCHS)
    _wait_for_checkpoint(env, job, run_dir, out)
    subprocess.run(["scancel", job], env=env, check=True, timeout=30)
    # SLURM records the job CANCELLED at once, while the script may still run: wait until the
    # script, torchrun and the ranks are gone (the cluster is this machine), after which nobody can
    # requeue the job any more
    deadline = time.time() + 120
    while _job_processes(job, run_dir):
        assert time.time() < deadline, f"job {job}'s processes outlived its cancel by 120 s:\n{_tail(out)}"
        time.sleep(0.2)
    # ... and until slurmctld has finished the job: right after its processes end it can still
    # show COMPLETING (seen on a clean clone), which is no verdict on a requeue
    return Ran(job, _wait_until_final(env, job, out), out, run_dir)


# the scenario of each test
SCENARIOS: dict[str, Callable[[dict[str, str], Path], Ran]] = {
    "test_a_cpu_job_runs_to_completion": _run_to_completion,
    "test_scancel_full_saves_requeues_and_the_job_finishes": _stop_by_scancel_full,
    "test_the_time_limit_warning_saves_requeues_and_the_job_finishes": _stop_by_time_limit,
    "test_a_high_partition_job_preempts_a_low_one_which_saves_requeues_and_finishes": _stop_by_preemption,
    "test_a_sigterm_before_the_ranks_can_save_still_requeues": _stop_before_the_ranks_can_save,
    "test_two_ranks_on_one_node_save_requeue_and_finish": _stop_two_ranks,
    "test_a_plain_scancel_cancels_the_job_without_a_requeue": _cancel,
}


@pytest.fixture(scope="module")
def scenarios(slurm_env: dict[str, str], request: pytest.FixtureRequest,
              tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Future[Ran]]]:
    """Every selected test's scenario, started at once, each in a thread and folder of its own."""
    names = [item.originalname for item in request.session.items if isinstance(item, pytest.Function)
             and item.module is request.module and item.originalname in SCENARIOS]
    with ThreadPoolExecutor(max_workers=max(1, len(names))) as pool:
        yield {name: pool.submit(SCENARIOS[name], slurm_env, tmp_path_factory.mktemp(name[len("test_"):][:40]))
               for name in dict.fromkeys(names)}


@pytest.fixture
def ran(scenarios: dict[str, Future[Ran]], request: pytest.FixtureRequest) -> Ran:
    """This test's scenario, once its job has ended."""
    return scenarios[request.node.originalname].result()


def test_a_cpu_job_runs_to_completion(ran: Ran) -> None:
    assert (ran.info["JobState"], ran.info["ExitCode"], ran.info["Restarts"]) == ("COMPLETED", "0:0", "0"), \
        _tail(ran.out)
    summary = json.loads((ran.run_dir / "summary.json").read_text())
    assert summary["steps"] == 16 and summary["stop_reason"] is None
    assert not (ran.run_dir / ".exit-codes").exists()


def test_scancel_full_saves_requeues_and_the_job_finishes(ran: Ran) -> None:
    """scancel --signal=TERM --full signals every process of the job (the batch shell, torchrun,
    the ranks, their loader workers): the run saves, exits 75 and requeues itself."""
    _assert_saved_requeued_finished(ran.info, ran.job, ran.out, ran.run_dir, STEPS)


def test_the_time_limit_warning_saves_requeues_and_the_job_finishes(ran: Ran) -> None:
    """The script's --signal=B:TERM@120 warns the batch shell before the time limit: the run
    saves, requeues, and finishes from there. slurmctld checks time limits every 30 s and sends
    the warning up to 30 s early (warn time + its 30 s period), so with a fixed limit the
    warning could come before the first checkpoint or again in every rerun. The scenario
    therefore submits a 10-minute limit, cuts it once a checkpoint exists to the whole minute
    that ends 75-135 s later (the warning then comes at the next check, within 30 s), and gives
    the requeued job 10 minutes again. Until the warning reaches the batch shell the ranks are
    stopped (SIGSTOP), so that a short run outlasts that wait however fast it trains; they
    continue (SIGCONT) once the script passes it on."""
    _assert_saved_requeued_finished(ran.info, ran.job, ran.out, ran.run_dir, STEPS)


def test_a_high_partition_job_preempts_a_low_one_which_saves_requeues_and_finishes(ran: Ran) -> None:
    """A job in the `high` partition preempts a `low` job holding the CPUs it needs
    (PreemptMode=REQUEUE): SLURM sends SIGTERM to the low job's steps at the start of its
    GraceTime; the script's relay step passes it on, the run saves and requeues itself, the
    high job runs, and the low job then finishes from its checkpoint."""
    assert ran.more["high"] == "COMPLETED"
    _assert_saved_requeued_finished(ran.info, ran.job, ran.out, ran.run_dir, PREEMPTED_STEPS)


def test_a_sigterm_before_the_ranks_can_save_still_requeues(ran: Ran) -> None:
    """SIGTERM while torchrun is still starting (what a time limit's early warning does to a
    requeued run) leaves no checkpoint and no worker code: the script exits 75 and requeues,
    rather than failing the job with torchrun's 1 or 143."""
    log = ran.out.read_text()
    assert (ran.info["JobState"], ran.info["ExitCode"], ran.info["Restarts"]) == ("COMPLETED", "0:0", "1"), \
        log[-4000:]
    # one line says why, whoever took the signal: torchrun's agent once its handler is in place
    # (largebatch.launch.torchrun: exit 75), or the script when torchrun died of it before that
    # (launch/slurm.sbatch turns its 1 or 143 into 75); which one depends on the moment
    said = ("preempted: SIGTERM before the first step; nothing to save yet" in log
            or "stopped by SIGTERM before the training could save" in log)
    assert said, log[-4000:]
    assert f"requeueing job {ran.job}" in log and "resumed from" not in log, log[-4000:]
    summary = json.loads((ran.run_dir / "summary.json").read_text())
    assert summary["steps"] == 16 and summary["stop_reason"] is None


def test_two_ranks_on_one_node_save_requeue_and_finish(ran: Ran) -> None:
    """NPROC_PER_NODE=2 (--cpus-per-task=2): torchrun starts two gloo ranks in the batch step;
    scancel --signal=TERM --full reaches both, they agree on the stop step, save, and the
    requeued job finishes on two ranks again."""
    _assert_saved_requeued_finished(ran.info, ran.job, ran.out, ran.run_dir, STEPS)
    assert ran.out.read_text().count("rank 0/2 (local 0/2)") == 2, _tail(ran.out)  # both runs had two ranks


def test_a_plain_scancel_cancels_the_job_without_a_requeue(ran: Ran) -> None:
    """scancel without --signal is the user's "stop": SLURM records the job CANCELLED at once
    (ExitCode 143:0) and it does not come back, although the ranks do get SIGTERM and save; an
    LB_RUN_DIR job can continue the run."""
    assert (ran.info["JobState"], ran.info["Restarts"]) == ("CANCELLED", "0"), _tail(ran.out)
    assert f"requeueing job {ran.job}" not in ran.out.read_text()
    assert list((ran.run_dir / "checkpoints").glob("ckpt-*.pt"))
