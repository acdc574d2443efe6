"""Grouped synchronized BatchNorm: BN statistics over the batch of a group of ranks.

Based on the distributed batch normalization of Ying et al. 2018, *Image Classification at
Supercomputer Scale* (arXiv 1811.06992, section "Distributed batch normalization"), and
Wongpanich et al. 2020, *Training EfficientNets at Supercomputer Scale* (arXiv 2011.00071),
which tunes the group size. Every rank normalizes with the mean and variance of the
concatenated batch of its group of ``group_size`` consecutive ranks
(ranks ``[0..g-1], [g..2g-1], ...``): ``group_size=1`` is local BN, ``group_size=world`` is
global BN.

The only communication is a sum all-reduce over the group, behind the small
:class:`GroupReducer` protocol, so the same layer runs on gloo, NCCL and XLA. Training costs
one packed all-reduce per layer in forward (``[sum x, sum x^2, count]``) and one in backward
(``[sum dy, sum dy * (x - mean)]``); statistics are kept in fp32 even for bf16/fp16 input.

Example::

    import timm, torch.distributed as dist
    from largebatch.nn import convert_group_sync_batchnorm

    dist.init_process_group("gloo")              # or nccl, or via largebatch.backends
    model = timm.create_model("resnet50")
    model = convert_group_sync_batchnorm(model, group_size=4)   # BN over 4-rank groups
    loss = model(images).sum(); loss.backward()  # every rank must run forward and backward

Inside ``torch_xla.launch`` without a process group, the same call groups the XLA replicas
(:func:`default_group_reducer`). With a custom backend, pass any object with ``size`` and
``all_reduce_sum(tensor)``::

    model = convert_group_sync_batchnorm(model, group_size=2, reducer=my_reducer)
"""

from __future__ import annotations

from typing import Callable, Optional, TypeVar

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.nn.modules.batchnorm import _BatchNorm

from largebatch.comm.reducers import (  # noqa: F401  (re-exported: largebatch.nn's public names)
    GroupReducer,
    LocalReducer,
    ProcessGroupReducer,
    default_group_reducer,
    destroy_process_groups,
    process_group_reducer,
    rank_subgroup,
    release_subgroups,
    resolve_group_size,
)
from largebatch.errors import UsageError

__all__ = [
    "GroupReducer",
    "LocalReducer",
    "ProcessGroupReducer",
    "resolve_group_size",
    "rank_subgroup",
    "release_subgroups",
    "destroy_process_groups",
    "process_group_reducer",
    "default_group_reducer",
    "GroupSyncBatchNorm",
    "GroupSyncBatchNormAct",
    "convert_group_sync_batchnorm",
    "convert_torch_sync_batchnorm",
]


# --------------------------------------------------------------------------- autograd
def _channel_sum(t: Tensor) -> Tensor:
    """Sum over every dim except dim 1 (channels)."""
    return t.sum([0, *range(2, t.dim())])


def _fused_moments(x: Tensor) -> tuple[Tensor, Tensor]:
    """Per-channel (sum, sum of squares) by one fused kernel (CPU, CUDA), centred locally."""
    count = x.numel() // x.shape[1]
    mean, var = torch.batch_norm_update_stats(x, None, None, 0.0)
    return mean * count, (var + mean * mean) * count


def _summed_moments(x: Tensor) -> tuple[Tensor, Tensor]:
    """Per-channel (sum, sum of squares) by plain reductions (XLA fuses these itself)."""
    return _channel_sum(x), _channel_sum(x * x)


def _local_moments(x: Tensor) -> tuple[Tensor, Tensor]:
    """Per-channel (sum, sum of squares) of a non-empty ``x`` in its (fp32 or wider) dtype."""
    return _fused_moments(x) if x.is_cpu or x.is_cuda else _summed_moments(x)


class _GroupBatchNormFunction(torch.autograd.Function):
    """Training-mode BN over a reducer's group: y = (x - mean) * invstd * weight + bias.

    Returns ``(y, mean, biased_var, count)`` with the group statistics (non-differentiable).
    Weight and bias gradients are local sums (data-parallel gradient averaging adds them up);
    the input gradient accounts for the whole group's batch.
    """

    @staticmethod
    def forward(ctx, x, weight, bias, eps, reducer):  # type: ignore[override]
        channels = x.shape[1]
        stat_dtype = torch.promote_types(x.dtype, torch.float32)
        count_local = x.numel() // channels
        if count_local > 0:
            local = torch.cat(_local_moments(x.to(stat_dtype)))
        else:  # an empty rank still joins the collective
            local = x.new_zeros(2 * channels, dtype=stat_dtype)
        packed = torch.cat([local, local.new_full((1,), float(count_local))])
        packed = reducer.all_reduce_sum(packed)  # [sum x, sum x^2, count] over the group
        count = packed[2 * channels :]
        n = count.clamp(min=1.0)
        mean = packed[:channels] / n
        var = (packed[channels : 2 * channels] / n - mean * mean).clamp(min=0.0)

        if count_local > 0:
            # Inference-mode batch_norm with the group statistics: one fused, layout-aware
            # kernel that keeps the input dtype (bf16 in, bf16 out; statistics stay fp32).
            w32 = weight.to(stat_dtype) if weight is not None else None
            b32 = bias.to(stat_dtype) if bias is not None else None
            y = torch.nn.functional.batch_norm(x, mean, var, w32, b32, False, 0.0, eps)
        else:
            y = torch.empty_like(x)
        ctx.save_for_backward(x, weight, mean, torch.rsqrt(var + eps), n)
        ctx.reducer = reducer
        ctx.mark_non_differentiable(mean, var, count)
        return y, mean, var, count

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_y, _grad_mean, _grad_var, _grad_count):  # type: ignore[override]
        x, weight, mean, invstd, n = ctx.saved_tensors
        channels, stat_dtype = x.shape[1], mean.dtype
        if x.numel() > 0:
            x32, dy32 = x.to(stat_dtype), grad_y.to(stat_dtype)
            # BN backward with the group statistics as the saved ones gives the local
            # (sum dy * xhat, sum dy) in one fused pass (its local grad_input is not wanted;
            # CUDA's kernel needs a weight, which these two sums do not depend on)
            _, sum_dy_xhat, sum_dy = torch.ops.aten.native_batch_norm_backward(
                dy32, x32, torch.ones_like(mean), None, None, mean, invstd, True, 0.0, [False, True, True]
            )
        else:
            sum_dy_xhat = sum_dy = mean.new_zeros(channels)

        grad_x = None
        if ctx.needs_input_grad[0]:
            # Group sums in one collective; every rank (also an empty one) joins it.
            group = ctx.reducer.all_reduce_sum(torch.cat([sum_dy, sum_dy_xhat]))
            if x.numel() > 0:
                # dx = w * invstd * (dy - mean(dy) - xhat * mean(dy * xhat)) = a dy + b x + c
                a = invstd if weight is None else invstd * weight.to(stat_dtype)
                b = -a * invstd * group[channels:] / n
                c = -a * group[:channels] / n - b * mean
                shape = (1, channels) + (1,) * (x.dim() - 2)
                grad_x = torch.addcmul(c.view(shape), x32, b.view(shape))
                grad_x = grad_x.addcmul_(dy32, a.view(shape)).to(x.dtype)
            else:
                grad_x = torch.empty_like(x)
        grad_w = grad_b = None
        if weight is not None and ctx.needs_input_grad[1]:
            grad_w = sum_dy_xhat.to(weight.dtype)
        if weight is not None and ctx.needs_input_grad[2]:
            grad_b = sum_dy.to(weight.dtype)
        return grad_x, grad_w, grad_b, None, None


# --------------------------------------------------------------------------- modules
class GroupSyncBatchNorm(_BatchNorm):
    """BatchNorm whose training statistics are those of a group of ranks' concatenated batch.

    Distributed BN of Ying et al. 2018, *Image Classification at Supercomputer Scale*
    (arXiv 1811.06992) and Wongpanich et al. 2020, *Training EfficientNets at Supercomputer
    Scale* (arXiv 2011.00071). Same semantics as :class:`torch.nn.BatchNorm2d` on the group's
    batch: running statistics use the unbiased group variance, ``momentum=None`` is a
    cumulative average. Eval mode with running statistics uses no collective. Input is
    ``(N, C, *)``; per-rank batches may differ, and may be empty (that rank still joins the
    collectives and must run backward too). Weight/bias gradients are this rank's share (sum
    them over the group, as data-parallel gradient averaging does, for the group's gradient).

    Args:
        num_features: channels C.
        eps: added to the variance (default 1e-5).
        momentum: running-statistics factor; ``None`` for a cumulative average (default 0.1).
        affine: learnable weight and bias (default True).
        track_running_stats: keep running mean/var (default True).
        reducer: the group's :class:`GroupReducer`; ``None`` is local BN (default None).
    """

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: Optional[float] = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
        reducer: Optional[GroupReducer] = None,
        device: Optional[torch.device] = None,
        dtype: Optional[torch.dtype] = None,
    ) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device=device, dtype=dtype)
        self.reducer: GroupReducer = reducer if reducer is not None else LocalReducer()

    @property
    def group_size(self) -> int:
        return self.reducer.size

    def _check_input_dim(self, input: Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected input of shape (N, C, *), got {input.dim()}D input")

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, group_size={self.group_size}"

    def forward(self, input: Tensor) -> Tensor:
        self._check_input_dim(input)
        use_batch_stats = self.training or self.running_mean is None
        if not use_batch_stats:
            return torch.nn.functional.batch_norm(
                input, self.running_mean, self.running_var, self.weight, self.bias, False, 0.0, self.eps
            )
        if self.reducer.size == 1 and input.numel() // input.shape[1] == 1:
            raise ValueError(f"Expected more than 1 value per channel when training, got input size {input.size()}")
        y, mean, var, count = _GroupBatchNormFunction.apply(input, self.weight, self.bias, self.eps, self.reducer)
        if self.training and self.track_running_stats:
            self._update_running_stats(mean, var, count)
        return y

    @torch.no_grad()
    def _update_running_stats(self, mean: Tensor, var: Tensor, count: Tensor) -> None:
        assert self.num_batches_tracked is not None
        assert self.running_mean is not None and self.running_var is not None  # track_running_stats
        self.num_batches_tracked.add_(1)
        if self.momentum is None:  # cumulative average; a tensor factor avoids a host sync
            factor: float | Tensor = 1.0 / self.num_batches_tracked.to(mean.dtype)
        else:
            factor = self.momentum
        unbiased = var * (count / (count - 1).clamp(min=1.0))
        self.running_mean.mul_(1 - factor).add_((mean * factor).to(self.running_mean.dtype))
        self.running_var.mul_(1 - factor).add_((unbiased * factor).to(self.running_var.dtype))


class GroupSyncBatchNormAct(GroupSyncBatchNorm):
    """:class:`GroupSyncBatchNorm` followed by ``drop`` then ``act``, like timm's
    ``BatchNormAct2d`` (``timm/layers/norm_act.py``), which it replaces on conversion.

    Args:
        act: activation module (default ``nn.Identity()``).
        drop: dropout/drop-block module applied before ``act`` (default ``nn.Identity()``).
        **kwargs: as :class:`GroupSyncBatchNorm`.
    """

    def __init__(self, num_features: int, *, act: Optional[nn.Module] = None, drop: Optional[nn.Module] = None, **kwargs) -> None:
        super().__init__(num_features, **kwargs)
        self.drop = drop if drop is not None else nn.Identity()
        self.act = act if act is not None else nn.Identity()

    def forward(self, input: Tensor) -> Tensor:
        return self.act(self.drop(super().forward(input)))


# --------------------------------------------------------------------------- conversion
def _is_norm_act(bn: nn.Module) -> bool:
    # timm's BatchNormAct2d / SyncBatchNormAct carry their activation as children.
    children = dict(bn.named_children())
    return "act" in children or "drop" in children


_Norm = TypeVar("_Norm", bound=_BatchNorm)


def _copy_state(src: _BatchNorm, dst: _Norm) -> _Norm:
    # Share the parameter and buffer objects, as torch's conversion does, so an optimizer
    # built before the conversion keeps pointing at the live tensors.
    if src.affine:
        dst.weight, dst.bias = src.weight, src.bias
    dst.running_mean, dst.running_var = src.running_mean, src.running_var
    dst.num_batches_tracked = src.num_batches_tracked
    dst.train(src.training)
    return dst


def _replace_batchnorms(module: nn.Module, make: Callable[[_BatchNorm], nn.Module]) -> nn.Module:
    out = make(module) if isinstance(module, _BatchNorm) else module
    for name, child in module.named_children():
        out.add_module(name, _replace_batchnorms(child, make))
    return out


def _on_cuda(module: nn.Module) -> bool:
    first: Tensor | None = next(iter(module.parameters()), None)
    if first is None:
        first = next(iter(module.buffers()), None)
    return first is not None and first.is_cuda


def convert_torch_sync_batchnorm(module: nn.Module, process_group: Optional[dist.ProcessGroup] = None) -> nn.Module:
    """:meth:`torch.nn.SyncBatchNorm.convert_sync_batchnorm` (CUDA only), keeping timm's
    ``BatchNormAct2d`` act/drop (torch's conversion would silently drop them): models with
    norm-act layers go through ``timm.layers.convert_sync_batchnorm``."""
    if any(isinstance(m, _BatchNorm) and _is_norm_act(m) for m in module.modules()):
        from timm.layers import convert_sync_batchnorm as timm_convert

        return timm_convert(module, process_group=process_group)
    return nn.SyncBatchNorm.convert_sync_batchnorm(module, process_group=process_group)


def convert_group_sync_batchnorm(
    module: nn.Module,
    group_size: int,
    reducer: Optional[GroupReducer] = None,
    *,
    use_torch_sync_bn_on_cuda: bool = True,
) -> nn.Module:
    """Replace every BatchNorm (``_BatchNorm``, incl. timm's ``BatchNormAct2d``) in
    ``module`` by a :class:`GroupSyncBatchNorm` over groups of ``group_size`` ranks.

    Parameters and buffers are carried over (shared). ``group_size=1`` returns ``module``
    unchanged; -1 or 0 means the whole world.

    Args:
        module: the model (converted in place where possible; use the return value).
        group_size: ranks per BN group; must divide the world size (``UsageError`` if not).
        reducer: the group's :class:`GroupReducer`; ``None`` takes the running program's
            (:func:`default_group_reducer`): the initialized torch.distributed world, or the
            XLA replicas of ``torch_xla.launch``.
        use_torch_sync_bn_on_cuda: when the model is on CUDA and the reducer is a
            :class:`ProcessGroupReducer`, use ``torch.nn.SyncBatchNorm`` (fused CUDA kernels)
            on the same process group instead (default True).
    """
    if reducer is None:
        reducer = default_group_reducer(group_size)
    elif group_size not in (-1, 0) and group_size != reducer.size:
        raise UsageError(f"group_size {group_size} does not match the reducer's group size {reducer.size}")
    if reducer.size == 1:
        return module
    if use_torch_sync_bn_on_cuda and isinstance(reducer, ProcessGroupReducer) and _on_cuda(module):
        return convert_torch_sync_batchnorm(module, process_group=reducer.process_group)  # gpu-only

    def make(bn: _BatchNorm) -> GroupSyncBatchNorm:
        cls = GroupSyncBatchNormAct if _is_norm_act(bn) else GroupSyncBatchNorm
        return _copy_state(bn, cls(bn.num_features, eps=bn.eps, momentum=bn.momentum, affine=bn.affine,
                                   track_running_stats=bn.track_running_stats, reducer=reducer, device=torch.device("meta")))

    return _replace_batchnorms(module, make)
