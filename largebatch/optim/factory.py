"""Registry of optimizers by name, and ``build_optimizer``, the one call ``largebatch.run`` makes.

Variants are data: ``larc`` is the ``lars`` entry with ``trust_clip=True``, ``sgd`` is ``torch.optim.SGD``
with momentum 0.9 (timm ``_optim_factory.py`` does the same). Configs name an entry; nothing here reads a
config object.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Iterable, Mapping

import torch
from torch import nn

from largebatch.errors import UsageError
from .lamb import LAMB
from .lars import LARS
from .param_groups import param_groups

__all__ = ["OptimizerEntry", "OPTIMIZERS", "optimizer_names", "build_optimizer"]


@dataclass(frozen=True)
class OptimizerEntry:
    """One registry entry.

    Attributes:
        cls: the optimizer class.
        options: the keyword options a caller may pass through ``build_optimizer``.
        defaults: keyword arguments this entry sets (a caller's options override them).
        description: one line for ``--help`` style listings.
    """

    cls: type[torch.optim.Optimizer]
    options: frozenset[str]
    defaults: Mapping[str, Any] = field(default_factory=dict)
    description: str = ""


_LARS_OPTIONS = frozenset({"momentum", "nesterov", "trust_coefficient", "eps", "lr_in_momentum", "foreach"})

OPTIMIZERS: Mapping[str, OptimizerEntry] = MappingProxyType(
    {
        "sgd": OptimizerEntry(
            torch.optim.SGD,
            frozenset({"momentum", "nesterov", "foreach"}),
            {"momentum": 0.9},
            "torch.optim.SGD with momentum (Goyal et al. 2017)",
        ),
        "lars": OptimizerEntry(LARS, _LARS_OPTIONS, {}, "LARS (You et al. 2017, arXiv 1708.03888)"),
        "larc": OptimizerEntry(
            LARS, _LARS_OPTIONS, {"trust_clip": True}, "LARS with LARC trust-ratio clipping (NVIDIA apex)"
        ),
        "lamb": OptimizerEntry(
            LAMB, frozenset({"betas", "eps", "foreach"}), {}, "LAMB (You et al. 2019, arXiv 1904.00962)"
        ),
    }
)


def optimizer_names() -> list[str]:
    """The names ``build_optimizer`` accepts, sorted."""
    return sorted(OPTIMIZERS)


def build_optimizer(
    name: str,
    model_or_groups: nn.Module | Iterable[Any],
    *,
    lr: float,
    weight_decay: float,
    exclude_bn_bias: bool = True,
    decay_bias: bool = False,
    **options: Any,
) -> torch.optim.Optimizer:
    """Build the optimizer registered as ``name``.

    Args:
        name: a registry name, see :func:`optimizer_names`.
        model_or_groups: a model, split by :func:`largebatch.optim.param_groups` (honouring
            ``exclude_bn_bias``), or parameters / param-group dicts passed to the optimizer as they are
            (``weight_decay`` is then the default of groups that do not set their own).
        lr: learning rate (already scaled for the global batch).
        weight_decay: weight decay of the decayed group.
        exclude_bn_bias: exclude BN, bias and ``no_weight_decay()`` tensors from decay and adaptation.
        decay_bias: with ``exclude_bn_bias``, decay and adapt biases: exclude BN only (see ``param_groups``).
        **options: optimizer options among ``momentum, nesterov, trust_coefficient, eps, lr_in_momentum,
            betas, foreach``, each accepted only by the optimizers that take it; an option set to None keeps
            the default.

    Raises:
        UsageError (a ValueError): unknown ``name``, or an option the named optimizer does not take.
    """
    entry = OPTIMIZERS.get(name)
    if entry is None:
        raise UsageError(f"unknown optimizer {name!r}; valid names: {', '.join(optimizer_names())}")
    unknown = sorted(set(options) - entry.options)
    if unknown:
        raise UsageError(
            f"optimizer {name!r} does not take option(s) {', '.join(map(repr, unknown))}; "
            f"it accepts: {', '.join(sorted(entry.options))}"
        )
    if isinstance(model_or_groups, nn.Module):
        params: Any = param_groups(model_or_groups, weight_decay, exclude_bn_bias=exclude_bn_bias,
                                   decay_bias=decay_bias)
    else:
        params = list(model_or_groups)
    kwargs = {**entry.defaults, **{k: v for k, v in options.items() if v is not None}}
    return entry.cls(params, lr=lr, weight_decay=weight_decay, **kwargs)
