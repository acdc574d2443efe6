"""Another project installs largebatch from a clone, as docs/reusable-parts.md ("Install into your
project") says: a wheel built from the clone, installed into that project's own virtual
environment, runs a plain script with LARS and grouped SyncBN, and ``largebatch-train`` finds its
config tree; every ``pip install`` line of the docs and messages names that route and extras the
wheel declares (issue 68: they said ``pip install 'largebatch[slurm]'``, and no index has it).

The new environment gets its third-party dependencies (torch is gigabytes) from this
environment's site-packages through a path file, never largebatch itself: the wheel is installed
with ``--no-deps --no-index``, and the script checks that ``largebatch`` is the wheel's copy.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import venv
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

from tests.docs_text import ROOT, doc_files

# What the wheel is built from (as the Dockerfile's wheel stage copies it): a copy, so the build's
# build/ and *.egg-info land in tmp_path and not in the checkout other runs read.
BUILD_INPUTS = ("setup.py", "pyproject.toml", "README.md", "largebatch", "conf")

# A plain program of another project: two gloo ranks, BN over both (group_size=2), LARS with the
# BN/bias split, two steps each; the parent checks that the ranks' BN statistics agree (the
# group's batch, not each rank's) and that the weights moved.
PROGRAM = '''
import os, sys, tempfile
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn

import largebatch, largebatch.conf
from largebatch.nn import GroupSyncBatchNorm, convert_group_sync_batchnorm
from largebatch.optim import LARS, param_groups


def train(rank, world, init, out):
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                          nn.Flatten(), nn.Linear(8, 4))
    before = model[0].weight.detach().clone()
    model = convert_group_sync_batchnorm(model, group_size=2)
    assert isinstance(model[1], GroupSyncBatchNorm), type(model[1])
    optimizer = LARS(param_groups(model, weight_decay=5e-5), lr=0.1, momentum=0.9)
    torch.manual_seed(1 + rank)  # each rank its own images
    for _ in range(2):
        images, labels = torch.randn(4, 3, 16, 16) + rank, torch.randint(0, 4, (4,))
        F.cross_entropy(model(images), labels).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    assert not torch.equal(before, model[0].weight), "LARS did not move the weights"
    torch.save(model[1].running_mean, os.path.join(out, f"mean{rank}.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    out = tempfile.mkdtemp(dir=".")
    init = "file://" + os.path.abspath(os.path.join(out, "init"))
    mp.start_processes(train, args=(2, init, out), nprocs=2, start_method="fork")  # no second torch import
    means = [torch.load(os.path.join(out, f"mean{r}.pt")) for r in range(2)]
    assert torch.allclose(means[0], means[1]), means  # one group's statistics on both ranks
    print(largebatch.__file__)
    print(largebatch.conf.__file__)
'''


def _site_packages(prefix: Path) -> Path:
    return Path(sysconfig.get_path("purelib", vars={"base": str(prefix), "platbase": str(prefix)}))


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``pip wheel --no-deps -w dist <clone>``, the documented first step."""
    clone, dist = tmp_path_factory.mktemp("clone"), tmp_path_factory.mktemp("dist")
    for name in BUILD_INPUTS:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, clone / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(src, clone / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(dist),
                    str(clone)], check=True, timeout=300)
    (built,) = dist.glob("largebatch-*.whl")
    return built


def test_another_projects_venv_runs_the_installed_wheel(wheel: Path, tmp_path: Path) -> None:
    env_dir, work = tmp_path / "other-venv", tmp_path / "other-project"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-index", "--no-deps",
                    f"{wheel}[report,slurm]"], check=True, timeout=300)
    # The dependencies only: this environment's site-packages as a plain path. Its .pth files (the
    # editable install's finder among them) are not run from there, so the checkout cannot leak in.
    site = _site_packages(env_dir)
    (site / "zz_dependencies.pth").write_text(f"{_site_packages(Path(sys.prefix))}\n", encoding="utf-8")
    work.mkdir()
    (work / "program.py").write_text(textwrap.dedent(PROGRAM), encoding="utf-8")
    env = {"PATH": f"{env_dir / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path), "OMP_NUM_THREADS": "1"}

    ran = subprocess.run([str(python), "program.py"], cwd=work, env=env, capture_output=True, text=True, timeout=180)
    assert ran.returncode == 0, ran.stderr[-3000:]
    package, conf = ran.stdout.split()
    assert package.startswith(str(site)) and conf.startswith(str(site)), ran.stdout  # the wheel's, not the checkout's

    train = env_dir / "bin" / "largebatch-train"  # the wheel's console script: its conf/ shipped
    job = subprocess.run([str(train), "--cfg", "job", "optimizer=lars", "model=resnet50"], cwd=work, env=env,
                         capture_output=True, text=True, timeout=180)
    assert job.returncode == 0, job.stderr[-3000:]
    assert re.search(r"^optimizer:\n  name: lars$", job.stdout, re.M) and "name: resnet50" in job.stdout, job.stdout


# `pip install` lines that name extras: `largebatch[x]`, `/path/to/largebatch[x]`, `.[x]`, `dist/largebatch-*.whl[x]`
_EXTRAS_LINE = re.compile(r"pip install [^`\n]*?(largebatch[^\s`'\"\[]*|\.)\[([a-z,]+)\]")


def _pip_lines() -> list[tuple[str, str]]:
    """(file, line) for every line of the docs, the README and the package's messages that tells
    the reader to ``pip install`` largebatch with extras."""
    files = [*doc_files(), *sorted((ROOT / "largebatch").rglob("*.py")), *sorted((ROOT / "benchmarks").glob("*.py"))]
    return [(f.relative_to(ROOT).as_posix(), line) for f in files
            for line in f.read_text(encoding="utf-8").splitlines() if _EXTRAS_LINE.search(line)]


def test_every_pip_install_line_says_the_route_from_a_clone() -> None:
    """No line tells a user to install ``largebatch[...]`` from a package index: none has it."""
    lines = _pip_lines()
    assert len(lines) >= 5, lines
    from_index = [f"{f}: {line.strip()}" for f, line in lines
                  if re.search(r"pip install ['\"]?largebatch\[", line)]
    assert not from_index, "\n".join(from_index)


def test_the_extras_the_docs_name_are_the_wheels(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as whl:
        (meta,) = [n for n in whl.namelist() if n.endswith(".dist-info/METADATA")]
        metadata = Parser().parsestr(whl.read(meta).decode("utf-8"))
        assert "largebatch/conf/train.yaml" in whl.namelist()
    declared = set(metadata.get_all("Provides-Extra") or [])
    named = {extra for _, line in _pip_lines() for m in _EXTRAS_LINE.finditer(line) for extra in m.group(2).split(",")}
    assert {"report", "slurm", "dali"} <= named and named <= declared, (named, declared)
    requires = metadata.get_all("Requires-Dist") or []
    assert any(r.startswith("hydra-submitit-launcher") and 'extra == "slurm"' in r for r in requires), requires
    assert any(r.startswith("matplotlib") and 'extra == "report"' in r for r in requires), requires
