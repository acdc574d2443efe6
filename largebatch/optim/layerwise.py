"""What LARS and LAMB share: the ``torch.optim`` plumbing of a layer-wise adaptive optimizer and the
per-tensor arithmetic of their trust ratios.

:class:`LayerwiseOptimizer` is a ``torch.optim.Optimizer`` as torch's SGD and Adam and timm's Lars and
Lamb are (``__init__(params, lr, ...)``, ``defaults``, ``add_param_group``, ``__setstate__``,
``state_dict``), with three things written once for both: every param group is checked as it will be
(defaults filled in) before torch keeps it, timm's argument names are read as ours
(:mod:`largebatch.optim.timm_names`), and state saved before an option existed gets the option's old
value back. Each subclass keeps its own ``__init__`` signature, rule and ``step()``.

The helpers below (:func:`sq_norm`, :func:`stacked`, :func:`use_foreach`) compute trust ratios on the
device without a host read, for both update rules and both of their paths.
"""

from __future__ import annotations

from typing import Any, Callable, ClassVar, Iterable, Mapping, Optional

import torch
from torch import Tensor
from torch.optim import Optimizer

from largebatch.errors import UsageError
from .timm_names import TimmName, from_timm_names

__all__ = ["LayerwiseOptimizer", "sq_norm", "stacked", "use_foreach"]


class LayerwiseOptimizer(Optimizer):
    """Base of :class:`largebatch.optim.LARS` and :class:`largebatch.optim.LAMB`.

    A subclass sets :attr:`timm_names` (timm's spellings of its options) and :attr:`backfill` (each
    option added after the first release, with the value that means what the optimizer did before it,
    for state saved then), implements :meth:`check_group`, and calls ``super().__init__(params,
    defaults)`` with its ``defaults`` dict, as a torch optimizer does; its rule is :meth:`update_group`,
    which ``step()`` calls for each group with the parameters that have a gradient.
    """

    timm_names: ClassVar[Mapping[str, TimmName]] = {}
    backfill: ClassVar[Mapping[str, Any]] = {}

    def __init__(self, params: Iterable[Tensor] | Iterable[dict[str, Any]], defaults: dict[str, Any]) -> None:
        self.check_group(defaults, where=type(self).__name__)
        super().__init__(params, defaults)

    @classmethod
    def our_options(cls, options: Mapping[str, Any], known: Iterable[str] = ()) -> dict[str, Any]:
        """Keyword ``options`` with timm's names read as ours (``TypeError`` for one that is neither
        timm's nor in ``known``, as Python raises for an unexpected keyword)."""
        ours = from_timm_names(options, cls.timm_names, cls=cls.__name__, where=cls.__name__)
        unknown = sorted(set(ours) - set(known))
        if unknown:
            raise TypeError(f"{cls.__name__} got unexpected keyword argument(s) {', '.join(map(repr, unknown))}")
        return ours

    @staticmethod
    def check_group(group: dict[str, Any], where: str) -> None:
        """Raise ``UsageError`` (a ``ValueError``) naming ``where`` and the fix for a bad option value;
        here the options every layer-wise optimizer has, a subclass adds its own."""
        if not group["lr"] >= 0.0:
            raise UsageError(f"{where}: invalid lr {group['lr']!r}, must be >= 0")
        if not group["weight_decay"] >= 0.0:
            raise UsageError(f"{where}: invalid weight_decay {group['weight_decay']!r}, must be >= 0")

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        # validate the group as it will be (defaults filled in) before torch appends it: a group that
        # raises must not stay in param_groups
        name = type(self).__name__
        where = f"{name} param group {len(self.param_groups)}"
        param_group = from_timm_names(param_group, self.timm_names, cls=name, where=where)
        group = {**self.defaults, **{k: v for k, v in param_group.items() if k != "params"}}
        self.check_group(group, where=where)
        super().add_param_group(param_group)

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        for group in self.param_groups:  # checkpoints written before an option existed
            for key, value in self.backfill.items():
                group.setdefault(key, value)

    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], Any]] = None) -> Any:
        """Perform one optimisation step.

        Args:
            closure: optional callable that re-evaluates the model and returns the loss.
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params: list[Tensor] = []
            grads: list[Tensor] = []
            for p in group["params"]:
                if p.grad is not None:
                    if p.grad.is_sparse:
                        raise RuntimeError(f"{type(self).__name__} does not support sparse gradients")
                    params.append(p)
                    grads.append(p.grad)
            if params:
                self.update_group(group, params, grads)
        return loss

    def update_group(self, group: dict[str, Any], params: list[Tensor], grads: list[Tensor]) -> None:
        """Update ``group``'s ``params`` (those with a gradient, at least one) in place."""
        raise NotImplementedError


def use_foreach(foreach: Optional[bool], params: list[Tensor]) -> bool:
    """Resolve ``foreach=None`` as torch.optim does: multi-tensor off CPU (launch-bound), per-tensor on CPU."""
    if foreach is not None:
        return foreach
    return bool(params) and all(p.device.type != "cpu" for p in params)


def sq_norm(t: Tensor) -> Tensor:
    """Squared L2 norm of one tensor as a 0-dim tensor (float32 at least), computed on its device."""
    if t.dtype in (torch.float32, torch.float64) and t.is_contiguous():
        flat = t.view(-1)
        # BLAS dot: on CPU about twice as fast as vector_norm, and more accurate in float32
        return torch.dot(flat, flat)
    return torch.linalg.vector_norm(t, dtype=torch.promote_types(t.dtype, torch.float32)).square()


def stacked(fn: Callable[..., list[Tensor]], *scalar_lists: list[Tensor]) -> list[list[Tensor]]:
    """Apply ``fn`` to 1-D stacks of per-tensor 0-dim values (one stack per device and dtype).

    ``fn`` returns a list of 1-D tensors; the result is, for each of them, the list of per-tensor 0-dim
    views. Vectorising the trust-ratio arithmetic costs a handful of ops per group instead of per tensor.
    """
    first = scalar_lists[0]
    buckets: dict[tuple[torch.device, torch.dtype], list[int]] = {}
    for i, t in enumerate(first):
        buckets.setdefault((t.device, t.dtype), []).append(i)
    if len(buckets) == 1:
        return [out.unbind(0) for out in fn(*(torch.stack(lst) for lst in scalar_lists))]
    results: list[list[Any]] = []
    for idx in buckets.values():
        outs = fn(*(torch.stack([lst[i] for i in idx]) for lst in scalar_lists))
        if not results:
            results = [[None] * len(first) for _ in outs]
        for res, out in zip(results, outs):
            for i, v in zip(idx, out.unbind(0)):
                res[i] = v
    return results
