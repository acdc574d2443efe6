"""The launch wrappers' edge values, run as typed (issue 90, item 7).

Each test runs a wrapper the way a user types it (``--dry-run`` where it would start training),
from the checkout, in a shell without an activated venv (tests/test_launch_env.py's helpers):
far more CPU ranks than cores are refused unless forced, ``CUDA_VISIBLE_DEVICES`` is counted as
CUDA counts it, the single-node wrapper says it ignores the multi-node variables, a node rank
must be below the node count, and the XLA:CPU device count is warned about and shown.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.test_launch_env import (
    LAUNCH,
    NO_GPU,
    ROOT,
    SLURM_JOB,
    SYSTEM_PATH,
    VENV_PYTHON,
    _fake_scontrol,
    _launch,
    _no_gpu_env,
    _one_line,
    _user_env,
    needs_venv,
)

CORES = len(os.sched_getaffinity(0))  # what nproc counts: the cores this process may use
MANY = "999999"  # the largest count the wrappers take


def _refused_ranks(script: str, value: str = MANY) -> str:
    return (f"{script}: NPROC_PER_NODE={value} would start {value} CPU ranks on {CORES} cores, more than 8 per "
            f"core: set it to {CORES} or fewer, or set LB_OVERSUBSCRIBE=1 to start them anyway")


def _warned_ranks(script: str, value: str) -> str:
    return (f"{script}: warning: NPROC_PER_NODE={value} starts {value} CPU ranks on {CORES} cores: each gets a "
            f"sliver of a core and a stop takes minutes; {CORES} or fewer suit this node")


# -- (a) CPU ranks far above the cores ---------------------------------------------------------
@NO_GPU
@pytest.mark.parametrize("script", ["torchrun.sh", "torchrun_multinode.sh"])
def test_more_than_8_cpu_ranks_per_core_are_refused_in_one_line(script: str) -> None:
    """``NPROC_PER_NODE=999999 launch/torchrun.sh`` started after a warning (99 ranks on 2 cores
    once brought the OOM killer onto another job); now exit 2 naming the cores and the override."""
    proc = _launch([f"launch/{script}", "--dry-run", "backend=cpu"], _no_gpu_env(NPROC_PER_NODE=MANY))
    assert _one_line(proc) == _refused_ranks(script)


@NO_GPU
def test_slurm_job_refuses_more_than_8_cpu_ranks_per_core(tmp_path: Path) -> None:
    env = _no_gpu_env(PATH=f"{_fake_scontrol(tmp_path)}:{SYSTEM_PATH}", SLURM_SUBMIT_DIR=str(ROOT),
                      NPROC_PER_NODE=MANY, **SLURM_JOB)
    assert _one_line(_launch(["bash", str(LAUNCH / "slurm.sbatch")], env, cwd=tmp_path)) == _refused_ranks("slurm.sbatch")


@needs_venv
@NO_GPU
def test_lb_oversubscribe_starts_them_after_the_warning() -> None:
    proc = _launch(["launch/torchrun.sh", "--dry-run", "backend=cpu"],
                   _no_gpu_env(NPROC_PER_NODE=MANY, LB_OVERSUBSCRIBE="1"))
    assert proc.returncode == 0, proc.stderr
    assert f"--nproc-per-node={MANY} " in proc.stdout
    assert proc.stderr.splitlines() == [_warned_ranks("torchrun.sh", MANY)]


def test_lb_oversubscribe_other_than_0_or_1_is_refused_in_one_line() -> None:
    proc = _launch(["launch/torchrun.sh", "--dry-run"], _no_gpu_env(NPROC_PER_NODE=MANY, LB_OVERSUBSCRIBE="yes"))
    assert _one_line(proc) == "torchrun.sh: LB_OVERSUBSCRIBE=yes is not 0 or 1: set it to 1 (on) or 0 (off)"


@needs_venv
@NO_GPU
@pytest.mark.skipif(CORES < 2, reason="one core: OMP_NUM_THREADS=1 changes nothing")
def test_omp_num_threads_does_not_shrink_the_cores_counted() -> None:
    """nproc reports OMP_NUM_THREADS when set (a usual setting for CPU ranks): 8 ranks per core with
    OMP_NUM_THREADS=1 were counted against 1 core."""
    value = str(8 * CORES)
    proc = _launch(["launch/torchrun.sh", "--dry-run", "backend=cpu"],
                   _no_gpu_env(NPROC_PER_NODE=value, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines() == [_warned_ranks("torchrun.sh", value)]


# -- (b) CUDA_VISIBLE_DEVICES as CUDA reads it ---------------------------------------------------
VISIBLE = [("-1", 0), ("", 0), ("0,-1,1", 1), ("0,1", 2), ("0,,1", 1), (",0", 0), ("none", 0),
           ("GPU-5e1f6a2c,MIG-8d0c2b7e", 2), ("0,GPU-5e1f6a2c,x,1", 2)]


@pytest.mark.parametrize("devices, count", VISIBLE, ids=[repr(d) for d, _ in VISIBLE])
def test_gpu_count_stops_at_the_first_entry_that_is_not_a_device(devices: str, count: int) -> None:
    proc = subprocess.run(["bash", "-c", "source launch/lib.sh && gpu_count"], cwd=ROOT, capture_output=True,
                          text=True, env=_user_env(CUDA_VISIBLE_DEVICES=devices), timeout=30)
    assert (proc.returncode, proc.stdout) == (0, f"{count}\n"), proc.stderr


def test_nproc_gpu_with_cuda_visible_devices_minus_1_is_refused_in_one_line() -> None:
    """``CUDA_VISIBLE_DEVICES=-1 NPROC_PER_NODE=gpu`` counted one GPU, then torchrun ended in 25
    lines of ``ValueError: Cuda is not available``."""
    proc = _launch(["launch/torchrun.sh", "--dry-run", "backend=cpu"],
                   _user_env(CUDA_VISIBLE_DEVICES="-1", NPROC_PER_NODE="gpu"))
    assert _one_line(proc) == ("torchrun.sh: NPROC_PER_NODE=gpu finds no GPU on this node: "
                               "set it to a number of processes, or to cpu or auto")


def test_cuda_visible_devices_minus_1_makes_cpu_ranks_count_against_the_cores() -> None:
    """With -1 counted as a GPU, 999999 ranks started without even the warning."""
    proc = _launch(["launch/torchrun.sh", "--dry-run", "backend=cpu"],
                   _user_env(CUDA_VISIBLE_DEVICES="-1", NPROC_PER_NODE=MANY))
    assert _one_line(proc) == _refused_ranks("torchrun.sh")


@needs_venv
@pytest.mark.parametrize("devices, nproc", [("0,-1,1", 1), ("-1,-1", 1), ("0,1", 2)])
def test_the_default_rank_count_is_the_visible_gpus(devices: str, nproc: int) -> None:
    proc = _launch(["launch/torchrun.sh", "--dry-run", "backend=cpu"], _user_env(CUDA_VISIBLE_DEVICES=devices))
    assert proc.returncode == 0, proc.stderr
    assert f"--nproc-per-node={nproc} " in proc.stdout


# -- (c) torchrun.sh is one node ------------------------------------------------------------------
@needs_venv
def test_torchrun_sh_says_it_ignores_the_multinode_variables() -> None:
    """``NNODES=2 RDZV_ENDPOINT=node0:29500 launch/torchrun.sh`` started one standalone node without a word."""
    proc = _launch(["launch/torchrun.sh", "--dry-run", "backend=cpu"],
                   _user_env(NPROC_PER_NODE="1", NNODES="2", NODE_RANK="1", RDZV_ENDPOINT="node0:29500"))
    assert proc.returncode == 0, proc.stderr
    assert " --standalone " in proc.stdout
    assert proc.stderr.splitlines() == [
        "torchrun.sh: warning: NNODES=2 NODE_RANK=1 RDZV_ENDPOINT=node0:29500 ignored: this script starts one node "
        "(torchrun --standalone); for several nodes run launch/torchrun_multinode.sh"]


# -- (d) a node rank below the node count ---------------------------------------------------------
@pytest.mark.parametrize("nnodes, rank", [("2", "2"), ("4", "9"), ("1", "1")])
def test_a_node_rank_not_below_nnodes_is_refused_in_one_line(nnodes: str, rank: str) -> None:
    proc = _launch(["launch/torchrun_multinode.sh", "--dry-run", "backend=cpu"],
                   _user_env(NPROC_PER_NODE="1", NNODES=nnodes, NODE_RANK=rank, RDZV_ENDPOINT="node0:29500"))
    assert _one_line(proc) == (f"torchrun_multinode.sh: NODE_RANK={rank} is not below NNODES={nnodes}: set it to "
                               f"0-{int(nnodes) - 1} (or unset it: c10d numbers the nodes)")


@needs_venv
@pytest.mark.parametrize("nnodes, rank", [("2", "1"), ("2:4", "3")])
def test_a_node_rank_below_nnodes_or_an_elastic_nnodes_is_taken(nnodes: str, rank: str) -> None:
    proc = _launch(["launch/torchrun_multinode.sh", "--dry-run", "backend=cpu"],
                   _user_env(NPROC_PER_NODE="1", NNODES=nnodes, NODE_RANK=rank, RDZV_ENDPOINT="node0:29500"))
    assert proc.returncode == 0 and not proc.stderr, proc.stderr
    assert f"--nnodes={nnodes} " in proc.stdout and f"--node-rank={rank} " in proc.stdout


# -- (e) XLA:CPU devices ----------------------------------------------------------------------------
@needs_venv
@pytest.mark.parametrize("count", ["2", MANY])
def test_tpu_vm_shows_cpu_num_devices_and_warns_far_above_the_cores(tmp_path: Path, count: str) -> None:
    """``PJRT_DEVICE=CPU CPU_NUM_DEVICES=999999 launch/tpu_vm.sh --dry-run`` printed a line without
    the device count and no warning. torch_xla here is an empty package (.venv has none)."""
    (tmp_path / "torch_xla").mkdir()
    (tmp_path / "torch_xla" / "__init__.py").write_text("")
    env = _user_env(PYTHON=str(VENV_PYTHON), PYTHONPATH=str(tmp_path), PJRT_DEVICE="CPU", CPU_NUM_DEVICES=count)
    proc = _launch(["launch/tpu_vm.sh", "--dry-run", "debug=smoke"], env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"env PJRT_DEVICE=CPU CPU_NUM_DEVICES={count} {VENV_PYTHON} -m largebatch.launch.xla debug=smoke\n"
    warnings = [] if int(count) <= 8 * CORES else [
        f"tpu_vm.sh: warning: CPU_NUM_DEVICES={count} starts {count} XLA:CPU devices on {CORES} cores: each gets a "
        f"sliver of a core, and XLA:CPU aborts a collective that not all of them reach within 10 s; {CORES} or "
        f"fewer suit this node"]
    assert proc.stderr.splitlines() == warnings
