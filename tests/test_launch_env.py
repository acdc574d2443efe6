"""The launch wrappers find the project's Python as a user runs them: no venv activated.

Each test runs a wrapper as a subprocess the way the README prints it, from the checkout,
with a PATH that holds no ``.venv/bin`` and without VIRTUAL_ENV or PYTHON (unless the test is
about one of them). A wrapper uses ``PYTHON=``, else the active virtualenv, else the checkout's
own ``.venv`` (``.venv-xla`` for the XLA ones), else python3 on PATH (a container's), whichever
has the modules it needs; else it stops with one line on stderr and exit 2, no traceback.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAUNCH = ROOT / "launch"
VENV_PYTHON = ROOT / ".venv" / "bin" / "python"
SYSTEM_PATH = "/usr/bin:/bin"  # no .venv/bin, no pyenv shims
SYSTEM_PYTHON = shutil.which("python3", path=SYSTEM_PATH)


def _has_torch(python: str | None) -> bool:
    if python is None:
        return False
    probe = "import importlib.util as u, sys; sys.exit(u.find_spec('torch') is None)"
    return subprocess.run([python, "-c", probe], capture_output=True, timeout=30).returncode == 0


needs_venv = pytest.mark.skipif(not VENV_PYTHON.is_file(), reason="no .venv in this checkout (make env)")
needs_bare_python = pytest.mark.skipif(
    SYSTEM_PYTHON is None or _has_torch(SYSTEM_PYTHON),
    reason="needs a python3 without torch on /usr/bin:/bin",
)


def _user_env(**extra: str) -> dict[str, str]:
    """A user's shell that never activated a venv: system PATH, no VIRTUAL_ENV, no PYTHON."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("VIRTUAL_ENV", "PYTHON", "PYTHONPATH", "TORCHRUN", "LB_DRY_RUN", "CONDA_PREFIX")}
    env["PATH"] = SYSTEM_PATH
    env.update(extra)
    return env


def _launch(cmd: list[str], env: dict[str, str], cwd: Path = ROOT, timeout: int = 60) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def _one_line(proc: subprocess.CompletedProcess) -> str:
    """The wrapper stopped with exit 2 and exactly one line on stderr, no traceback; that line."""
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    return lines[0]


def _function(text: str, name: str) -> str:
    """A bash function's definition, with the comment block above it."""
    match = re.search(rf"(?ms)^(?:#[^\n]*\n)*{name}\(\) \{{.*?^\}}\n", text)
    assert match, f"no {name}() in the script"
    return match.group(0)


# -- torchrun.sh: the user's command, for real ------------------------------------------------
@needs_venv
def test_torchrun_runs_from_the_checkout_without_an_activated_venv() -> None:
    """``launch/torchrun.sh --cfg job`` from the checkout: torchrun, one rank, its config printed."""
    proc = _launch(["launch/torchrun.sh", "--cfg", "job", "backend=cpu", "global_batch_size=512"],
                   _user_env(NPROC_PER_NODE="1", OMP_NUM_THREADS="1"), timeout=180)
    assert proc.returncode == 0, proc.stderr
    assert "ModuleNotFoundError" not in proc.stderr
    assert re.search(r"(?m)^global_batch_size: 512$", proc.stdout), proc.stdout


@needs_venv
@pytest.mark.parametrize("script", ["torchrun.sh", "torchrun_multinode.sh"])
def test_torchrun_scripts_pick_the_checkouts_venv(script: str) -> None:
    proc = _launch([f"launch/{script}", "--dry-run", "optimizer=lars"], _user_env(NPROC_PER_NODE="1"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"{VENV_PYTHON} -m largebatch.launch.torchrun "), proc.stdout


@needs_venv
def test_an_active_virtualenv_comes_before_the_checkouts_venv(tmp_path: Path) -> None:
    """VIRTUAL_ENV wins: here another venv with largebatch (its packages are links to .venv's)."""
    active = tmp_path / "env"
    (active / "bin").mkdir(parents=True)
    shutil.copy(VENV_PYTHON.parents[1] / "pyvenv.cfg", active / "pyvenv.cfg")
    (active / "lib").symlink_to(VENV_PYTHON.parents[1] / "lib")
    (active / "bin" / "python").symlink_to(VENV_PYTHON)
    proc = _launch(["launch/torchrun.sh", "--dry-run"], _user_env(VIRTUAL_ENV=str(active), NPROC_PER_NODE="1"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"{active}/bin/python -m largebatch.launch.torchrun "), proc.stdout


@needs_venv
@needs_bare_python
def test_an_active_virtualenv_without_largebatch_is_passed_over(tmp_path: Path) -> None:
    active = tmp_path / "other-project-env"
    (active / "bin").mkdir(parents=True)
    (active / "bin" / "python").symlink_to(SYSTEM_PYTHON)
    proc = _launch(["launch/torchrun.sh", "--dry-run"], _user_env(VIRTUAL_ENV=str(active), NPROC_PER_NODE="1"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"{VENV_PYTHON} -m "), proc.stdout


@needs_bare_python
@pytest.mark.parametrize("script", ["torchrun.sh", "torchrun_multinode.sh"])
def test_a_python_without_torch_is_refused_in_one_line(script: str) -> None:
    proc = _launch([f"launch/{script}", "backend=cpu"], _user_env(PYTHON=SYSTEM_PYTHON, NPROC_PER_NODE="1"))
    line = _one_line(proc)
    assert line.startswith(f"{script}: PYTHON={SYSTEM_PYTHON} has no torch"), line
    assert "set PYTHON to an interpreter with largebatch" in line


@needs_bare_python
def test_no_environment_at_all_says_what_to_run(tmp_path: Path) -> None:
    """A copy of launch/ with no .venv beside it and only a bare python3 on PATH."""
    shutil.copytree(LAUNCH, tmp_path / "launch")
    proc = _launch(["launch/torchrun.sh", "backend=cpu"], _user_env(NPROC_PER_NODE="1"), cwd=tmp_path)
    line = _one_line(proc)
    assert line.startswith("torchrun.sh: no Python environment with torch, hydra, largebatch found"), line
    assert f"{tmp_path}/.venv" in line and "make env" in line and "PYTHON=/path/to/python" in line


@needs_venv
def test_a_containers_python3_on_path_is_used(tmp_path: Path) -> None:
    """The image's layout: launch/ under /opt/largebatch (no .venv beside it), its venv's bin on PATH."""
    shutil.copytree(LAUNCH, tmp_path / "launch")
    env = _user_env(PATH=f"{VENV_PYTHON.parent}:{SYSTEM_PATH}", NPROC_PER_NODE="1")
    proc = _launch([str(tmp_path / "launch" / "torchrun.sh"), "--dry-run"], env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"{VENV_PYTHON.parent}/python3 -m largebatch.launch.torchrun "), proc.stdout


# -- SLURM --------------------------------------------------------------------------------------
def test_slurm_script_carries_the_same_python_finder() -> None:
    """slurm.sbatch runs from SLURM's spool folder, away from lib.sh: its copy must not drift."""
    lib, sbatch = (LAUNCH / "lib.sh").read_text(), (LAUNCH / "slurm.sbatch").read_text()
    for name in ("find_python", "torchrun_command", "check_env", "gpu_count"):
        assert _function(sbatch, name) == _function(lib, name), f"{name} differs between lib.sh and slurm.sbatch"


def _fake_scontrol(tmp_path: Path) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text("#!/bin/sh\necho node-1\n")
    (bin_dir / "scontrol").chmod(0o755)
    return bin_dir


SLURM_JOB = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "node-1", "SLURM_NNODES": "1", "LB_DRY_RUN": "1"}


@needs_venv
def test_slurm_job_uses_the_submit_folders_venv(tmp_path: Path) -> None:
    env = _user_env(PATH=f"{_fake_scontrol(tmp_path)}:{SYSTEM_PATH}", SLURM_SUBMIT_DIR=str(ROOT), **SLURM_JOB)
    proc = _launch(["bash", str(LAUNCH / "slurm.sbatch")], env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"{VENV_PYTHON} -m largebatch.launch.torchrun --nnodes=1 "), proc.stdout


@needs_bare_python
def test_slurm_job_without_an_environment_stops_in_one_line(tmp_path: Path) -> None:
    env = _user_env(PATH=f"{_fake_scontrol(tmp_path)}:{SYSTEM_PATH}", SLURM_SUBMIT_DIR=str(tmp_path), **SLURM_JOB)
    line = _one_line(_launch(["bash", str(LAUNCH / "slurm.sbatch")], env, cwd=tmp_path))
    assert line.startswith("slurm.sbatch: no Python environment with torch, hydra, largebatch found"), line
    assert f"{tmp_path}/.venv" in line


# -- XLA ----------------------------------------------------------------------------------------
@needs_venv
def test_tpu_vm_refuses_an_environment_without_torch_xla() -> None:
    """.venv has no torch_xla: the XLA wrapper names it rather than fail in every replica."""
    line = _one_line(_launch(["launch/tpu_vm.sh", "optimizer=lars"], _user_env(PYTHON=str(VENV_PYTHON))))
    assert line.startswith(f"tpu_vm.sh: PYTHON={VENV_PYTHON} has no torch_xla"), line


@needs_bare_python
def test_tpu_vm_without_an_environment_says_to_set_up_venv_xla(tmp_path: Path) -> None:
    shutil.copytree(LAUNCH, tmp_path / "launch")
    line = _one_line(_launch(["launch/tpu_vm.sh", "optimizer=lars"], _user_env(), cwd=tmp_path))
    assert line.startswith("tpu_vm.sh: no Python environment with torch, torch_xla, hydra, largebatch found"), line
    assert f"{tmp_path}/.venv-xla" in line and "scripts/setup_env.sh xla" in line


@pytest.mark.parametrize("python", [pytest.param(SYSTEM_PYTHON, marks=needs_bare_python, id="system"),
                                    pytest.param(str(VENV_PYTHON), marks=needs_venv, id="venv-without-xla")])
def test_xla_spawn_without_torch_xla_stops_in_one_line(python: str) -> None:
    line = _one_line(_launch([python, "launch/xla_spawn.py", "optimizer=lars"], _user_env()))
    assert line.startswith(f"xla_spawn.py: {python} has no ") and "torch_xla" in line, line
    assert ".venv-xla/bin/python" in line


def test_tpu_pod_host_without_the_checkout_stops_in_one_line(tmp_path: Path) -> None:
    """The command gcloud runs on each host, run by a shell in a home folder without the checkout."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "gcloud").write_text(  # ssh --command=...: run it here, in the "host's" home
        "#!/bin/bash\nfor a; do [[ $a == --command=* ]] && cmd=${a#--command=}; done\n"
        'cd "$HOME" && exec bash -c "$cmd"\n'
    )
    (bin_dir / "gcloud").chmod(0o755)
    home = tmp_path / "home"
    home.mkdir()
    env = _user_env(PATH=f"{bin_dir}:{SYSTEM_PATH}", HOME=str(home), TPU_NAME="v4-32", ZONE="z", RUN_DIR="runs/r")
    proc = _launch(["launch/tpu_pod.sh", "optimizer=lars"], env)
    assert proc.returncode == 2, proc.stderr
    *_, last = proc.stderr.splitlines()
    assert len(proc.stderr.splitlines()) == 2  # run_dir=... (from the workstation), then the host's line
    assert re.fullmatch(r"tpu_pod.sh: \S+ has no largebatch/\.venv-xla/bin/python: run once with LB_TPU_SETUP=1 "
                        r"\(or set REMOTE_DIR, REMOTE_PYTHON\)", last), last


# -- the variables the wrappers read (issue 75) -----------------------------------------------
NO_GPU = pytest.mark.skipif(shutil.which("nvidia-smi", path=SYSTEM_PATH) is not None, reason="a node with GPUs")
PROCESSES = "is not a number of processes: set it to 1 or more, or to gpu, cpu or auto"
RESTARTS = "is not a number of restarts: set it to 0 (none) or more"


def _no_gpu_env(**extra: str) -> dict[str, str]:
    env = _user_env(**extra)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return env


BAD_VARIABLES = [
    ("torchrun.sh", {"NPROC_PER_NODE": "abc"}, f"NPROC_PER_NODE=abc {PROCESSES}"),
    ("torchrun.sh", {"NPROC_PER_NODE": "-1"}, f"NPROC_PER_NODE=-1 {PROCESSES}"),
    ("torchrun.sh", {"NPROC_PER_NODE": "0"}, f"NPROC_PER_NODE=0 {PROCESSES}"),  # was 1 rank, silently
    ("torchrun.sh", {"NPROC_PER_NODE": "1", "MAX_RESTARTS": "-1"}, f"MAX_RESTARTS=-1 {RESTARTS}"),
    ("torchrun.sh", {"NPROC_PER_NODE": "1", "MAX_RESTARTS": "abc"}, f"MAX_RESTARTS=abc {RESTARTS}"),
    ("torchrun_multinode.sh", {"NNODES": "abc", "RDZV_ENDPOINT": "node0:29500"},
     "NNODES=abc is not a number of nodes: set it to N (1 or more), or to MIN:MAX for an elastic job (e.g. 2:4)"),
    ("torchrun_multinode.sh", {"NNODES": "4:2", "RDZV_ENDPOINT": "node0:29500"},
     "NNODES=4:2 has MIN above MAX: set it to MIN:MAX with MIN <= MAX (e.g. 2:4)"),
    ("torchrun_multinode.sh", {"NPROC_PER_NODE": "1", "NODE_RANK": "x"},
     "NODE_RANK=x is not a node rank: set it to 0 or more (or unset it: c10d numbers the nodes)"),
    ("torchrun_multinode.sh", {"NNODES": "2", "RDZV_ENDPOINT": "node0:abc"},
     ("RDZV_ENDPOINT=node0:abc is not host:port: set it to a host every node can reach and a port 1-65535 "
      "(e.g. node0:29500)")),
]


@pytest.mark.parametrize("script, env, line", BAD_VARIABLES, ids=[f"{s}-{line.split()[0]}" for s, _, line in BAD_VARIABLES])
def test_a_variable_a_wrapper_cannot_take_is_refused_in_one_line(script: str, env: dict[str, str], line: str) -> None:
    """As typed: ``NPROC_PER_NODE=abc launch/torchrun.sh ...`` ended in a torchrun traceback (or its
    usage text naming --max-restarts, or 1 rank for 0); now one line naming the variable, exit 2."""
    proc = _launch([f"launch/{script}", "--cfg", "job", "backend=cpu"], _user_env(OMP_NUM_THREADS="1", **env),
                   timeout=180)
    assert _one_line(proc) == f"{script}: {line}"


@NO_GPU
def test_nproc_gpu_on_a_node_without_one_is_refused_in_one_line() -> None:
    proc = _launch(["launch/torchrun.sh", "--cfg", "job", "backend=cpu"], _no_gpu_env(NPROC_PER_NODE="gpu"),
                   timeout=180)
    assert _one_line(proc) == ("torchrun.sh: NPROC_PER_NODE=gpu finds no GPU on this node: "
                               "set it to a number of processes, or to cpu or auto")


@needs_venv
@NO_GPU
def test_far_more_cpu_ranks_than_cores_start_after_a_warning() -> None:
    """NPROC_PER_NODE=99 on 2 cores was taken without a word (and its stop took 209 s)."""
    cores = len(os.sched_getaffinity(0))  # what nproc counts: the cores this process may use
    many = str(4 * cores + 1)
    proc = _launch(["launch/torchrun.sh", "--dry-run", "backend=cpu"], _no_gpu_env(NPROC_PER_NODE=many))
    assert proc.returncode == 0, proc.stderr
    assert f"--nproc-per-node={many} " in proc.stdout
    (line,) = proc.stderr.splitlines()
    assert line.startswith(f"torchrun.sh: warning: NPROC_PER_NODE={many} starts {many} CPU ranks on "), line


@needs_venv
def test_nproc_words_torchrun_takes_pass_through() -> None:
    for word in ("cpu", "auto"):
        proc = _launch(["launch/torchrun.sh", "--dry-run"], _user_env(NPROC_PER_NODE=word))
        assert proc.returncode == 0 and not proc.stderr, proc.stderr
        assert f"--nproc-per-node={word} " in proc.stdout


def test_slurm_job_refuses_a_bad_rdzv_port_in_one_line(tmp_path: Path) -> None:
    env = _user_env(PATH=f"{_fake_scontrol(tmp_path)}:{SYSTEM_PATH}", SLURM_SUBMIT_DIR=str(ROOT), RDZV_PORT="x",
                    **SLURM_JOB)
    line = _one_line(_launch(["bash", str(LAUNCH / "slurm.sbatch")], env, cwd=tmp_path))
    assert line == "slurm.sbatch: RDZV_PORT=x is not a port: set it to 1-65535"


def test_slurm_job_refuses_a_bad_lb_srun_in_one_line(tmp_path: Path) -> None:
    """Named slurm.sbatch (not SLURM's spool path in $0), with the other variables, before the interpreter."""
    env = _user_env(PATH=f"{_fake_scontrol(tmp_path)}:{SYSTEM_PATH}", SLURM_SUBMIT_DIR=str(ROOT), LB_SRUN="yes",
                    **SLURM_JOB)
    line = _one_line(_launch(["bash", str(LAUNCH / "slurm.sbatch")], env, cwd=tmp_path))
    assert line == ("slurm.sbatch: LB_SRUN=yes is not auto, 0 or 1: "
                    "set it to auto, 1 (always srun) or 0 (never: one node only)")


XLA_RUNTIME = "is not a PJRT runtime: set it to TPU, CPU, CUDA or NEURON (upper case)"
XLA_CPU_DEVICES = "is not a number of XLA:CPU devices: set it to 1 or more"
BAD_XLA_VARIABLES = [
    ({"PJRT_DEVICE": "FOO"}, f"PJRT_DEVICE=FOO {XLA_RUNTIME}"),  # was KeyError: 'FOO' in every replica
    ({"PJRT_DEVICE": "tpu"}, f"PJRT_DEVICE=tpu {XLA_RUNTIME}"),
    ({"PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "abc"}, f"CPU_NUM_DEVICES=abc {XLA_CPU_DEVICES}"),  # was a
    ({"PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "0"}, f"CPU_NUM_DEVICES=0 {XLA_CPU_DEVICES}"),  # BrokenProcessPool
]
XLA_IDS = [line.split()[0] for _, line in BAD_XLA_VARIABLES]


@pytest.mark.parametrize("env, line", BAD_XLA_VARIABLES, ids=XLA_IDS)
def test_tpu_vm_refuses_a_bad_xla_variable_in_one_line(env: dict[str, str], line: str) -> None:
    """As typed: refused by the wrapper before any interpreter is looked for or started."""
    proc = _launch(["bash", "launch/tpu_vm.sh", "debug=smoke"], _user_env(**env))
    assert _one_line(proc) == f"tpu_vm.sh: {line}"


@needs_venv
@pytest.mark.parametrize("env, line", BAD_XLA_VARIABLES, ids=XLA_IDS)
def test_xla_launcher_refuses_a_bad_xla_variable_in_one_line(tmp_path: Path, env: dict[str, str], line: str) -> None:
    """``python launch/xla_spawn.py`` has no wrapper in front: the launcher says the same. Here torch_xla
    is an empty package: the launcher stops before it imports it."""
    (tmp_path / "torch_xla").mkdir()
    (tmp_path / "torch_xla" / "__init__.py").write_text("")
    proc = _launch([str(VENV_PYTHON), "launch/xla_spawn.py", "debug=smoke"], _user_env(PYTHONPATH=str(tmp_path), **env),
                   timeout=120)
    assert _one_line(proc) == f"largebatch: error: {line}"


def _fake_gcloud(tmp_path: Path) -> Path:
    """A gcloud that only notes that it ran (a refused command must not reach it)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "gcloud").write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path}/gcloud-ran\n")
    (bin_dir / "gcloud").chmod(0o755)
    return bin_dir


POD = {"TPU_NAME": "v4-32", "ZONE": "z"}
BAD_POD_VARIABLES = [
    ({"ZONE": "z"}, "TPU_NAME is not set: set it to the TPU VM's name (gcloud compute tpus tpu-vm list)"),  # was exit 1
    ({"TPU_NAME": "v4-32"}, "ZONE is not set: set it to the TPU VM's zone (e.g. us-central2-b)"),  # was exit 1
    ({**POD, "LB_DRY_RUN": "yes"}, "LB_DRY_RUN=yes is not 0 or 1: set it to 1 (on) or 0 (off)"),  # ran for real
    ({**POD, "LB_TPU_SETUP": "yes"}, "LB_TPU_SETUP=yes is not 0 or 1: set it to 1 (on) or 0 (off)"),  # no setup
]


@pytest.mark.parametrize("env, line", BAD_POD_VARIABLES, ids=[line.split()[0] for _, line in BAD_POD_VARIABLES])
def test_tpu_pod_refuses_a_bad_variable_before_gcloud(tmp_path: Path, env: dict[str, str], line: str) -> None:
    bin_dir = _fake_gcloud(tmp_path)
    proc = _launch(["bash", "launch/tpu_pod.sh", "debug=smoke"], _user_env(PATH=f"{bin_dir}:{SYSTEM_PATH}", **env))
    assert _one_line(proc) == f"tpu_pod.sh: {line}"
    assert not (tmp_path / "gcloud-ran").exists()
