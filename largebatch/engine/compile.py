"""``torch.compile`` for the training step, and state dicts that do not depend on it.

Modes (``model.compile``), those of ``torch.compile``:

* ``none``: eager;
* ``default``: Inductor kernels (fused elementwise ops around the convolutions);
* ``max-autotune-no-cudagraphs``: also benchmarks Triton/cuBLAS choices per shape at start;
* ``reduce-overhead``: CUDA graphs, which replay a step's kernels with one launch (removes
  the per-kernel launch cost that dominates small per-GPU batches);
* ``max-autotune``: both.

The vocabulary and its parser live in :mod:`largebatch.defaults` (no torch), so the
config checks it at compose time; they are re-exported here.

A compiled module keeps the eager one as ``_orig_mod``, so its ``state_dict()`` keys gain an
``_orig_mod.`` prefix; checkpoints are written from :func:`unwrap_model` (no prefix, the same
file with or without compile) and :func:`strip_compile_prefixes` reads older ones.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch
from torch import nn

from largebatch.defaults import COMPILE_MODES, CUDA_GRAPH_MODES, parse_compile_mode

__all__ = [
    "COMPILE_MODES",
    "compile_model",
    "parse_compile_mode",
    "strip_compile_prefixes",
    "unwrap_model",
    "uses_cuda_graphs",
]


def compile_model(model: nn.Module, mode: str) -> nn.Module:
    """``torch.compile(model)`` in ``mode`` (``none``: the model itself)."""
    mode = parse_compile_mode(mode)
    if mode == "none":
        return model
    return torch.compile(model, mode=None if mode == "default" else mode)


def uses_cuda_graphs(mode: str) -> bool:
    """True for the modes whose compiled step replays CUDA graphs."""
    return parse_compile_mode(mode) in CUDA_GRAPH_MODES


def unwrap_model(model: nn.Module) -> nn.Module:
    """The plain model inside ``torch.compile`` and DDP wrappers (in any nesting)."""
    while True:
        inner = getattr(model, "_orig_mod", None)  # torch.compile's OptimizedModule
        if isinstance(inner, nn.Module):
            model = inner
        elif isinstance(model, nn.parallel.DistributedDataParallel):
            model = model.module
        else:
            return model


def strip_compile_prefixes(state_dict: Mapping[str, Any]) -> dict[str, Any]:
    """``state_dict`` with every ``_orig_mod.`` of a compiled module removed from its keys."""
    return {key.replace("_orig_mod.", ""): value for key, value in state_dict.items()}
