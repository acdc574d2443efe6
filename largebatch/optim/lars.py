"""LARS: layer-wise adaptive rate scaling for large-batch SGD (with the LARC clipping variant).

Based on You, Gitman, Ginsburg 2017, "Large Batch Training of Convolutional Networks" (arXiv 1708.03888),
in the form the ImageNet-in-minutes systems (Jia et al. 2018, Ying et al. 2018) and the MLPerf ResNet-50
reference use: a per-tensor trust ratio scales the decayed gradient, then heavy-ball momentum. LARC's
clipping (NVIDIA apex ``apex/parallel/LARC.py``) is the ``trust_clip`` option.

Two implementations of the same update, chosen by ``foreach``:

* ``_single_tensor_lars``: one tensor at a time, so each tensor stays cache-hot across its ops. On CPU the
  step is memory-bound and this is the faster path (and the default there).
* ``_multi_tensor_lars``: ``torch._foreach_*`` over all tensors of a group, the default on CUDA/XLA where the
  step is kernel-launch-bound.

The momentum buffer comes in two forms, chosen by ``lr_in_momentum`` (see :class:`LARS`): torch's SGD
convention (the default: ``lr`` multiplies the buffer) and the form of the TensorFlow LARS optimizers the paper
presets cite (``lr`` times the trust ratio folded into the buffer). They agree at a constant lr and differ while
it changes (warmup, decay): Goyal et al. 2017 (arXiv 1706.02677) sec. 2.2, "momentum correction".

Neither path reads a tensor back to the host or branches on a tensor value: trust ratios are computed with
``torch.where`` on the device, so the same step runs on XLA without syncs or recompiles.
"""

from __future__ import annotations

from typing import Any, Iterable, Optional

import torch
from torch import Tensor

from largebatch.errors import UsageError
from .layerwise import LayerwiseOptimizer, sq_norm, stacked, use_foreach
from .timm_names import LARS_TIMM_NAMES

__all__ = ["LARS", "lars"]

_TRUST_COEFFICIENT = 0.001


class LARS(LayerwiseOptimizer):
    """LARS (and LARC with ``trust_clip=True``) for PyTorch.

    Paper: You, Gitman, Ginsburg 2017, "Large Batch Training of Convolutional Networks", arXiv 1708.03888.

    For each tensor ``w`` with gradient ``g`` in a group that is not excluded::

        ratio = trust_coefficient * ||w|| / (||g|| + weight_decay * ||w|| + eps)
        ratio = min(ratio / lr, 1)                     (only with trust_clip)
        buf   = momentum * buf + ratio * (g + weight_decay * w)
        w     = w - lr * buf

    The ratio is 1 where ``||w||`` or ``||g||`` is 0. With ``nesterov=True`` the last line is
    ``w = w - lr * (ratio * (g + weight_decay * w) + momentum * buf)``.

    A group with ``lars_exclude=True`` (BN and bias parameters, see :func:`largebatch.optim.param_groups`)
    gets plain momentum SGD: no weight decay (its ``weight_decay`` is ignored) and no trust ratio. Exclusion
    is this explicit flag, never a side effect of a zero weight decay: a non-excluded group with
    ``weight_decay=0`` is still adapted.

    Conventions as ``torch.optim.SGD``: ``lr`` multiplies the momentum buffer (it is not folded into it), the
    buffer starts at zero, so the first step moves by ``lr * ratio * (g + wd * w)``. There is no dampening.

    With ``lr_in_momentum=True`` the learning rate (times the trust ratio) goes into the buffer instead, the
    form of tensorflow/tpu ``models/official/efficientnet/lars_optimizer.py``, ``tf.contrib.opt.LARSOptimizer``
    and the MLPerf ResNet-50 reference's ``lars_optimizer.py`` (``ApplyMomentum`` with ``lr=1`` and the
    gradient times ``lr * ratio``)::

        buf   = momentum * buf + lr * ratio * (g + weight_decay * w)
        w     = w - buf

    (in an excluded group the buffer adds ``lr * g`` instead; with ``nesterov=True`` the last line is
    ``w = w - (lr * ratio * (g + weight_decay * w) + momentum * buf)``)

    The two agree while ``lr`` is constant. When it changes, the first form applies the new ``lr`` to the whole
    buffer at once; this one lets the old ``lr`` carry on in the buffer for about ``1 / (1 - momentum)`` steps
    (Goyal et al. 2017, arXiv 1706.02677, sec. 2.2: "momentum correction"), so under warmup and poly decay they
    train differently. The buffers mean different things (this one is about ``lr`` times the other), so
    :meth:`load_state_dict` refuses a state saved with the other form.

    Args:
        params: iterable of parameters or of dicts defining parameter groups; a group may set
            ``lars_exclude`` (default: False).
        lr: learning rate (default: 1.0).
        momentum: heavy-ball momentum factor, in [0, 1) (default: 0.9).
        weight_decay: L2 penalty added to the gradient before the trust ratio (default: 0.0).
        nesterov: use Nesterov momentum (default: False).
        trust_coefficient: the trust coefficient eta of the paper (default: 0.001).
        eps: added to the trust-ratio denominator (default: 1e-8).
        trust_clip: LARC clipping, ratio replaced by min(ratio / lr, 1) (default: False).
        lr_in_momentum: fold ``lr * ratio`` into the momentum buffer and step by the buffer, as the TensorFlow
            LARS optimizers do, instead of torch's SGD convention (default: False).
        foreach: True for the multi-tensor path, False for the per-tensor path, None to pick the faster for
            the device (multi-tensor off CPU, per-tensor on CPU) (default: None).
        **timm_options: timm's ``Lars`` names, here and in param groups: ``trust_coeff`` (our
            ``trust_coefficient``), ``always_adapt=True`` and ``dampening=0`` (what ours does); other values
            are refused with what to use instead (see :mod:`largebatch.optim.timm_names`).
    """

    timm_names = LARS_TIMM_NAMES
    backfill = {  # what LARS did before each option existed
        "nesterov": False,
        "trust_coefficient": _TRUST_COEFFICIENT,
        "eps": 1e-8,
        "trust_clip": False,
        "lr_in_momentum": False,  # the only form before the option existed
        "lars_exclude": False,
        "foreach": None,
    }

    def __init__(
        self,
        params: Iterable[Tensor] | Iterable[dict[str, Any]],
        lr: float = 1.0,
        momentum: float = 0.9,
        weight_decay: float = 0.0,
        *,
        nesterov: bool = False,
        trust_coefficient: Optional[float] = None,
        eps: float = 1e-8,
        trust_clip: bool = False,
        lr_in_momentum: bool = False,
        foreach: Optional[bool] = None,
        **timm_options: Any,
    ) -> None:
        ours = {} if trust_coefficient is None else {"trust_coefficient": trust_coefficient}
        options = self.our_options({**timm_options, **ours}, known=("trust_coefficient",))
        defaults = dict(
            lr=lr,
            momentum=momentum,
            weight_decay=weight_decay,
            nesterov=nesterov,
            trust_coefficient=options.get("trust_coefficient", _TRUST_COEFFICIENT),
            eps=eps,
            trust_clip=trust_clip,
            lr_in_momentum=lr_in_momentum,
            lars_exclude=False,
            foreach=foreach,
        )
        super().__init__(params, defaults)

    @staticmethod
    def check_group(group: dict[str, Any], where: str) -> None:
        LayerwiseOptimizer.check_group(group, where)  # lr, weight_decay
        if not 0.0 <= group["momentum"] < 1.0:
            raise UsageError(f"{where}: invalid momentum {group['momentum']!r}, must be in [0, 1)")
        if not group["trust_coefficient"] > 0.0:
            raise UsageError(f"{where}: invalid trust_coefficient {group['trust_coefficient']!r}, must be > 0")
        if not group["eps"] >= 0.0:
            raise UsageError(f"{where}: invalid eps {group['eps']!r}, must be >= 0")
        if not isinstance(group["lr_in_momentum"], bool):
            raise UsageError(f"{where}: invalid lr_in_momentum {group['lr_in_momentum']!r}, must be True or False")
        if group["nesterov"] and group["momentum"] == 0:
            raise UsageError(f"{where}: nesterov=True needs momentum > 0")

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """As torch's, but refuses momentum buffers written in the other ``lr_in_momentum`` form.

        torch would keep the saved group's form (its values replace this optimizer's), silently ignoring the
        form this run asked for; converting the buffers would need the lr of every step that filled them. A
        state written before the option existed was written in the torch form (``lr_in_momentum=False``).
        """
        saved_groups = state_dict["param_groups"]
        if any(state.get("momentum_buffer") is not None for state in state_dict["state"].values()):
            for i, (group, saved) in enumerate(zip(self.param_groups, saved_groups)):
                was, now = bool(saved.get("lr_in_momentum", False)), bool(group["lr_in_momentum"])
                if was != now:
                    raise UsageError(
                        f"LARS param group {i}: the saved momentum buffers were written with "
                        f"lr_in_momentum={was} and this optimizer has lr_in_momentum={now} (the buffers "
                        f"mean different things): resume with lr_in_momentum={was}, or start afresh"
                    )
        super().load_state_dict(state_dict)

    def update_group(self, group: dict[str, Any], params: list[Tensor], grads: list[Tensor]) -> None:
        bufs: list[Tensor] = []
        if group["momentum"] != 0:
            for p in params:
                state = self.state[p]
                if state.get("momentum_buffer") is None:
                    state["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                bufs.append(state["momentum_buffer"])
        lars(
            params,
            grads,
            bufs,
            lr=group["lr"],
            momentum=group["momentum"],
            weight_decay=group["weight_decay"],
            nesterov=group["nesterov"],
            trust_coefficient=group["trust_coefficient"],
            eps=group["eps"],
            trust_clip=group["trust_clip"],
            lr_in_momentum=group["lr_in_momentum"],
            exclude=group["lars_exclude"],
            foreach=group["foreach"],
        )


def lars(
    params: list[Tensor],
    grads: list[Tensor],
    momentum_buffers: list[Tensor],
    *,
    lr: float,
    momentum: float,
    weight_decay: float,
    nesterov: bool,
    trust_coefficient: float,
    eps: float,
    trust_clip: bool,
    exclude: bool,
    lr_in_momentum: bool = False,
    foreach: Optional[bool] = None,
) -> None:
    """Functional LARS update of one parameter group, in place; see :class:`LARS` for the rule.

    ``momentum_buffers`` holds one buffer per parameter (zeros before the first step), or is empty when
    ``momentum == 0``. Gradients are not modified. ``lr_in_momentum`` picks the buffer's form (see :class:`LARS`).
    """
    func = _multi_tensor_lars if use_foreach(foreach, params) else _single_tensor_lars
    func(
        params,
        grads,
        momentum_buffers,
        lr=lr,
        momentum=momentum,
        weight_decay=weight_decay,
        nesterov=nesterov,
        trust_coefficient=trust_coefficient,
        eps=eps,
        trust_clip=trust_clip,
        exclude=exclude,
        lr_in_momentum=lr_in_momentum,
    )


def _lars_trust_ratio(
    w_norm: Tensor,
    g_norm: Tensor,
    *,
    lr: float,
    weight_decay: float,
    trust_coefficient: float,
    eps: float,
    trust_clip: bool,
) -> Tensor:
    ratio = trust_coefficient * w_norm / (g_norm + weight_decay * w_norm + eps)
    # norms are >= 0, so min > 0 <=> both > 0 (one where: logical_and is unreliable on XLA)
    ratio = torch.where(torch.minimum(w_norm, g_norm) > 0, ratio, 1.0)
    if trust_clip and lr > 0:
        ratio = torch.clamp(ratio / lr, max=1.0)
    return ratio


def _single_tensor_lars(
    params: list[Tensor],
    grads: list[Tensor],
    bufs: list[Tensor],
    *,
    lr: float,
    momentum: float,
    weight_decay: float,
    nesterov: bool,
    trust_coefficient: float,
    eps: float,
    trust_clip: bool,
    exclude: bool,
    lr_in_momentum: bool,
) -> None:
    # lr_in_momentum: lr multiplies what enters the buffer (fold) and the parameter steps by the buffer (out = 1);
    # torch's form the other way round. Without momentum the two are one update.
    fold, out = (lr, 1.0) if lr_in_momentum and momentum != 0 else (1.0, lr)
    if exclude:  # plain momentum SGD, no decay, no adaptation
        for i, (p, g) in enumerate(zip(params, grads)):
            if momentum == 0:
                p.add_(g, alpha=-lr)
                continue
            buf = bufs[i].mul_(momentum).add_(g, alpha=fold)
            if nesterov:
                p.add_(g, alpha=-lr).add_(buf, alpha=-out * momentum)
            else:
                p.add_(buf, alpha=-out)
        return

    def ratios_fn(w_sq: Tensor, g_sq: Tensor) -> list[Tensor]:
        ratio = _lars_trust_ratio(
            w_sq.sqrt(),
            g_sq.sqrt(),
            lr=lr,
            weight_decay=weight_decay,
            trust_coefficient=trust_coefficient,
            eps=eps,
            trust_clip=trust_clip,
        )
        if lr_in_momentum and momentum != 0:
            ratio = ratio * fold
        return [ratio, ratio * weight_decay]

    ratios, decay_ratios = stacked(ratios_fn, [sq_norm(p) for p in params], [sq_norm(g) for g in grads])
    for i, (p, g, r, r_wd) in enumerate(zip(params, grads, ratios, decay_ratios)):
        if momentum == 0 or nesterov:
            d = torch.mul(g, r).addcmul_(p, r_wd)  # fold * ratio * (g + wd * w), leaves p.grad untouched
            if momentum == 0:
                p.sub_(d, alpha=out)
            else:
                buf = bufs[i].mul_(momentum).add_(d)
                p.sub_(d, alpha=out).sub_(buf, alpha=out * momentum)
        else:
            # buf = m * buf + r * g + (r * wd) * w without a temporary: 3 passes, as many as torch's SGD
            buf = _scale_add_(bufs[i], momentum, g, r).addcmul_(p, r_wd)
            p.sub_(buf, alpha=out)


def _scale_add_(buf: Tensor, beta: float, g: Tensor, r: Tensor) -> Tensor:
    """``buf = beta * buf + r * g`` in place, ``r`` a 0-dim tensor, in one pass where the layout allows."""
    if buf.is_contiguous() and g.is_contiguous() and g.dtype == r.dtype:
        n = buf.numel()
        # addr (beta * self + outer(vec1, vec2)) is a single elementwise kernel: mul_ + addcmul_ are two
        return buf.view(n, 1).addr_(g.view(n), r.view(1), beta=beta).view_as(g)
    return buf.mul_(beta).addcmul_(g, r)


def _multi_tensor_lars(
    params: list[Tensor],
    grads: list[Tensor],
    bufs: list[Tensor],
    *,
    lr: float,
    momentum: float,
    weight_decay: float,
    nesterov: bool,
    trust_coefficient: float,
    eps: float,
    trust_clip: bool,
    exclude: bool,
    lr_in_momentum: bool,
) -> None:
    # as in _single_tensor_lars: lr enters the buffer (fold) or multiplies it on the way out (out)
    fold, out = (lr, 1.0) if lr_in_momentum and momentum != 0 else (1.0, lr)
    if not exclude:

        def ratios_fn(w_norm: Tensor, g_norm: Tensor) -> list[Tensor]:
            ratio = _lars_trust_ratio(
                w_norm,
                g_norm,
                lr=lr,
                weight_decay=weight_decay,
                trust_coefficient=trust_coefficient,
                eps=eps,
                trust_clip=trust_clip,
            )
            return [ratio * fold if lr_in_momentum and momentum != 0 else ratio]

        (ratios,) = stacked(ratios_fn, torch._foreach_norm(params), torch._foreach_norm(grads))
        if weight_decay != 0:
            grads = torch._foreach_add(grads, params, alpha=weight_decay)  # new list: p.grad untouched
            torch._foreach_mul_(grads, ratios)
        else:
            grads = torch._foreach_mul(grads, ratios)
    elif lr_in_momentum and momentum != 0:
        grads = torch._foreach_mul(grads, fold)  # new list: p.grad untouched
    if momentum != 0:
        torch._foreach_mul_(bufs, momentum)
        torch._foreach_add_(bufs, grads)
        if nesterov:
            grads = torch._foreach_add(grads, bufs, alpha=momentum)
        else:
            grads = bufs
    torch._foreach_add_(params, grads, alpha=-out)
