"""Data parallelism is exact: 2 ranks x batch B == 1 rank x batch 2B; torchrun runs the CLI.

* k LARS steps of a small CNN on 2 gloo ranks (DDP, global GroupSyncBatchNorm, each rank its
  half of the batch) leave the same parameters as k steps of one process on the whole batch
  with plain BatchNorm; the tolerance covers float reduction order only.
* ``torchrun --standalone --nproc_per_node=2 -m largebatch.train`` finishes a 2-step run and
  both ranks write into one run directory.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch
from torch import nn

from tests.distributed.harness import run_ranks

ROOT = Path(__file__).resolve().parents[2]
STEPS = 3
B = 6  # per-rank batch


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 5),
    )


def _batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(2 * B, 3, 8, 8, generator=g), torch.randint(0, 5, (2 * B,), generator=g))
            for _ in range(STEPS)]


def _optimizer(model: nn.Module) -> torch.optim.Optimizer:
    from largebatch.optim import build_optimizer

    return build_optimizer("lars", model, lr=2.0, weight_decay=1e-4, momentum=0.9)


def _train(model: nn.Module, step_batches, rank: int | None) -> dict[str, torch.Tensor]:
    opt = _optimizer(model.module if hasattr(model, "module") else model)
    for images, labels in step_batches:
        if rank is not None:  # this rank's half of the global batch
            images, labels = images[rank * B : (rank + 1) * B], labels[rank * B : (rank + 1) * B]
        loss = nn.functional.cross_entropy(model(images), labels)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    inner = model.module if hasattr(model, "module") else model
    return {k: v.detach().clone() for k, v in inner.state_dict().items()}


def _rank_fn(rank: int, world_size: int) -> dict[str, torch.Tensor]:
    from torch.nn.parallel import DistributedDataParallel as DDP

    from largebatch.nn import convert_group_sync_batchnorm

    model = convert_group_sync_batchnorm(_model(), group_size=world_size)
    return _train(DDP(model), _batches(), rank)


def test_two_ranks_match_one_process_on_the_whole_batch() -> None:
    reference = _train(_model(), _batches(), None)
    for rank, state in enumerate(run_ranks(_rank_fn, 2, fork=True)):
        for name, ref in reference.items():
            if name.endswith("num_batches_tracked"):
                assert int(state[name]) == int(ref), name
                continue
            assert torch.allclose(state[name], ref, rtol=1e-4, atol=1e-5), (
                f"{name} on rank {rank}: max diff {(state[name] - ref).abs().max().item():.3g}"
            )
        moved = (state["0.weight"] - _model().state_dict()["0.weight"]).abs().max().item()
        assert moved > 1e-3, "the weights did not move"


def test_torchrun_two_processes_one_run_directory(tmp_path: Path) -> None:
    out = tmp_path / "runs"
    env = dict(os.environ, OMP_NUM_THREADS="1", LARGEBATCH_CACHE=str(tmp_path / "cache"))
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
        "-m", "largebatch.train", "debug=smoke", "progress=false", "tensorboard=false",
        "model=resnet10t", "backend=cpu", "max_steps=2", "log_every=1", f"output_root={out}",
    ]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    run_dirs = [p for p in out.iterdir() if p.is_dir()]
    assert len(run_dirs) == 1, run_dirs
    log = (run_dirs[0] / "train.log").read_text()
    assert "x 2 devices" in log  # global batch split over both ranks
    assert '"steps": 2' in (run_dirs[0] / "summary.json").read_text()
    # the gradient noise scale, on by default: each rank's local gradient vs the all-reduced one
    assert "noise scale: measured from ranks" in log
    records = [json.loads(line) for line in (run_dirs[0] / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["kind"] == "train"]
    assert len(train) == 2 and all("noise_scale" in r for r in train), train
    assert "gradient noise scale at the end" in proc.stdout
