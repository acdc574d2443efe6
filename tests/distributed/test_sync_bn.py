"""GroupSyncBatchNorm on 4 real gloo ranks equals BatchNorm on each group's concatenated batch.

All scenarios run in one spawn of 4 ranks (module fixture); the parent regenerates every
rank's data from its seed and computes the references with torch.nn.BatchNorm.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from tests.distributed.harness import run_ranks

WORLD = 4
C = 6
# name -> group size, per-rank batch sizes, spatial dims (() = (N, C) input), momentum,
# channels_last
SCENARIOS = {
    "group2": (2, [4, 4, 4, 4], (5, 5), 0.1, False),
    "group1": (1, [3, 3, 3, 3], (4, 4), 0.1, False),
    "group4_cumulative": (4, [2, 3, 2, 3], (4, 4), None, False),
    "group2_uneven_empty": (2, [1, 5, 0, 3], (3, 3), 0.1, False),
    "world_uneven_empty_channels_last": (-1, [2, 0, 5, 1], (3, 4), 0.1, True),
    "group2_2d": (2, [3, 5, 4, 4], (), 0.1, False),
}
STEPS = 3

# the module's ranks are one fixture: its tests run on one worker, where it is computed once
pytestmark = pytest.mark.xdist_group("sync_bn")


class CountingReducer:
    """Wraps a reducer and counts its collectives."""

    def __init__(self, inner) -> None:
        self.inner, self.size, self.calls = inner, inner.size, 0

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.inner.all_reduce_sum(tensor)


def _data(name: str, step: int, rank: int, batch: int, spatial: tuple[int, ...]):
    seed = 1000 * list(SCENARIOS).index(name) + 10 * step + rank
    g = torch.Generator().manual_seed(seed)
    shape = (batch, C, *spatial)
    return torch.randn(shape, generator=g) * 1.5 + 0.3, torch.randn(shape, generator=g)


def _init(bn: nn.Module) -> nn.Module:
    with torch.no_grad():
        bn.weight.copy_(torch.linspace(0.5, 1.5, C))
        bn.bias.copy_(torch.linspace(-0.2, 0.3, C))
    return bn


def _run_scenario(name: str, rank: int) -> dict:
    from largebatch.nn import GroupSyncBatchNorm, process_group_reducer

    group, batches, spatial, momentum, channels_last = SCENARIOS[name]
    reducer = CountingReducer(process_group_reducer(group))
    bn = _init(GroupSyncBatchNorm(C, momentum=momentum, reducer=reducer))
    out: dict = {"y": [], "dx": [], "dw": [], "db": []}
    for step in range(STEPS):
        x, dy = _data(name, step, rank, batches[rank], spatial)
        if channels_last:
            x, dy = (t.contiguous(memory_format=torch.channels_last) for t in (x, dy))
        x.requires_grad_()
        y = bn(x)
        (y * dy).sum().backward()
        if channels_last:
            assert y.is_contiguous(memory_format=torch.channels_last)
        out["y"].append(y.detach()), out["dx"].append(x.grad)
        out["dw"].append(bn.weight.grad.clone()), out["db"].append(bn.bias.grad.clone())
        bn.zero_grad()
    out["calls"] = reducer.calls
    out["running"] = (bn.running_mean.clone(), bn.running_var.clone(), int(bn.num_batches_tracked))
    bn.eval()
    out["eval_y"] = bn(x.detach())
    out["eval_calls"] = reducer.calls - out["calls"]
    return out


def _timm_input(rank: int) -> torch.Tensor:
    return torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(50 + rank))


def _timm_model() -> nn.Module:
    import timm

    torch.manual_seed(0)
    return timm.create_model("resnet10t", num_classes=5)


def _run_timm(rank: int) -> dict:
    from largebatch.nn import GroupSyncBatchNorm, convert_group_sync_batchnorm, rank_subgroup

    subgroup = rank_subgroup(2)  # created by the scenarios above: must be the cached one
    model = convert_group_sync_batchnorm(_timm_model(), group_size=2).train()
    assert rank_subgroup(2) is subgroup
    n_bn = sum(isinstance(m, GroupSyncBatchNorm) for m in model.modules())
    ema = copy.deepcopy(model)  # model EMA copies must work
    out = model(_timm_input(rank))
    out.sum().backward()
    stats = {k: v for k, v in model.state_dict().items() if "running" in k}
    return {"out": out.detach(), "stats": stats, "n_bn": n_bn, "ema_reducer_shared": ema.bn1.reducer is model.bn1.reducer}


def _worker(rank: int, world_size: int) -> dict:
    from largebatch.nn import process_group_reducer

    results = {name: _run_scenario(name, rank) for name in SCENARIOS}
    try:
        process_group_reducer(3)
        results["error"] = None
    except ValueError as exc:
        results["error"] = str(exc)
    results["timm"] = _run_timm(rank)
    return results


@pytest.fixture(scope="module")
def rank_results() -> list[dict]:
    return run_ranks(_worker, WORLD, fork=True)


def _groups(group: int) -> list[list[int]]:
    group = WORLD if group in (-1, 0) else group
    return [list(range(s, s + group)) for s in range(0, WORLD, group)]


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_matches_batchnorm_on_group_batch(rank_results: list[dict], name: str) -> None:
    group, batches, spatial, momentum, _ = SCENARIOS[name]
    for ranks in _groups(group):
        ref = _init((nn.BatchNorm1d if not spatial else nn.BatchNorm2d)(C, momentum=momentum))
        for step in range(STEPS):
            data = [_data(name, step, r, batches[r], spatial) for r in ranks]
            x = torch.cat([d[0] for d in data]).requires_grad_()
            y = ref(x)
            (y * torch.cat([d[1] for d in data])).sum().backward()
            start = 0
            for r in ranks:
                res, stop = rank_results[r][name], start + batches[r]
                torch.testing.assert_close(res["y"][step], y[start:stop], rtol=1e-5, atol=1e-5)
                torch.testing.assert_close(res["dx"][step], x.grad[start:stop], rtol=1e-4, atol=1e-5)
                start = stop
            # weight/bias gradients are each rank's share; the group's sum is BatchNorm's
            dw = sum(rank_results[r][name]["dw"][step] for r in ranks)
            db = sum(rank_results[r][name]["db"][step] for r in ranks)
            torch.testing.assert_close(dw, ref.weight.grad, rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(db, ref.bias.grad, rtol=1e-4, atol=1e-5)
            ref.zero_grad()
        ref.eval()
        for r in ranks:
            mean, var, tracked = rank_results[r][name]["running"]
            torch.testing.assert_close(mean, ref.running_mean)
            torch.testing.assert_close(var, ref.running_var)
            assert tracked == STEPS
            x_last = _data(name, STEPS - 1, r, batches[r], spatial)[0]
            torch.testing.assert_close(rank_results[r][name]["eval_y"], ref(x_last), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_one_collective_each_way_per_step(rank_results: list[dict], name: str) -> None:
    for res in rank_results:
        assert res[name]["calls"] == 2 * STEPS  # also on the empty rank
        assert res[name]["eval_calls"] == 0


def test_undivisible_group_size_is_a_clear_error(rank_results: list[dict]) -> None:
    for res in rank_results:
        assert "group_size 3 does not divide the world size 4" in res["error"]


def test_timm_model_converted_matches_group_batch(rank_results: list[dict]) -> None:
    res = [r["timm"] for r in rank_results]
    assert all(r["n_bn"] > 0 and r["ema_reducer_shared"] for r in res)
    for ranks in _groups(2):
        ref = _timm_model().train()
        out = ref(torch.cat([_timm_input(r) for r in ranks]))
        stats = {k: v for k, v in ref.state_dict().items() if "running" in k}
        for i, r in enumerate(ranks):
            assert torch.isfinite(res[r]["out"]).all()
            torch.testing.assert_close(res[r]["out"], out[2 * i : 2 * i + 2], rtol=1e-4, atol=1e-4)
            for k, v in stats.items():
                torch.testing.assert_close(res[r]["stats"][k], v, rtol=1e-4, atol=1e-5, msg=k)
                # identical across the group (same all-reduce result on every rank)
                assert torch.equal(res[r]["stats"][k], res[ranks[0]]["stats"][k]), k
    # different groups saw different data
    assert not torch.equal(res[0]["stats"]["bn1.running_mean"], res[2]["stats"]["bn1.running_mean"])
