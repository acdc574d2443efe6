"""What the container builds must keep without a container runtime (issue 44): the package is
built as a wheel in a throw-away stage from copies of the allow-listed folders, never through a
bind mount of the build context (podman/buildah 4.3 wrote a writable one through to the user's
checkout and ignored .dockerignore for it); the TPU image refuses, in one line and first, a base
without the shared libpython that torch_xla's _XLAC links against. ``tests/test_container.py``
builds the GPU image for real (``-m container``) and checks the checkout is unchanged."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_launch import _docker_runs, _dockerignore_excludes, _instructions

ROOT = Path(__file__).resolve().parents[1]


def _stages(name: str) -> list[tuple[str, str, list[tuple[str, str]]]]:
    """(base, stage name, instructions) per FROM of the Dockerfile."""
    stages: list[tuple[str, str, list[tuple[str, str]]]] = []
    for op, args in _instructions(ROOT / name):
        if op == "FROM":
            base, _, alias = args.partition(" AS ")
            stages.append((base.strip(), alias.strip(), []))
        elif stages:
            stages[-1][2].append((op, args))
    return stages


@pytest.mark.parametrize("name", ["Dockerfile", "Dockerfile.tpu"])
def test_the_package_is_built_as_a_wheel_in_a_throwaway_stage(name: str) -> None:
    stages = _stages(name)
    runs = [args for _, _, steps in stages for op, args in steps if op == "RUN"]
    # no bind mount of the build context at all (only of another stage, read-only)
    for args in runs:
        for mount in re.findall(r"--mount=(\S+)", args):
            assert "from=" in mount and ",rw" not in mount, f"{name}: {mount}"
    (wheel,) = [s for s in stages if s[1] == "wheel"]
    copied = [w for op, args in wheel[2] if op == "COPY" for w in args.split()[:-1] if not w.startswith("--")]
    assert {"setup.py", "pyproject.toml", "README.md", "conf/", "largebatch/"} <= set(copied)
    assert all(not _dockerignore_excludes(src.rstrip("/")) for src in copied)
    assert any("pip wheel" in args and "--wheel-dir /wheels" in args for op, args in wheel[2] if op == "RUN")
    final_base, final_alias, final = stages[-1]
    assert final_alias == "" and final_base != "wheel"  # the image does not carry the build stage
    assert any("from=wheel" in args and "pip install --no-deps /wheels/largebatch-" in args
               for op, args in final if op == "RUN")


def test_the_tpu_image_checks_libpython_before_anything_else() -> None:
    stages = _stages("Dockerfile.tpu")
    first_base, first_alias, first = stages[0]
    assert first_base == "${BASE_IMAGE}" and [s[0] for s in stages[1:]] == ["base", "deps", "base"]
    ((op, check),) = first
    probe = re.search(r'python -c "(.*?)"', check)[1]
    assert "libpython3.11.so.1.0" in probe and "exit 1" in check
    (line,) = re.findall(r'echo "(.*?)" >&2', check)
    assert line.startswith("Dockerfile.tpu: ") and "BASE_IMAGE" in line
    # the probe is real Python: it loads the library where it exists and fails where it does not
    missing = probe.replace("libpython3.11.so.1.0", "libpython-absent.so.0")
    assert subprocess.run([sys.executable, "-c", missing], capture_output=True).returncode != 0
    assert subprocess.run([sys.executable, "-c", probe.replace("libpython3.11.so.1.0", "libc.so.6")],
                          capture_output=True).returncode == 0


@pytest.mark.parametrize("source", ["docs/scaling-out.md", "Dockerfile", "Dockerfile.tpu"])
def test_every_documented_docker_run_gives_the_stop_time_to_save(source: str) -> None:
    """docker stop's default 10 s turned saved stops into 137 (issue 44): each run line sets
    --stop-timeout, and the README says what Kubernetes calls it."""
    runs = _docker_runs((ROOT / source).read_text())
    assert runs and all("--stop-timeout 60" in cmd for cmd in runs), runs
    assert "terminationGracePeriodSeconds" in (ROOT / "docs" / "scaling-out.md").read_text()
