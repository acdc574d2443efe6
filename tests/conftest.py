"""Shared pytest set-up: skip accelerator-only tests where the accelerator is absent.

Each environment runs its own part of ``python -m pytest tests`` and skips the rest with the
reason: ``.venv`` (torch 2.14.1) everything but ``tests/xla``; ``.venv-xla`` (torch-xla pins
torch 2.9.0, no DALI) only ``tests/xla``, because there this pytest process is an XLA:CPU
device (``tests/xla/conftest.py``) and ``backend=auto`` rightly picks XLA for every run.

The ``cache`` fixture gives a test its own data cache; the override lists the training tests
start from are in ``tests/smoke.py``.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

# the whole suite's time budget (tests/time_budget.py): scripts/test.sh turns it on
pytest_plugins = ["tests.time_budget"]


@pytest.fixture()
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``tmp_path``, with ``LARGEBATCH_CACHE`` pointing into it: the embedded set is made per test."""
    monkeypatch.setenv("LARGEBATCH_CACHE", str(tmp_path / "cache"))
    return tmp_path


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    has_cuda = torch.cuda.is_available()
    has_xla = importlib.util.find_spec("torch_xla") is not None
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    skip_xla = pytest.mark.skip(reason="needs torch-xla (run in .venv-xla with PJRT_DEVICE=CPU)")
    skip_main = pytest.mark.skip(reason="runs in the main environment (.venv); this torch-xla environment runs tests/xla")
    xla_dir = Path(__file__).resolve().parent / "xla"
    for item in items:
        if has_xla and xla_dir not in Path(str(item.fspath)).resolve().parents:
            item.add_marker(skip_main)
        if "gpu" in item.keywords and not has_cuda:
            item.add_marker(skip_gpu)
        if "xla" in item.keywords and not has_xla:
            item.add_marker(skip_xla)
    # files with a slow test first, each file's tests in their order (module fixtures stay shared):
    # pytest-xdist hands tests out in this order, so the long ones do not end the run on one worker
    slow_files = {item.path for item in items if "slow" in item.keywords}
    items.sort(key=lambda item: item.path not in slow_files)
