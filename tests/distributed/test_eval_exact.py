"""Exact distributed evaluation: every image counted once at any world size and remainder."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from largebatch.backends.torch_dist import TorchDistributedBackend
from largebatch.data.samplers import ExactShardSampler
from largebatch.engine.evaluate import evaluate
from tests.distributed.harness import run_ranks

N_IMAGES = 1001
N_CLASSES = 7


def _dataset() -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N_IMAGES, 12, generator=g)
    y = torch.randint(0, N_CLASSES, (N_IMAGES,), generator=g)
    return TensorDataset(x, y)


def _model() -> nn.Module:
    torch.manual_seed(1)
    return nn.Linear(12, N_CLASSES)


def _eval_on_rank(rank: int, world: int, batch_size: int) -> dict:
    backend = TorchDistributedBackend("cpu")
    ds = _dataset()
    loader = DataLoader(ds, batch_size=batch_size, sampler=ExactShardSampler(len(ds), rank=rank, world_size=world))
    return evaluate(_model(), loader, backend=backend)


def test_single_process_reference() -> None:
    backend = TorchDistributedBackend("cpu")
    ds = _dataset()
    m = _model()
    out = evaluate(m, DataLoader(ds, batch_size=64), backend=backend)
    with torch.no_grad():
        logits = m(ds.tensors[0])
    expected = (logits.argmax(1) == ds.tensors[1]).sum().item()
    assert out["total"] == N_IMAGES and out["correct1"] == expected
    assert out["top1"] == pytest.approx(100.0 * expected / N_IMAGES)


@pytest.mark.parametrize("world", [2, 3, 4])
def test_counts_match_single_process(world: int) -> None:
    backend = TorchDistributedBackend("cpu")
    ds = _dataset()
    ref = evaluate(_model(), DataLoader(ds, batch_size=64), backend=backend)
    results = run_ranks(_eval_on_rank, world, 64, fork=True)
    for r in results:
        assert r["total"] == N_IMAGES
        assert (r["correct1"], r["correct5"]) == (ref["correct1"], ref["correct5"])
        assert r["top1"] == pytest.approx(ref["top1"])
        assert r["loss"] == pytest.approx(ref["loss"], rel=1e-6)


def _tiny_on_rank(rank: int, world: int) -> dict:
    backend = TorchDistributedBackend("cpu")
    ds = TensorDataset(torch.randn(2, 12), torch.tensor([0, 1]))
    loader = DataLoader(ds, batch_size=4, sampler=ExactShardSampler(2, rank=rank, world_size=world))
    return evaluate(_model(), loader, backend=backend)


def test_ranks_with_no_images_still_join() -> None:
    results = run_ranks(_tiny_on_rank, 4, fork=True)  # ranks 2 and 3 have zero samples
    assert all(r["total"] == 2 for r in results)


def _ddp_with_an_empty_rank(rank: int, world: int) -> dict:
    """A DDP model with BN right after a training step (DDP's next forward broadcasts rank 0's
    buffers), evaluated on one validation image: rank 1's part is empty."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    backend = TorchDistributedBackend("cpu")
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(12, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, N_CLASSES))
    ddp = DDP(model)
    g = torch.Generator().manual_seed(10 + rank)  # each rank its own batch: BN statistics differ
    nn.functional.cross_entropy(ddp(torch.randn(6, 12, generator=g)), torch.randint(0, N_CLASSES, (6,), generator=g)).backward()
    ds = _dataset()
    one = TensorDataset(ds.tensors[0][:1], ds.tensors[1][:1])
    loader = DataLoader(one, batch_size=4, sampler=ExactShardSampler(1, rank=rank, world_size=world))
    out = evaluate(ddp, loader, backend=backend)
    with torch.no_grad():
        model.eval()
        logits = model(one.tensors[0])  # rank 0's weights and buffers, by hand
    return out | {"running_mean": model[1].running_mean.clone(), "logits_loss": float(
        nn.functional.cross_entropy(logits, one.tensors[1]))}


def test_a_ddp_model_evaluates_with_an_empty_rank() -> None:
    """DDP's first forward after training broadcasts buffers; rank 1, with no batch, never joined
    it and went on to the all-reduce: gloo timed out, NCCL hung 30 minutes (issue 53)."""
    r0, r1 = run_ranks(_ddp_with_an_empty_rank, 2, timeout_s=30, fork=True)
    assert r0["total"] == r1["total"] == 1
    assert r0["loss"] == r1["loss"] == pytest.approx(r0["logits_loss"])  # rank 0 evaluated rank 0's model
    assert torch.equal(r0["running_mean"], r1["running_mean"])  # every rank evaluates rank 0's BN statistics
