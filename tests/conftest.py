"""Shared pytest set-up: skip accelerator-only tests where the accelerator is absent."""

from __future__ import annotations

import importlib.util

import pytest
import torch


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    has_cuda = torch.cuda.is_available()
    has_xla = importlib.util.find_spec("torch_xla") is not None
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    skip_xla = pytest.mark.skip(reason="needs torch-xla (run in .venv-xla with PJRT_DEVICE=CPU)")
    for item in items:
        if "gpu" in item.keywords and not has_cuda:
            item.add_marker(skip_gpu)
        if "xla" in item.keywords and not has_xla:
            item.add_marker(skip_xla)
