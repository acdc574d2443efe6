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

A run whose training batches change shape (progressive resizing, a batch schedule raised by the
per-device batch) tells :func:`compile_model` how many shapes it will see: each is then compiled
once, static (``dynamic=False``: no guess that a changed dimension stays dynamic, which compiles
a slower symbolic-shape graph on the second size), and dynamo's recompile limit is raised to
that count, so the known shapes never fall back to eager.

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


def compile_model(model: nn.Module, mode: str, shapes: int = 1) -> nn.Module:
    """``torch.compile(model)`` in ``mode`` (``none``: the model itself); ``shapes``: the distinct
    training batch shapes the run will feed it (more than 1: each compiled once, static, and the
    recompile limit at least ``shapes``; see the module docstring)."""
    mode = parse_compile_mode(mode)
    if mode == "none":
        return model
    if shapes > 1:
        import torch._dynamo.config as dynamo_config

        dynamo_config.recompile_limit = max(dynamo_config.recompile_limit, shapes)
        compiled = torch.compile(model, mode=None if mode == "default" else mode, dynamic=False)
    else:
        compiled = torch.compile(model, mode=None if mode == "default" else mode)
    # torch.compile of a module returns an OptimizedModule (a Module); its stub says only Callable
    assert isinstance(compiled, nn.Module), type(compiled)
    return compiled


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
