"""An installed, non-editable package finds its Hydra config tree (shipped as package data); the
environment set-up refuses a disk without room for it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

_PROBE = """
import largebatch, largebatch.conf, sys
from largebatch.config import compose_config
cfg = compose_config(["optimizer=lars", "model=resnet50"])
assert cfg.optimizer.name == "lars" and cfg.model.name == "resnet50"
print(largebatch.__file__)
print(largebatch.conf.__file__)
"""


@pytest.mark.slow
def test_wheel_install_finds_conf(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(ROOT)],
        check=True, timeout=300,
    )
    wheel = next(wheels.glob("largebatch-*.whl"))
    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)],
        check=True, timeout=300,
    )
    assert (site / "largebatch" / "conf" / "train.yaml").exists()
    assert (site / "largebatch" / "conf" / "optimizer" / "lars.yaml").exists()
    assert (site / "largebatch" / "conf" / "hydra" / "help" / "largebatch.yaml").exists()  # --help
    assert (site / "largebatch" / "conf" / "hydra" / "launcher" / "slurm.yaml").exists()
    out = subprocess.run(
        [sys.executable, "-c", _PROBE], cwd=tmp_path, env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 0, out.stderr
    pkg_file, conf_file = out.stdout.split()
    assert pkg_file.startswith(str(site)) and conf_file.startswith(str(site))
    # Every console script of setup.py runs from the install (pip --target writes them to bin/).
    for script in ("largebatch-make-synthetic", "largebatch-check-data", "largebatch-make-shards",
                   "largebatch-make-decoded"):
        done = subprocess.run(
            [str(site / "bin" / script), "--help"], cwd=tmp_path,
            env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"}, capture_output=True, text=True, timeout=120,
        )
        assert done.returncode == 0 and done.stdout.startswith(f"usage: {script}"), done.stderr[-2000:]


@pytest.mark.parametrize("what", ["main", "xla"], ids=["venv", "venv-torch-2.9"])  # an "xla" id would skip it here
def test_setup_env_refuses_a_fresh_venv_without_the_space_for_it(tmp_path: Path, what: str) -> None:
    """`make train`/`make test` on a nearly full disk: one line and exit 74 before pip starts, not
    pip's ENOSPC minutes later with a half-installed venv (NEED_GIB stands in for a full disk)."""
    venv = tmp_path / "sub" / "venv"
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "NEED_GIB": str(10**9),
           "VENV": str(venv), "VENV_XLA": str(venv)}
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "setup_env.sh"), what],
                          env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 74, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and "GiB free" in lines[0] and "free some space" in lines[0], proc.stderr
    assert not venv.exists() and not (tmp_path / "sub").exists()


def test_setup_env_leaves_the_headroom_asked_for(tmp_path: Path) -> None:
    """scripts/test.sh sets up .venv-xla beside the suite only with room left for the suite's
    files (HEADROOM_GIB on top of the venv's need)."""
    venv = tmp_path / "venv"
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "NEED_GIB": "0", "HEADROOM_GIB": str(10**9),
           "VENV_XLA": str(venv)}
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "setup_env.sh"), "xla"],
                          env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 74 and f"and {10**9} GiB left for other work" in proc.stderr, proc.stderr
    assert not venv.exists()


def _floor(requirement: str) -> str:
    import re

    setup = (ROOT / "setup.py").read_text(encoding="utf-8")
    found = re.search(rf'"{requirement}>=([0-9.]+)"', setup)
    assert found, f"setup.py has no {requirement}>= floor"
    return found.group(1)


def _pin(requirement: str) -> str:
    import re

    found = re.search(rf"^{requirement}==([0-9.]+)$", (ROOT / "constraints" / "xla.txt").read_text(encoding="utf-8"), re.M)
    assert found, f"constraints/xla.txt pins no {requirement}"
    return found.group(1)


@pytest.mark.parametrize("requirement", ["torch", "torchvision"])
def test_the_floor_is_the_oldest_version_a_test_environment_runs(requirement: str) -> None:
    """setup.py allows no torch older than .venv-xla's, where tests/xla/test_torch_floor.py checks
    that every torch name the package uses exists (the floor said 2.4 while the decode thread
    called torch.accelerator.set_device_index, new in 2.7)."""
    assert _floor(requirement) == _pin(requirement)
