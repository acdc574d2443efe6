"""The training CLI on XLA:CPU (one device, and 2 replicas for the noise scale): ``backend=xla`` in-process, and the XLA launcher.

Run in ``.venv-xla`` with ``PJRT_DEVICE=CPU`` (scripts/test_xla.sh); skipped without torch-xla.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.xla

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ["debug=smoke", "progress=false", "tensorboard=false", "model=resnet10t", "epochs=1"]


def test_cli_trains_the_embedded_data_with_backend_xla(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch_xla")
    from largebatch.cli import main

    monkeypatch.setenv("LARGEBATCH_CACHE", str(tmp_path / "cache"))
    run = tmp_path / "run"
    assert main([*SMOKE, "backend=xla", f"run_dir={run}"]) == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["backend"].startswith("xla") and "[CPU]" in summary["backend"]
    assert summary["steps"] == summary["steps_per_epoch"] > 0
    evals = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()]
    # debug=smoke: 4 classes x 8 val images, each counted once despite static-shape padding
    assert [e["total"] for e in evals if e["kind"] == "eval"] == [32]


def _one_xla_cpu_device_env(tmp_path: Path) -> dict[str, str]:
    """The environment of a launcher subprocess: one XLA:CPU device, its own data cache."""
    env = dict(os.environ, PJRT_DEVICE="CPU", LARGEBATCH_CACHE=str(tmp_path / "cache"), OMP_NUM_THREADS="2")
    env.pop("CPU_NUM_DEVICES", None)
    return env


def test_xla_launcher_runs_the_cli(tmp_path: Path) -> None:
    pytest.importorskip("torch_xla")
    env = _one_xla_cpu_device_env(tmp_path)
    run = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "largebatch.launch.xla", *SMOKE, "max_steps=2", f"run_dir={run}"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert json.loads((run / "summary.json").read_text())["steps"] == 2
    bad = subprocess.run(
        [sys.executable, "-m", "largebatch.launch.xla", "optimizer.lrr=1"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )
    assert bad.returncode == 2 and "did you mean 'optimizer.lr'" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1


def test_xla_launcher_on_two_replicas_measures_the_noise_scale(tmp_path: Path) -> None:
    """run.py's wiring on XLA replicas: the local and reduced gradient norms of every step
    (``tests/xla/test_noise_scale_xla.py`` checks their values), logged and summarised."""
    pytest.importorskip("torch_xla")
    env = dict(_one_xla_cpu_device_env(tmp_path), CPU_NUM_DEVICES="2", OMP_NUM_THREADS="1")
    run = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "largebatch.launch.xla", *SMOKE, "max_steps=2", "log_every=1", f"run_dir={run}"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert "gradient noise scale at the end" in proc.stderr + proc.stdout
    summary = json.loads((run / "summary.json").read_text())
    assert summary["backend"].startswith("xla rank 0/2")
    steps = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()]
    assert len([s for s in steps if "noise_scale" in s and "grad_sq_norm" in s]) == 2


_FULL_DISK_LAUNCH = """
import resource, signal, sys
from largebatch.launch.xla import main
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG)
resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))  # a resnet10t checkpoint is ~20 MB
sys.exit(main(sys.argv[1:]))
"""


def test_xla_launcher_a_replicas_failed_checkpoint_write_exits_74_with_one_line(tmp_path: Path) -> None:
    """Mapped by ``largebatch.errors.exit_code`` (before: a replica's CheckpointSaveError was a traceback)."""
    pytest.importorskip("torch_xla")
    env = _one_xla_cpu_device_env(tmp_path)
    run = tmp_path / "run"
    # The embedded set is generated before the limit applies: its files are small anyway.
    proc = subprocess.run(
        [sys.executable, "-c", _FULL_DISK_LAUNCH, *SMOKE, "max_steps=1", f"run_dir={run}"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )
    err = proc.stderr.strip()
    assert proc.returncode == 74, (proc.stdout + proc.stderr)[-3000:]
    assert err.splitlines()[-1].startswith("largebatch: error: cannot write checkpoint"), err[-3000:]
    assert "Traceback" not in err
    assert not list((run / "checkpoints").glob(".*.tmp"))
