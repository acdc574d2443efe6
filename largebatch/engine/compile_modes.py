"""The ``model.compile`` vocabulary: the modes of ``torch.compile`` and their config aliases.

Imports no torch, so the config checks (``largebatch.config.checks``) validate the value at
compose time without loading it; :mod:`largebatch.engine.compile` applies the mode.
"""

from __future__ import annotations

from typing import Any

from largebatch.errors import UsageError

__all__ = ["COMPILE_MODES", "CUDA_GRAPH_MODES", "parse_compile_mode"]

COMPILE_MODES = ("none", "default", "reduce-overhead", "max-autotune-no-cudagraphs", "max-autotune")
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")  # their compiled step replays CUDA graphs
_ALIASES = {"false": "none", "true": "default"}


def parse_compile_mode(value: Any) -> str:
    """The canonical compile mode of a config value (``true``/``false`` mean default/none)."""
    text = str(value).strip().lower()
    mode = _ALIASES.get(text, text)
    if mode not in COMPILE_MODES:
        raise UsageError(f"model.compile={value!r} is not a compile mode; use one of "
                         f"{', '.join(COMPILE_MODES)} (or true/false)")
    return mode
