"""Weight EMA on gloo ranks (issue 35): every rank evaluates the same EMA.

* DDP keeps the parameters, and so their EMA, bit-identical on every rank; with per-rank BN
  the BN running statistics differ between forwards, and so do their averages: the EMA's
  ``eval_model()`` gives every rank rank 0's (the EMA checkpoints hold), bit for bit.
* ``torchrun --nproc_per_node=2 -m largebatch.train ema.enabled=true`` trains, evaluates
  and checkpoints the EMA of the DDP-wrapped model.

The in-process cases share one start of 4 spawned ranks (each costs seconds of imports): each
rank runs both of them in turn and the tests read their own part.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from largebatch.engine.checkpoint import list_checkpoints, load_checkpoint
from tests.distributed.harness import run_ranks

ROOT = Path(__file__).resolve().parents[2]
STEPS = 5

# the module's ranks are one fixture: its tests run on one worker, where it is computed once
pytestmark = pytest.mark.xdist_group("ema_dist")


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3, bias=False), nn.BatchNorm2d(4), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 3))


def _ema_on_rank(rank: int, world: int) -> dict[str, dict[str, torch.Tensor]]:
    from torch.nn.parallel import DistributedDataParallel as DDP

    from largebatch.backends.torch_dist import TorchDistributedBackend
    from largebatch.engine.ema import EmaHook, build_model_ema

    backend = TorchDistributedBackend("cpu")
    model = _model()
    ema = build_model_ema(model, decay=0.7, warmup=True)
    ddp = DDP(model)  # per-rank BN: running statistics differ between forwards
    opt = torch.optim.SGD(ddp.parameters(), lr=0.5, momentum=0.9)
    hook = EmaHook(ema)
    hook.trainer = SimpleNamespace(model=ddp, state=SimpleNamespace(step=0), backend=backend)
    g = torch.Generator().manual_seed(100 + rank)  # each rank its own data
    for step in range(1, STEPS + 1):
        images, labels = torch.randn(6, 3, 8, 8, generator=g), torch.randint(0, 3, (6,), generator=g)
        nn.functional.cross_entropy(ddp(images), labels).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        hook.trainer.state.step = step
        hook.after_step()
    before = {k: v.clone() for k, v in ema.module.state_dict().items()}
    after = {k: v.clone() for k, v in hook.eval_model().state_dict().items()}
    return {"before": before, "after": after, "model": {k: v.clone() for k, v in model.state_dict().items()}}


def test_every_rank_evaluates_rank_0s_ema(four_ranks: list[dict]) -> None:
    r0, *others = [r["ddp"] for r in four_ranks]
    params = {name for name, _ in _model().named_parameters()}
    for k in params:
        assert not torch.equal(r0["before"][k], r0["model"][k]), f"{k}: nothing averaged"
        for rank, r in enumerate(others, 1):
            assert torch.equal(r0["before"][k], r["before"][k]), f"EMA of parameter {k} differs on rank {rank}"
    running = [k for k in r0["before"] if "running" in k]
    for rank, r in enumerate(others, 1):
        assert any(not torch.equal(r0["before"][k], r["before"][k]) for k in running), (
            f"rank {rank}: per-rank BN statistics were expected to differ before the sync; the test shows nothing")
    for k in r0["after"]:
        assert torch.equal(r0["after"][k], r0["before"][k]), f"rank 0's EMA {k} changed in the sync"
        for rank, r in enumerate(others, 1):
            assert torch.equal(r0["after"][k], r["after"][k]), f"EMA {k} differs on rank {rank} after the sync"


def test_torchrun_two_ranks_train_evaluate_and_checkpoint_the_ema(tmp_path: Path) -> None:
    run = tmp_path / "run"
    env = dict(os.environ, OMP_NUM_THREADS="1", LARGEBATCH_CACHE=str(tmp_path / "cache"))
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
        "-m", "largebatch.train", "debug=smoke", "progress=false", "tensorboard=false", "precision=fp32",
        "model=resnet10t", "backend=cpu", "epochs=1", f"run_dir={run}",
        "ema.enabled=true", "ema.decay=0.5", "ema.target=ema",
    ]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["top1_of"] == "ema"
    assert summary["best_top1"] == summary["final_ema_top1"]  # one epoch: best = last, EMA's
    ckpt = load_checkpoint(list_checkpoints(run / "checkpoints")[-1])
    assert ckpt["ema"].keys() == ckpt["model"].keys()  # the plain module's keys, no DDP prefix
    assert "EMA top-1" in (run / "train.log").read_text()
    events = [json.loads(x) for x in (run / "mlperf_log.jsonl").read_text().splitlines()]
    accuracy = [e["value"] for e in events if e["key"] == "eval_accuracy"]
    assert accuracy == [round(summary["final_ema_top1"] / 100, 6)]  # the EMA's, as ema.target says


def _ema_over_torch_sync_bn(rank: int, world: int) -> dict[str, object]:
    """The CUDA conversion of grouped BN (torch's SyncBatchNorm on a 2-rank subgroup of 4), then
    the EMA, as run.py builds them; only "is the model on CUDA" is stood in (SyncBatchNorm's
    training forward needs CUDA; building, evaluating and averaging it do not)."""
    from largebatch.backends.torch_dist import TorchDistributedBackend
    from largebatch.engine.ema import EmaSettings
    from largebatch.nn import sync_bn

    backend = TorchDistributedBackend("cpu")
    sync_bn._on_cuda = lambda module: True  # type: ignore[attr-defined]
    model = sync_bn.convert_group_sync_batchnorm(_model(), 2, backend.bn_reducer(2))
    bn = model[1]
    assert isinstance(bn, nn.SyncBatchNorm) and bn.process_group is not None
    hook = EmaSettings(decay=0.5).hook(model)  # TypeError: cannot pickle 'ProcessGroup' before the fix
    ema_bn = hook.ema.module[1]
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
        bn.running_mean.add_(2.0)
    hook.ema.update(model, step=2)
    images = torch.randn(4, 3, 8, 8, generator=torch.Generator().manual_seed(rank))
    hook.ema.module.eval()
    return {
        "same_group": ema_bn.process_group is bn.process_group,
        "kept_group": isinstance(bn.process_group, torch.distributed.ProcessGroup),
        "ema_is_sync_bn": isinstance(ema_bn, nn.SyncBatchNorm),
        "ema_mean": ema_bn.running_mean.clone(),
        "logits": hook.ema.module(images).shape,
    }


def _both_on_rank(rank: int, world: int) -> dict[str, object]:
    """Rank ``rank``'s part of both in-process cases: the DDP EMA's, then torch SyncBatchNorm's."""
    return {"ddp": _ema_on_rank(rank, world), "sync_bn": _ema_over_torch_sync_bn(rank, world)}


@pytest.fixture(scope="module")
def four_ranks() -> list[dict]:
    """What each of 4 gloo ranks returns: 4, so that grouped BN has a subgroup of 2 (of 2 groups)."""
    return run_ranks(_both_on_rank, 4, fork=True)


def test_the_ema_of_a_model_with_torch_sync_bn_on_a_subgroup(four_ranks: list[dict]) -> None:
    """Every CUDA run with ema.enabled and 1 < bn.group_size < world died before step 1: timm's
    deep copy of the model met the subgroup's ProcessGroup (issue 53)."""
    for r in (r["sync_bn"] for r in four_ranks):
        assert r["same_group"] and r["kept_group"] and r["ema_is_sync_bn"]
        assert torch.allclose(r["ema_mean"], torch.full((4,), 1.0))  # 0.5 * 0 + 0.5 * 2
        assert r["logits"] == torch.Size([4, 3])
