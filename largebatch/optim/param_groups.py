"""Split a model's parameters into the decay/adapt group and the excluded (BN, bias) group.

The split every large-batch recipe uses: Goyal et al. 2017 (arXiv 1706.02677) apply no weight decay to BN
and bias when asked, Jia et al. 2018 (arXiv 1807.11205) and the MLPerf ResNet-50 reference also exclude
them from the LARS trust ratio. The groups carry ``lars_exclude``, the flag :class:`largebatch.optim.LARS`
and :class:`largebatch.optim.LAMB` read; ``torch.optim`` optimizers ignore it and see only the decay.
"""

from __future__ import annotations

import fnmatch
from typing import Any

from torch import nn

from largebatch.errors import UsageError

__all__ = ["param_groups"]

_NORM_LAYERS = (
    nn.modules.batchnorm._BatchNorm,
    nn.modules.instancenorm._InstanceNorm,
    nn.GroupNorm,
    nn.LayerNorm,
    nn.LocalResponseNorm,
    *((nn.RMSNorm,) if hasattr(nn, "RMSNorm") else ()),
)


def param_groups(model: nn.Module, weight_decay: float, exclude_bn_bias: bool = True,
                 decay_bias: bool = False) -> list[dict[str, Any]]:
    """Parameter groups for an optimizer: decayed and adapted tensors, then excluded ones.

    Excluded (``weight_decay=0.0, lars_exclude=True``): tensors with at most one dimension, biases, the
    parameters of normalisation layers, and the names listed by ``no_weight_decay()`` on the model or any
    submodule (timm convention; names relative to that module, ``fnmatch`` wildcards allowed). Everything
    else gets ``weight_decay=weight_decay, lars_exclude=False``.

    Every trainable parameter lands in exactly one group (shared tensors once), frozen ones
    (``requires_grad=False``) in none, and empty groups are dropped.

    Args:
        model: the model whose parameters to split.
        weight_decay: decay of the non-excluded group.
        exclude_bn_bias: False gives a single group, all parameters decayed and adapted (default: True).
        decay_bias: with ``exclude_bn_bias``, exclude only the normalisation layers' parameters and the
            ``no_weight_decay()`` names: biases and other 1-D tensors are decayed and adapted (fast.ai's
            DAWNBench 2018 code, diux-dev/imagenet18 ``bnwd_optim_params``; default: False).
    """
    if weight_decay < 0:
        raise UsageError(f"weight_decay must be >= 0, got {weight_decay!r}")
    decay, excluded = [], []
    no_decay_names = _no_weight_decay_names(model) if exclude_bn_bias else set()
    norm_params = _norm_layer_param_ids(model) if exclude_bn_bias else set()
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        if exclude_bn_bias and _is_excluded(name, param.ndim, id(param) in norm_params, no_decay_names, decay_bias):
            excluded.append(param)
        else:
            decay.append(param)
    groups = [
        {"params": decay, "weight_decay": weight_decay, "lars_exclude": False},
        {"params": excluded, "weight_decay": 0.0, "lars_exclude": True},
    ]
    return [g for g in groups if g["params"]]


def _is_excluded(name: str, ndim: int, in_norm_layer: bool, no_decay_patterns: set[str],
                 decay_bias: bool = False) -> bool:
    """Whether a parameter belongs to the excluded group (see :func:`param_groups`)."""
    bias = ndim <= 1 or name == "bias" or name.endswith(".bias")
    return (
        (bias and not decay_bias)
        or in_norm_layer
        or any(fnmatch.fnmatchcase(name, pattern) for pattern in no_decay_patterns)
    )


def _no_weight_decay_names(model: nn.Module) -> set[str]:
    """Full parameter names (or patterns) listed by ``no_weight_decay()`` on the model and its submodules."""
    names: set[str] = set()
    for prefix, module in model.named_modules():
        listed = getattr(module, "no_weight_decay", None)
        if not callable(listed):
            continue
        for name in listed():
            names.add(f"{prefix}.{name}" if prefix else name)
    return names


def _norm_layer_param_ids(model: nn.Module) -> set[int]:
    return {
        id(p)
        for module in model.modules()
        if isinstance(module, _NORM_LAYERS)
        for p in module.parameters(recurse=False)
    }
