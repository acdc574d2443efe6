"""Backends: the only code that names CUDA devices, process groups or torch_xla."""

from __future__ import annotations

import os

import torch

from largebatch.backends.base import Backend
from largebatch.errors import UsageError

__all__ = ["Backend", "build_backend", "resolve_backend_name"]


def resolve_backend_name(name: str) -> str:
    """``auto`` -> ``xla`` when PJRT_DEVICE is set, ``cuda`` when a GPU is visible, else ``cpu``."""
    if name != "auto":
        return name
    if os.environ.get("PJRT_DEVICE"):
        return "xla"
    return "cuda" if torch.cuda.is_available() else "cpu"


def build_backend(name: str = "auto", *, timeout_s: int = 1800) -> Backend:
    """Create (not start) the backend named ``auto|cpu|cuda|xla``."""
    name = resolve_backend_name(name)
    if name in ("cpu", "cuda"):
        from largebatch.backends.torch_dist import TorchDistributedBackend

        return TorchDistributedBackend(name, timeout_s=timeout_s)
    if name == "xla":
        from largebatch.backends.xla import XlaBackend

        return XlaBackend(timeout_s=timeout_s)
    raise UsageError(f"unknown backend {name!r}; choose auto, cpu, cuda or xla")
