"""Comm hooks on 4 real gloo ranks, simulated as 2 nodes x 2 ranks.

One spawn runs every case (spawning costs seconds on 2 cores); the tests assert on its
results. Per case each rank: wraps the same small MLP in DDP with tiny buckets (several
buckets per backward, none a multiple of the world size, so padding is exercised), runs
backward on its own data, records gradients and counters, then trains a few SGD steps.
Spawning 4 ranks and DDP's first construction (it imports torch._dynamo) dominate the time.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from largebatch.comm import H100_LINKS, estimate_allreduce, make_comm_state, register_comm_hook
from largebatch.comm.topology import Topology, column_groups, grid_shape, row_groups
from tests.distributed.harness import run_ranks

WORLD = 4
RANKS_PER_NODE = 2

# name -> (algorithm, compress, ranks_per_node, torus_shape)
CASES: dict[str, tuple[str, str, int, tuple[int, int] | None]] = {
    f"{alg}/{comp}": (alg, comp, RANKS_PER_NODE, None)
    for alg in ("flat", "hierarchical", "torus2d")
    for comp in ("none", "fp16", "bf16")
}
CASES["torus2d-4x1/none"] = ("torus2d", "none", RANKS_PER_NODE, (4, 1))  # rows span nodes
CASES["torus2d-1x4/none"] = ("torus2d", "none", RANKS_PER_NODE, (1, 4))  # one column
CASES["hierarchical-1node/none"] = ("hierarchical", "none", 4, None)

# unit roundoff of the wire dtype
ROUNDOFF = {"none": 2.0**-24, "fp16": 2.0**-11, "bf16": 2.0**-8}

# the module's ranks are one fixture: its tests run on one worker, where it is computed once
pytestmark = pytest.mark.xdist_group("comm_hooks")


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(13, 7), torch.nn.Tanh(), torch.nn.Linear(7, 5))


def _batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(8, 13, generator=g), torch.randn(8, 5, generator=g)


def _flat_grads(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()])


def _errors() -> dict[str, str]:
    """Messages of the configuration errors, raised identically on every rank."""
    out = {}
    for name, kwargs in {
        "indivisible": dict(algorithm="hierarchical", ranks_per_node=3),
        "bad_shape": dict(algorithm="torus2d", ranks_per_node=2, torus_shape=(3, 1)),
        "no_topology": dict(algorithm="hierarchical"),
        "shape_not_torus": dict(algorithm="flat", torus_shape=(2, 2)),
    }.items():
        try:
            make_comm_state(**kwargs)
            out[name] = "no error"
        except ValueError as err:
            out[name] = str(err)
    os.environ["LOCAL_WORLD_SIZE"] = "2"
    try:
        out["env_ranks_per_node"] = str(make_comm_state(algorithm="hierarchical").topology)
    finally:
        del os.environ["LOCAL_WORLD_SIZE"]
    return out


def _rank_main(rank: int, world_size: int) -> dict:
    os.environ.pop("LOCAL_WORLD_SIZE", None)
    x, y = _batch(rank, 0)
    local = _model()
    torch.nn.functional.mse_loss(local(x), y).backward()
    results: dict = {"local": _flat_grads(local), "errors": _errors()}

    for name, (alg, comp, rpn, shape) in CASES.items():
        ddp = DDP(_model(), bucket_cap_mb=160 / 2**20)  # ~40 fp32 values a bucket
        state = register_comm_hook(
            ddp, algorithm=alg, compress=comp, ranks_per_node=rpn, torus_shape=shape
        )
        # DDP puts every parameter in one bucket for the first backward, then rebuilds the
        # buckets (bucket_cap_mb) in gradient order: check both, count the second.
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        case = {"grads_one_bucket": _flat_grads(ddp.module)}
        ddp.zero_grad()
        state.reset_counters()
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        case.update(grads=_flat_grads(ddp.module), counters=state.counters())
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
        for step in range(1, 4):
            opt.step()
            opt.zero_grad()
            xs, ys = _batch(rank, step)
            torch.nn.functional.mse_loss(ddp(xs), ys).backward()
        opt.step()
        case["params"] = torch.cat([p.detach().reshape(-1) for p in ddp.parameters()])
        results[name] = case

    # fp16 overflow: every rank holds 40,000 (< 65,504); their sum would overflow fp16, the
    # average (what travels, since the hook divides first) does not.
    state = make_comm_state(algorithm="hierarchical", compress="fp16", ranks_per_node=2)
    results["fp16_big"] = state.allreduce(torch.full((10,), 40_000.0)).wait()
    return results


@pytest.fixture(scope="module")
def ranks() -> list[dict]:
    return run_ranks(_rank_main, WORLD, fork=True)


@pytest.fixture(scope="module")
def mean_grad(ranks: list[dict]) -> torch.Tensor:
    return torch.stack([r["local"] for r in ranks]).mean(0)


@pytest.mark.parametrize("name", list(CASES))
def test_gradients_are_the_average(ranks: list[dict], mean_grad: torch.Tensor, name: str) -> None:
    """Every algorithm averages; the error is that of the wire dtype's roundings."""
    u = ROUNDOFF[CASES[name][1]]
    abs_mean = torch.stack([r["local"] for r in ranks]).abs().mean(0)
    # Per element: the /n rounding, up to log2(n) + 1 partial-sum roundings and the cast
    # back, each at most u of the running magnitude; fp16 underflow adds ~6e-8.
    bound = 6 * u * abs_mean + (1e-7 if CASES[name][1] == "fp16" else 1e-12)
    for r in ranks:
        for key in ("grads_one_bucket", "grads"):
            err = (r[name][key] - mean_grad).abs()
            assert torch.all(err <= bound), f"{name} {key}: max error {err.max():.3g}"
    if CASES[name][1] == "none":
        torch.testing.assert_close(ranks[0][name]["grads"], ranks[0]["flat/none"]["grads"])


@pytest.mark.parametrize("name", list(CASES))
def test_training_keeps_ranks_identical(ranks: list[dict], name: str) -> None:
    for r in ranks[1:]:
        assert torch.equal(r[name]["params"], ranks[0][name]["params"]), name
    initial = torch.cat([p.detach().reshape(-1) for p in _model().parameters()])
    assert not torch.equal(ranks[0][name]["params"], initial)
    if CASES[name][1] == "none":  # same trajectory as flat, up to reduction order
        torch.testing.assert_close(ranks[0][name]["params"], ranks[0]["flat/none"]["params"])


@pytest.mark.parametrize("name", list(CASES))
def test_inter_node_bytes_match_cost_model(ranks: list[dict], name: str) -> None:
    alg, comp, rpn, shape = CASES[name]
    counters = [r[name]["counters"] for r in ranks]
    payload = counters[0]["payload_bytes"]
    assert all(c["payload_bytes"] == payload for c in counters)
    est = estimate_allreduce(
        alg,
        ranks_per_node=rpn,
        nodes=WORLD // rpn,
        message_bytes=payload,
        links=H100_LINKS,
        torus_shape=shape,
    )
    # the model gives the busiest rank; with one rank per node per column, all ranks are
    assert max(c["inter_node_bytes"] for c in counters) == est.inter_node_bytes
    assert max(c["intra_node_bytes"] for c in counters) == est.intra_node_bytes
    if alg != "flat" and shape is None:
        assert {c["inter_node_bytes"] for c in counters} == {est.inter_node_bytes}


def test_counts_and_padding(ranks: list[dict]) -> None:
    n_params = sum(p.numel() for p in _model().parameters())
    for name, (alg, comp, rpn, shape) in CASES.items():
        c = ranks[0][name]["counters"]
        assert c["buckets"] >= 2, f"{name}: the test wants several buckets, got {c}"
        elsize = 4 if comp == "none" else 2
        # each bucket padded to a multiple of the world size, at most WORLD-1 values
        assert n_params * elsize <= c["payload_bytes"] < (n_params + 3 * c["buckets"]) * elsize
        assert c["payload_bytes"] % (WORLD * elsize) == 0
    assert ranks[0]["flat/none"]["counters"]["payload_bytes"] > n_params * 4, "no padding"
    per_bucket = {"flat/none": 1, "hierarchical/none": 3, "torus2d-4x1/none": 2,
                  "torus2d-1x4/none": 1, "hierarchical-1node/none": 2}
    for name, k in per_bucket.items():
        c = ranks[0][name]["counters"]
        assert c["collectives"] == k * c["buckets"], name
    # 2 nodes x 2: hierarchical sends S/2 across nodes, the flat ring's busiest rank 1.5 S
    hier, flat = ranks[0]["hierarchical/none"]["counters"], ranks[1]["flat/none"]["counters"]
    assert hier["inter_node_bytes"] * 3 == flat["inter_node_bytes"]
    assert ranks[0]["flat/none"]["counters"]["inter_node_bytes"] == 0  # successor on its node
    assert ranks[0]["hierarchical-1node/none"]["counters"]["inter_node_bytes"] == 0


def test_fp16_divides_before_cast(ranks: list[dict]) -> None:
    for r in ranks:
        torch.testing.assert_close(r["fp16_big"], torch.full((10,), 40_000.0))


def test_configuration_errors(ranks: list[dict]) -> None:
    errors = ranks[0]["errors"]
    assert "not divisible by ranks_per_node 3" in errors["indivisible"]
    assert "does not tile" in errors["bad_shape"]
    assert "LOCAL_WORLD_SIZE" in errors["no_topology"]
    assert "only used by comm.algorithm 'torus2d'" in errors["shape_not_torus"]
    assert errors["env_ranks_per_node"] == str(Topology(world_size=4, ranks_per_node=2))


def test_unknown_names_fail_before_any_collective() -> None:
    with pytest.raises(ValueError, match="unknown comm.algorithm 'ring'"):
        make_comm_state(algorithm="ring")
    with pytest.raises(ValueError, match="unknown comm.compress 'int8'"):
        make_comm_state(algorithm="flat", compress="int8")
    with pytest.raises(ValueError, match="initialised"):
        make_comm_state(algorithm="flat")
    assert not dist.is_initialized()


def test_grid_groups() -> None:
    topo = Topology(world_size=8, ranks_per_node=4)
    assert grid_shape(topo) == (4, 2)
    assert row_groups((4, 2)) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert column_groups((4, 2)) == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert grid_shape(topo, (2, 4)) == (2, 4)
    with pytest.raises(ValueError, match="not divisible"):
        Topology(world_size=6, ranks_per_node=4)


def _backend_wrap_run(rank: int, world_size: int) -> dict:
    """The backend's wrap_model with the comm config keywords, as largebatch.run calls it."""
    from largebatch.backends.torch_dist import TorchDistributedBackend

    backend = TorchDistributedBackend("cpu")
    wrapped = backend.wrap_model(_model(), bucket_mb=1.0, algorithm="hierarchical", compress="fp16",
                                 ranks_per_node=1)
    assert wrapped.local_norm_tap is None  # not asked for
    assert not hasattr(backend, "comm_state")  # returned, not left on the backend
    plain = backend.wrap_model(_model())  # flat, no compression: torch's own reduction, no state
    x, y = _batch(rank, 0)
    torch.nn.functional.mse_loss(wrapped.model(x), y).backward()
    state = wrapped.comm_state
    assert state is not None and plain.comm_state is None
    return {"ddp": isinstance(wrapped.model, DDP), "counters": state.counters(),
            "algorithm": state.algorithm, "compress": state.compress}


def test_backend_wrap_model_registers_the_hook_and_returns_its_state() -> None:
    for out in run_ranks(_backend_wrap_run, 2, fork=True):
        assert out["ddp"] and (out["algorithm"], out["compress"]) == ("hierarchical", "fp16")
        assert out["counters"]["buckets"] >= 1 and out["counters"]["inter_node_bytes"] > 0
