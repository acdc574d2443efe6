"""timm's argument names for LARS and LAMB, for code ported from ``timm.optim.Lars`` / ``timm.optim.Lamb``.

A timm name is accepted where its meaning is ours: renamed (``trust_coeff`` is our ``trust_coefficient``),
or, for an option we do not have, only at the value that describes what ours already does
(``always_adapt=True``, ``max_grad_norm=None``). Any other value is refused with a message naming what to
use instead, never silently ignored (a param-group key nothing reads would be). The differences are
tabled in docs/reusable-parts.md, "Porting from timm".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional

from largebatch.errors import UsageError

__all__ = ["TimmName", "LARS_TIMM_NAMES", "LAMB_TIMM_NAMES", "from_timm_names"]


@dataclass(frozen=True)
class TimmName:
    """How one of timm's option names maps onto ours.

    Attributes:
        ours: our name for the same option (the value passes through), or None if we have no such option.
        value: with ``ours=None``, the one value that means what ours does; it is accepted and dropped.
        otherwise: with ``ours=None``, why another value is refused and what to do instead.
    """

    ours: Optional[str] = None
    value: Any = None
    otherwise: str = ""


_ALWAYS_ADAPT = TimmName(
    value=True,
    otherwise="{cls} adapts the trust ratio of every group not marked lars_exclude, whatever its weight decay "
    "(timm's always_adapt=True); for timm's default, no adaptation where weight_decay is 0, set "
    "lars_exclude=True on those groups (largebatch.optim.param_groups does it for BN and biases)",
)

# timm/optim/lars.py (timm 1.0.31)
LARS_TIMM_NAMES: Mapping[str, TimmName] = {
    "trust_coeff": TimmName(ours="trust_coefficient"),
    "always_adapt": _ALWAYS_ADAPT,
    "dampening": TimmName(value=0, otherwise="{cls} has no momentum dampening"),
}

# timm/optim/lamb.py (timm 1.0.31); its trust_clip (LAMBC) is our trust_clip, same name
LAMB_TIMM_NAMES: Mapping[str, TimmName] = {
    "always_adapt": _ALWAYS_ADAPT,
    "max_grad_norm": TimmName(
        value=None,
        otherwise="{cls} does not clip gradients inside step() (timm's Lamb clips the global norm, by default "
        "to 1.0); clip once in the training loop, e.g. torch.nn.utils.clip_grad_norm_(params, max_norm)",
    ),
    "bias_correction": TimmName(value=True, otherwise="{cls} always bias-corrects its moments"),
}


def from_timm_names(
    options: Mapping[str, Any], names: Mapping[str, TimmName], *, cls: str, where: str
) -> dict[str, Any]:
    """``options`` with timm's names replaced by ours; other keys pass through unchanged.

    Args:
        options: keyword options or a param-group dict, possibly spelled as timm spells them.
        names: :data:`LARS_TIMM_NAMES` or :data:`LAMB_TIMM_NAMES`.
        cls: the optimizer's name, for messages.
        where: what ``options`` are, for messages ("LARS", "LARS param group 1").

    Raises:
        UsageError (a ValueError): both spellings of one option, or a timm value we do not implement.
    """
    out = {k: v for k, v in options.items() if k not in names}
    for key, value in options.items():
        spec = names.get(key)
        if spec is None:
            continue
        if spec.ours is not None:
            if spec.ours in options:
                raise UsageError(f"{where}: pass {spec.ours} or timm's name for it, {key}, not both")
            out[spec.ours] = value
        elif value != spec.value:
            raise UsageError(f"{where}: timm's {key}={value!r} is not supported: " + spec.otherwise.format(cls=cls))
    return out
