"""Single-process tests of GroupSyncBatchNorm against torch.nn.BatchNorm.

``MirrorReducer(k)`` stands for k ranks that all hold this rank's batch (the sum over the
group is k x the local sum), so a group of k ranks is checked against BatchNorm on the batch
repeated k times, without spawning processes. Real multi-rank tests: tests/distributed/test_sync_bn.py.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from largebatch.nn import (
    GroupReducer,
    GroupSyncBatchNorm,
    GroupSyncBatchNormAct,
    LocalReducer,
    convert_group_sync_batchnorm,
    process_group_reducer,
    resolve_group_size,
)

C = 6


class MirrorReducer:
    """k ranks holding identical batches: the group sum is k x the local tensor."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.calls = 0

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return tensor * self.size


def _init(bn: nn.Module) -> nn.Module:
    with torch.no_grad():
        bn.weight.copy_(torch.linspace(0.5, 1.5, C))
        bn.bias.copy_(torch.linspace(-0.2, 0.3, C))
    return bn


def _ref_bn(ndim: int, momentum: float | None) -> nn.Module:
    cls = nn.BatchNorm1d if ndim == 2 else nn.BatchNorm2d
    return _init(cls(C, momentum=momentum))


def _data(shape: tuple[int, ...], step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + step)
    x = torch.randn(shape, generator=g) * 2 + 0.5
    return x, torch.randn(shape, generator=g)


@pytest.mark.parametrize("group", [1, 3])
@pytest.mark.parametrize("momentum", [0.1, None])
@pytest.mark.parametrize("shape", [(5, C), (4, C, 3, 5)], ids=["2d", "4d"])
def test_train_matches_batchnorm(group: int, momentum: float | None, shape: tuple[int, ...]) -> None:
    reducer = MirrorReducer(group)
    bn = _init(GroupSyncBatchNorm(C, momentum=momentum, reducer=reducer))
    ref = _ref_bn(len(shape), momentum)
    for step in range(3):
        x, dy = _data(shape, step)
        xg = x.clone().requires_grad_()
        y = bn(xg)
        (y * dy).sum().backward()
        xr = x.repeat(group, *[1] * (len(shape) - 1)).requires_grad_()
        yr = ref(xr)
        (yr * dy.repeat(group, *[1] * (len(shape) - 1))).sum().backward()
        n = shape[0]
        torch.testing.assert_close(y, yr[:n], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(xg.grad, xr.grad[:n], rtol=1e-4, atol=1e-5)
        # weight/bias gradients are this rank's share: the group's gradient / group size here
        torch.testing.assert_close(bn.weight.grad * group, ref.weight.grad, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(bn.bias.grad * group, ref.bias.grad, rtol=1e-4, atol=1e-5)
        bn.zero_grad(), ref.zero_grad()
    torch.testing.assert_close(bn.running_mean, ref.running_mean)
    torch.testing.assert_close(bn.running_var, ref.running_var)
    assert int(bn.num_batches_tracked) == int(ref.num_batches_tracked) == 3
    # one packed collective in forward and one in backward, per step (none for a group of 1
    # would also be fine, but the layer does not special-case it)
    assert reducer.calls == 6


def test_generic_reductions_path_matches_batchnorm(monkeypatch: pytest.MonkeyPatch) -> None:
    """The plain-reduction statistics used on backends other than CPU/CUDA (XLA)."""
    from largebatch.nn import sync_bn

    monkeypatch.setattr(sync_bn, "_local_moments", sync_bn._summed_moments)
    test_train_matches_batchnorm(2, 0.1, (4, C, 3, 5))


def test_eval_uses_running_stats_without_collective() -> None:
    reducer = MirrorReducer(2)
    bn = _init(GroupSyncBatchNorm(C, reducer=reducer))
    ref = _ref_bn(4, 0.1)
    x, _ = _data((4, C, 3, 3), 0)
    bn(x), ref(x.repeat(2, 1, 1, 1))
    bn.eval(), ref.eval()
    calls = reducer.calls
    x, _ = _data((3, C, 3, 3), 1)
    torch.testing.assert_close(bn(x), ref(x))
    assert reducer.calls == calls


def test_no_running_stats_uses_batch_stats_in_eval() -> None:
    bn = _init(GroupSyncBatchNorm(C, track_running_stats=False)).eval()
    ref = _init(nn.BatchNorm2d(C, track_running_stats=False)).eval()
    x, _ = _data((4, C, 3, 3), 0)
    torch.testing.assert_close(bn(x), ref(x))


def test_bf16_autocast_keeps_fp32_statistics() -> None:
    torch.manual_seed(0)
    conv = nn.Conv2d(3, C, 3, padding=1)
    bn = _init(GroupSyncBatchNorm(C, reducer=MirrorReducer(2)))
    x = torch.randn(4, 3, 8, 8) * 3 + 1
    with torch.autocast("cpu", dtype=torch.bfloat16):
        h = conv(x)
        assert h.dtype == torch.bfloat16
        y = bn(h)
    assert y.dtype == torch.bfloat16
    assert bn.running_mean.dtype == torch.float32
    # reference: fp32 BatchNorm on exactly the bf16 values the layer saw
    ref = _ref_bn(4, 0.1)
    yr = ref(h.detach().float().repeat(2, 1, 1, 1))
    torch.testing.assert_close(bn.running_mean, ref.running_mean, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(bn.running_var, ref.running_var, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(y.float(), yr[:4], rtol=1e-2, atol=1e-2)
    y.float().sum().backward()
    assert conv.weight.grad is not None and torch.isfinite(conv.weight.grad).all()
    assert bn.weight.grad.dtype == torch.float32


def test_channels_last() -> None:
    bn = _init(GroupSyncBatchNorm(C, reducer=MirrorReducer(2)))
    ref = _ref_bn(4, 0.1)
    x, dy = _data((4, C, 5, 5), 0)
    x_cl = x.contiguous(memory_format=torch.channels_last).requires_grad_()
    y = bn(x_cl)
    assert y.is_contiguous(memory_format=torch.channels_last)
    (y * dy.contiguous(memory_format=torch.channels_last)).sum().backward()
    xr = x.repeat(2, 1, 1, 1).requires_grad_()
    yr = ref(xr)
    (yr * dy.repeat(2, 1, 1, 1)).sum().backward()
    torch.testing.assert_close(y, yr[:4], rtol=1e-5, atol=1e-5)
    assert x_cl.grad.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(x_cl.grad, xr.grad[:4], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(bn.running_var, ref.running_var)


def test_single_value_per_channel_is_rejected_locally() -> None:
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        GroupSyncBatchNorm(C)(torch.randn(1, C))
    # in a group the other ranks' values count: no error
    GroupSyncBatchNorm(C, reducer=MirrorReducer(2))(torch.randn(1, C))


def _small_model() -> nn.Module:
    from timm.layers import BatchNormAct2d

    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, C, 3, padding=1),
        nn.BatchNorm2d(C),
        nn.Conv2d(C, C, 3, padding=1),
        BatchNormAct2d(C, act_layer=nn.ReLU, momentum=None),
        nn.Sequential(nn.Flatten(), nn.LazyLinear(3)),
    )


def test_convert_copies_state_and_keeps_norm_act() -> None:
    model = _small_model()
    x = torch.randn(2, 3, 6, 6)
    model(x)  # materialize the lazy layer, move the running stats off their init
    ref = copy.deepcopy(model)
    converted = convert_group_sync_batchnorm(model, group_size=2, reducer=MirrorReducer(2))
    assert type(converted[1]) is GroupSyncBatchNorm
    assert type(converted[3]) is GroupSyncBatchNormAct
    assert isinstance(converted[3].act, nn.ReLU) and converted[3].momentum is None
    assert converted[1].group_size == 2
    for name, value in ref.state_dict().items():
        torch.testing.assert_close(converted.state_dict()[name], value, msg=name)
    x2 = torch.randn(3, 3, 6, 6)
    y = converted(x2)
    yr = ref(x2.repeat(2, 1, 1, 1))
    torch.testing.assert_close(y, yr[:3], rtol=1e-4, atol=1e-5)
    for name, value in ref.state_dict().items():
        torch.testing.assert_close(converted.state_dict()[name], value, msg=name)
    converted.eval(), ref.eval()
    torch.testing.assert_close(converted(x2), ref(x2), rtol=1e-5, atol=1e-5)
    copy.deepcopy(converted)  # EMA copies of the model must work


def test_convert_group_of_one_is_identity_and_checks_sizes() -> None:
    model = _small_model()
    assert convert_group_sync_batchnorm(model, group_size=1) is model
    assert convert_group_sync_batchnorm(model, group_size=-1) is model  # world of 1
    assert convert_group_sync_batchnorm(model, group_size=-1, reducer=LocalReducer()) is model
    # no process group, no XLA replicas: one line naming both ways to get several ranks
    with pytest.raises(ValueError, match=r"program is a single one \(world size 1\).*torchrun.*torch_xla.launch"):
        convert_group_sync_batchnorm(model, group_size=2)
    with pytest.raises(ValueError, match="must be positive"):
        convert_group_sync_batchnorm(model, group_size=-3)
    with pytest.raises(ValueError, match="does not match the reducer"):
        convert_group_sync_batchnorm(model, group_size=4, reducer=MirrorReducer(2))
    assert resolve_group_size(0, 8) == resolve_group_size(-1, 8) == 8
    with pytest.raises(ValueError, match="does not divide the world size 8"):
        resolve_group_size(3, 8)
    assert isinstance(process_group_reducer(1), LocalReducer)
    assert isinstance(MirrorReducer(2), GroupReducer) and isinstance(LocalReducer(), GroupReducer)


@pytest.mark.gpu
def test_cuda_matches_batchnorm_and_delegates_to_torch_sync_bn(tmp_path) -> None:
    """On CUDA: the collective-only layer matches BatchNorm (fp32 and bf16 autocast), and
    conversion with a process-group reducer hands over to torch.nn.SyncBatchNorm (timm's
    norm-act layers keep their activation)."""
    import torch.distributed as dist
    from timm.layers import BatchNormAct2d
    from timm.layers.norm_act import SyncBatchNormAct

    from largebatch.nn import ProcessGroupReducer

    device = torch.accelerator.current_accelerator()
    bn = _init(GroupSyncBatchNorm(C, reducer=MirrorReducer(2))).to(device)
    ref = _ref_bn(4, 0.1).to(device)
    x, dy = (t.to(device) for t in _data((4, C, 5, 5), 0))
    xg = x.clone().requires_grad_()
    (bn(xg) * dy).sum().backward()
    xr = x.repeat(2, 1, 1, 1).requires_grad_()
    (ref(xr) * dy.repeat(2, 1, 1, 1)).sum().backward()
    torch.testing.assert_close(xg.grad, xr.grad[:4], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(bn.running_var, ref.running_var)
    with torch.autocast(device.type, dtype=torch.bfloat16):
        y = bn(x.bfloat16())
    assert y.dtype == torch.bfloat16 and bn.running_mean.dtype == torch.float32

    dist.init_process_group("nccl", init_method=f"file://{tmp_path}/rdv", rank=0, world_size=1)
    try:
        model = nn.Sequential(nn.Conv2d(3, C, 3), nn.BatchNorm2d(C), BatchNormAct2d(C)).to(device)
        reducer = ProcessGroupReducer(None)
        # one GPU gives a world of one; pretend a group of 2 to reach the dispatch
        reducer.size = 2
        converted = convert_group_sync_batchnorm(model, group_size=2, reducer=reducer)
        assert type(converted[1]) is nn.SyncBatchNorm
        assert type(converted[2]) is SyncBatchNormAct and isinstance(converted[2].act, nn.ReLU)
        out = converted(torch.randn(2, 3, 8, 8, device=device))
        assert out.min() >= 0  # the activation still runs
        kept = convert_group_sync_batchnorm(
            _small_model().to(device), group_size=2, reducer=reducer, use_torch_sync_bn_on_cuda=False
        )
        assert type(kept[1]) is GroupSyncBatchNorm
    finally:
        dist.destroy_process_group()
