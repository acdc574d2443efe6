"""LAMB: layer-wise adaptive moments for large-batch training.

Based on You et al. 2019, "Large Batch Optimization for Deep Learning: Training BERT in 76 minutes"
(arXiv 1904.00962), Algorithm 2: Adam moments with bias correction, weight decay added to the Adam
direction (decoupled from the moments, as in AdamW), and a per-tensor trust ratio ``||w|| / ||update||``;
``trust_clip=True`` caps the ratio at 1 (LAMBC, timm's ``lambc``). Unlike timm's ``Lamb`` and apex's
``FusedLAMB`` there is no gradient clipping inside the optimizer: clip in the training loop if you want
it, once.

Two implementations of the same update, chosen by ``foreach``:

* ``_single_tensor_lamb``: one tensor at a time (cache-hot), the default on CPU where the step is
  memory-bound.
* ``_multi_tensor_lamb``: ``torch._foreach_*`` over a group, the default on CUDA/XLA (launch-bound).

No host reads and no Python branch on a tensor value inside ``step()``: the trust ratio uses
``torch.where`` on the device, so the step runs unchanged on XLA.

The step count is a 0-dim tensor per parameter, but the bias corrections are one 0-dim tensor per group
whenever its counts are equal (always, unless some tensors skipped steps or a checkpoint says otherwise):
torch's multi-tensor fast path needs every list of a ``torch._foreach_*`` call to match the tensors
position by position (ATen/native/ForeachUtils.h ``check_fast_path_restrictions``), so a list of 0-dim
tensors beside full-size ones runs one kernel per tensor, while a single 0-dim tensor (the ``.Tensor``
overloads) keeps one launch per call: on resnet50's 161 tensors a step makes 101 launches against 421
with lists (tests/test_foreach_launches.py). Whether the counts are equal is kept on the host
(:class:`_StepCohorts`), where they are known: when state is created, when a step leaves tensors out, when
a checkpoint is loaded.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Optional, Union

import torch
from torch import Tensor

from largebatch.errors import UsageError
from .layerwise import LayerwiseOptimizer, sq_norm, stacked, use_foreach
from .timm_names import LAMB_TIMM_NAMES

__all__ = ["LAMB", "lamb"]

# a bias-correction term: one 0-dim tensor for the whole group (its step counts are equal) or one per tensor
_Correction = Union[Tensor, list[Tensor]]


class LAMB(LayerwiseOptimizer):
    """LAMB for PyTorch.

    Paper: You et al. 2019, "Large Batch Optimization for Deep Learning: Training BERT in 76 minutes",
    arXiv 1904.00962.

    For each tensor ``w`` with gradient ``g``, at step ``t`` (per tensor, from 1)::

        m = beta1 * m + (1 - beta1) * g
        v = beta2 * v + (1 - beta2) * g * g
        u = (m / (1 - beta1 ** t)) / (sqrt(v / (1 - beta2 ** t)) + eps) + weight_decay * w
        ratio = ||w|| / ||u||                              (1 if ||w|| or ||u|| is 0)
        ratio = min(ratio, 1)                              (only with trust_clip: LAMBC)
        w = w - lr * ratio * u

    A complex parameter is optimised as its real view (``torch.view_as_real``), as torch's Adam does: its
    real and imaginary parts are separate coordinates of ``m``, ``v`` and the norms.

    A group with ``lars_exclude=True`` (BN and bias parameters, see :func:`largebatch.optim.param_groups`)
    gets the plain Adam update ``w = w - lr * u`` without the decay term (its ``weight_decay`` is ignored)
    and without the trust ratio. Exclusion is this explicit flag: a non-excluded group with
    ``weight_decay=0`` still gets the trust ratio.

    Args:
        params: iterable of parameters or of dicts defining parameter groups; a group may set
            ``lars_exclude`` (default: False).
        lr: learning rate (default: 1e-3).
        betas: coefficients of the running averages of the gradient and its square (default: (0.9, 0.999)).
        eps: added to the denominator of the Adam direction (default: 1e-6).
        weight_decay: decoupled weight decay, added to the Adam direction (default: 0.01).
        trust_clip: LAMBC, the trust ratio capped at 1 (timm's ``trust_clip``) (default: False).
        foreach: True for the multi-tensor path, False for the per-tensor path, None to pick the faster for
            the device (multi-tensor off CPU, per-tensor on CPU) (default: None).
        **timm_options: timm's ``Lamb`` names with our meaning, here and in param groups:
            ``always_adapt=True``, ``max_grad_norm=None``, ``bias_correction=True`` (what ours does); other
            values are refused with what to use instead (see :mod:`largebatch.optim.timm_names`).
    """

    timm_names = LAMB_TIMM_NAMES
    backfill = {"trust_clip": False, "lars_exclude": False, "foreach": None}  # what LAMB did before them

    def __init__(
        self,
        params: Iterable[Tensor] | Iterable[dict[str, Any]],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.01,
        *,
        trust_clip: bool = False,
        foreach: Optional[bool] = None,
        **timm_options: Any,
    ) -> None:
        self.our_options(timm_options)  # timm's names that mean what LAMB does; anything else raises
        defaults = dict(
            lr=lr,
            betas=tuple(betas),
            eps=eps,
            weight_decay=weight_decay,
            trust_clip=trust_clip,
            lars_exclude=False,
            foreach=foreach,
        )
        super().__init__(params, defaults)
        self._cohorts = _StepCohorts()

    @staticmethod
    def check_group(group: dict[str, Any], where: str) -> None:
        LayerwiseOptimizer.check_group(group, where)  # lr, weight_decay
        betas = group["betas"]
        if len(betas) != 2 or not all(0.0 <= b < 1.0 for b in betas):
            raise UsageError(f"{where}: invalid betas {betas!r}, must be two values in [0, 1)")
        if not group["eps"] > 0.0:
            raise UsageError(f"{where}: invalid eps {group['eps']!r}, must be > 0")

    def __setstate__(self, state: dict[str, Any]) -> None:
        """As torch's (``load_state_dict`` and unpickling come here), then the step counts are made
        tensors on their parameters' devices and read once, to know which are equal (see
        :class:`_StepCohorts`): a host read at load time, none in ``step()``."""
        super().__setstate__(state)
        steps = {}
        for p, state in self.state.items():
            step = state.get("step")
            if step is not None:  # a Python int before the step count became a tensor
                state["step"] = steps[p] = _step_tensor(p, step)
        self._cohorts = _StepCohorts.of_counts(steps)

    def update_group(self, group: dict[str, Any], params: list[Tensor], grads: list[Tensor]) -> None:
        tensors: list[tuple[Tensor, ...]] = []  # (w, g, m, v) per parameter
        steps: list[Tensor] = []
        new: list[Tensor] = []
        for p, g in zip(params, grads):
            state = self.state[p]
            if not state:
                # a tensor on the parameter's device, as torch's Adam with capturable=True: a Python
                # number would be guarded on by torch.compile (a recompile every step), and the bias
                # corrections computed from it stay on the device without a host read
                state["step"] = _step_tensor(p, 0)
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                new.append(p)
            four = (p, g, state["exp_avg"], state["exp_avg_sq"])
            if torch.is_complex(p):
                # as torch's Adam: real and imaginary parts are two coordinates (g * g would be complex)
                four = tuple(torch.view_as_real(t) for t in four)
            tensors.append(four)
            steps.append(state["step"])
        if new:
            self._cohorts.start(new)
        steps_equal = self._cohorts.step(params)
        torch._foreach_add_(steps, 1)
        ws, gs, exp_avgs, exp_avg_sqs = (list(column) for column in zip(*tensors))
        beta1, beta2 = group["betas"]
        lamb(
            ws,
            gs,
            exp_avgs,
            exp_avg_sqs,
            steps,
            lr=group["lr"],
            beta1=beta1,
            beta2=beta2,
            eps=group["eps"],
            weight_decay=group["weight_decay"],
            trust_clip=group["trust_clip"],
            exclude=group["lars_exclude"],
            foreach=group["foreach"],
            steps_equal=steps_equal,
        )


class _StepCohorts:
    """Which parameters' step counts are equal, known on the host so that ``step()`` reads no tensor.

    Each parameter with state carries a cohort label, and parameters with one label have one count.
    Labels are made where the counts are known: when state is created (count 0, one label for the tensors
    that start together), when a checkpoint is loaded (one label per count read), and when a step leaves
    some of a cohort out (no gradient): the stepped ones then count one more, and get a label of their
    own. A label never changes as the counts go up, so a compiled ``step()`` that reads them is not
    recompiled step after step. A parameter whose state came another way (written into ``state`` by
    hand) has no label: it is taken as a cohort of its own, the safe side.
    """

    def __init__(self) -> None:
        self._label: dict[Tensor, int] = {}
        self._size: dict[int, int] = {}  # how many parameters carry each label
        self._made = 0

    @classmethod
    def of_counts(cls, steps: Mapping[Tensor, Tensor]) -> _StepCohorts:
        """Cohorts of loaded state, one per distinct count: one host read per device and dtype."""
        cohorts = cls()
        kinds: dict[tuple[torch.device, torch.dtype], list[Tensor]] = {}
        for p, step in steps.items():
            kinds.setdefault((step.device, step.dtype), []).append(p)
        by_count: dict[float, list[Tensor]] = {}
        for params in kinds.values():
            for p, count in zip(params, torch.stack([steps[p] for p in params]).tolist()):
                by_count.setdefault(count, []).append(p)
        for members in by_count.values():
            cohorts.start(members)
        return cohorts

    def start(self, params: list[Tensor]) -> None:
        """``params`` have new state (count 0): one cohort."""
        self._assign(params, self._new_label())

    def step(self, params: list[Tensor]) -> bool:
        """Record that ``params`` take a step together; whether their counts were (and stay) all equal."""
        stepped: dict[int, list[Tensor]] = {}  # label -> its members stepped now
        for p in params:
            if p not in self._label:  # state this class has not seen made: a cohort of its own
                self.start([p])
            stepped.setdefault(self._label[p], []).append(p)
        for label, members in stepped.items():
            if len(members) != self._size[label]:  # some of the cohort stayed behind
                self._assign(members, self._new_label())
        return len(stepped) == 1

    def _new_label(self) -> int:
        self._made += 1
        return self._made

    def _assign(self, params: list[Tensor], label: int) -> None:
        for p in params:
            old = self._label.get(p)
            if old is not None:
                self._size[old] -= 1
                if not self._size[old]:
                    del self._size[old]
            self._label[p] = label
        self._size[label] = self._size.get(label, 0) + len(params)


def lamb(
    params: list[Tensor],
    grads: list[Tensor],
    exp_avgs: list[Tensor],
    exp_avg_sqs: list[Tensor],
    steps: list[Tensor],
    *,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
    exclude: bool,
    trust_clip: bool = False,
    foreach: Optional[bool] = None,
    steps_equal: bool = False,
) -> None:
    """Functional LAMB update of one parameter group, in place; see :class:`LAMB` for the rule.

    ``steps`` holds each tensor's step number as a 0-dim floating tensor on its device, already counting
    this step. Gradients are not modified. Tensors are real: pass a complex parameter and its state as
    ``torch.view_as_real`` views.

    ``steps_equal=True`` says the step numbers are all equal (the caller knows it on the host; nothing here
    reads them): the bias corrections are then computed once, from ``steps[0]``, and the multi-tensor path
    applies them as one 0-dim tensor, which keeps torch's foreach fast path (one launch per call instead of
    one per tensor). With False they are computed per tensor.
    """
    func = _multi_tensor_lamb if use_foreach(foreach, params) else _single_tensor_lamb
    func(
        params,
        grads,
        exp_avgs,
        exp_avg_sqs,
        steps,
        lr=lr,
        beta1=beta1,
        beta2=beta2,
        eps=eps,
        weight_decay=weight_decay,
        trust_clip=trust_clip,
        exclude=exclude,
        steps_equal=steps_equal,
    )


def _step_tensor(p: Tensor, step: Any) -> Tensor:
    """The step count of ``p`` as a 0-dim tensor on its device, float32 (float64 for float64 parameters)."""
    dtype = torch.promote_types(p.dtype.to_real(), torch.float32)
    if torch.is_tensor(step):
        return step.to(device=p.device, dtype=dtype)
    # a fill on the device: torch.tensor(x, device=...) copies from a pageable host buffer, a
    # blocking copy (a sync) on CUDA in the first step()
    return torch.full((), float(step), dtype=dtype, device=p.device)


def _bias_corrections(
    steps: list[Tensor], beta1: float, beta2: float, eps: float, lr: float, steps_equal: bool
) -> tuple[_Correction, _Correction, _Correction]:
    """0-dim (scale, eps', -lr * scale), where m_hat / (sqrt(v_hat) + eps) equals scale * m / (sqrt(v) + eps'):
    one of each for the group where its steps are equal (and of one dtype and device), else one per tensor.

    Folding the bias corrections into scalars saves two passes over every tensor; they are computed on the
    device from the step tensors, a handful of ops per group.
    """

    def fn(t: Tensor) -> list[Tensor]:
        bc2_sqrt = torch.sqrt(1.0 - beta2**t)
        scale = bc2_sqrt / (1.0 - beta1**t)
        return [scale, eps * bc2_sqrt, -lr * scale]

    first = steps[0]
    if steps_equal and all(t.dtype == first.dtype and t.device == first.device for t in steps):
        scale, eps_t, neg_step = fn(first)
        return scale, eps_t, neg_step
    scales, eps_ts, neg_steps = stacked(fn, steps)
    return scales, eps_ts, neg_steps


def _per_tensor(value: _Correction, n: int) -> list[Tensor]:
    """``value`` for each of ``n`` tensors."""
    return [value] * n if isinstance(value, Tensor) else value


def _lamb_step_size(w_sq: Tensor, u_sq: Tensor, lr: float, unit: float | Tensor, trust_clip: bool) -> Tensor:
    """-lr * trust ratio * unit, for an update stored as ``u_stored`` with ``u = unit * u_stored`` (unit > 0).

    ratio = ||w|| / ||u|| applied to u equals sqrt(w_sq / u_sq) applied to u_stored (``unit`` cancels);
    LAMBC's min(ratio, 1) is then min(sqrt(w_sq / u_sq), unit). Where a norm is 0 the ratio is 1 and the
    step is -lr * unit on u_stored.
    """
    ratio_unit = torch.sqrt(w_sq / u_sq)
    if trust_clip:
        ratio_unit = torch.clamp(ratio_unit, max=unit)
    return torch.where(torch.minimum(w_sq, u_sq) > 0, ratio_unit * -lr, -lr * unit)


def _single_tensor_lamb(
    params: list[Tensor],
    grads: list[Tensor],
    exp_avgs: list[Tensor],
    exp_avg_sqs: list[Tensor],
    steps: list[Tensor],
    *,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
    exclude: bool,
    trust_clip: bool,
    steps_equal: bool,
) -> None:
    corrections = _bias_corrections(steps, beta1, beta2, eps, lr, steps_equal)
    scales, eps_ts, neg_steps = (_per_tensor(c, len(params)) for c in corrections)
    for p, g, m, v, scale, eps_t, neg_step in zip(params, grads, exp_avgs, exp_avg_sqs, scales, eps_ts, neg_steps):
        m.lerp_(g, 1.0 - beta1)
        v.mul_(beta2).addcmul_(g, g, value=1.0 - beta2)
        denom = v.sqrt()
        if exclude:
            p.addcmul_(torch.div(m, denom.add_(eps_t), out=denom), neg_step)
            continue
        if weight_decay != 0:
            # u = scale * m / denom + wd * w = wd * (w + m / (denom * wd / scale)) = wd * u_stored, with
            # denom * wd / scale in one pass and u_stored in one more, written over denom
            k = weight_decay / scale
            torch.addcmul(eps_t * k, denom, k, out=denom)
            u = torch.addcdiv(p, m, denom, out=denom)
            unit: float | Tensor = weight_decay
        else:
            u = torch.div(m, denom.add_(eps_t), out=denom)
            unit = scale
        p.addcmul_(u, _lamb_step_size(sq_norm(p), sq_norm(u), lr, unit, trust_clip))


def _multi_tensor_lamb(
    params: list[Tensor],
    grads: list[Tensor],
    exp_avgs: list[Tensor],
    exp_avg_sqs: list[Tensor],
    steps: list[Tensor],
    *,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
    exclude: bool,
    trust_clip: bool,
    steps_equal: bool,
) -> None:
    # each correction a 0-dim tensor (foreach's .Tensor overloads: one launch) or a list of them (one per tensor)
    scales, eps_ts, neg_steps = _bias_corrections(steps, beta1, beta2, eps, lr, steps_equal)
    torch._foreach_lerp_(exp_avgs, grads, 1.0 - beta1)
    torch._foreach_mul_(exp_avg_sqs, beta2)
    torch._foreach_addcmul_(exp_avg_sqs, grads, grads, value=1.0 - beta2)
    denoms = torch._foreach_sqrt(exp_avg_sqs)
    # alpha= picks the .Tensor overload for one 0-dim tensor: without it torch's argument parser binds a
    # 0-dim tensor to the .Scalar overload, a host read (a sync on CUDA) every step
    torch._foreach_add_(denoms, eps_ts, alpha=1)
    if exclude:
        updates = torch._foreach_div(exp_avgs, denoms)
        torch._foreach_mul_(updates, neg_steps)
        torch._foreach_add_(params, updates)
        return
    updates = torch._foreach_div(exp_avgs, denoms)
    torch._foreach_mul_(updates, scales)
    if weight_decay != 0:
        torch._foreach_add_(updates, params, alpha=weight_decay)

    def step_size_fn(w_norm: Tensor, u_norm: Tensor) -> list[Tensor]:
        return [_lamb_step_size(w_norm.square(), u_norm.square(), lr, 1.0, trust_clip)]

    (step_sizes,) = stacked(step_size_fn, torch._foreach_norm(params), torch._foreach_norm(updates))
    torch._foreach_addcmul_(params, updates, step_sizes)
