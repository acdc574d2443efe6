"""Forward+backward time of a ResNet stage with local BN vs GroupSyncBatchNorm on gloo ranks.

Spawns ``--world`` gloo ranks (file:// rendezvous, 1 thread each) and times, per step
(median over ``--steps``, slowest rank), the first stage of timm's resnet18 (``layer1``:
2 BasicBlocks, 4 BN layers of 64 channels) and a single BN layer, at batch ``--batch`` per
rank and ``--size`` x ``--size`` pixels. It also counts the collectives per step by wrapping
the reducer.

    .venv/bin/python benchmarks/sync_bn.py                # batch 32, 56x56, 2 ranks, group 2
    .venv/bin/python benchmarks/sync_bn.py --batch 8 --steps 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from largebatch.nn import (
    GroupSyncBatchNorm,
    LocalReducer,
    convert_group_sync_batchnorm,
    destroy_process_groups,
    process_group_reducer,
)


class CountingReducer:
    """Wraps a reducer; counts collectives and bytes reduced."""

    def __init__(self, inner) -> None:
        self.inner, self.size, self.calls, self.bytes = inner, inner.size, 0, 0

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        self.bytes += tensor.numel() * tensor.element_size()
        return self.inner.all_reduce_sum(tensor)


def _with_group_bn(module: nn.Module, reducer) -> nn.Module:
    """Swap every BatchNorm2d for a GroupSyncBatchNorm on ``reducer`` (any group size; the
    public conversion leaves a group of 1 as plain BN, this measures the layer itself)."""
    if isinstance(module, nn.BatchNorm2d):
        bn = GroupSyncBatchNorm(module.num_features, module.eps, module.momentum, reducer=reducer)
        bn.load_state_dict(module.state_dict())
        return bn
    for name, child in module.named_children():
        setattr(module, name, _with_group_bn(child, reducer))
    return module


def _step_ms(module: nn.Module, x: torch.Tensor) -> float:
    inp = x.clone().requires_grad_()
    dist.barrier()
    start = time.perf_counter()
    module(inp).sum().backward()
    elapsed = torch.tensor(time.perf_counter() - start)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the step ends with the slowest rank
    return elapsed.item() * 1e3


def _rank(rank: int, world: int, workdir: str, args: argparse.Namespace, queue) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{workdir}/rdv", rank=rank, world_size=world)
    import timm

    torch.manual_seed(0)
    x = torch.randn(args.batch, 64, args.size, args.size, generator=torch.Generator().manual_seed(rank))
    rows = []
    for part, make in (
        ("resnet18 layer1", lambda: timm.create_model("resnet18").layer1.train()),
        ("one BN layer", lambda: nn.BatchNorm2d(64)),
    ):
        local = CountingReducer(LocalReducer())
        group = CountingReducer(process_group_reducer(args.group))
        configs = [
            ("nn.BatchNorm2d (local)", None, make()),
            ("GroupSyncBatchNorm, group 1", local, _with_group_bn(make(), local)),
            (f"GroupSyncBatchNorm, group {args.group}", group,
             convert_group_sync_batchnorm(make(), args.group, reducer=group)),
        ]
        times: list[list[float]] = [[] for _ in configs]
        # round-robin over the configurations so that load drift hits them all alike
        for step in range(args.warmup + args.steps):
            for i, (_, _, module) in enumerate(configs):
                ms = _step_ms(module, x)
                if step >= args.warmup:
                    times[i].append(ms)
        steps = args.warmup + args.steps
        for (label, reducer, _), ts in zip(configs, times):
            calls = reducer.calls / steps if reducer else 0
            kib = reducer.bytes / steps / 1024 if reducer else 0
            rows.append((part, label, statistics.median(ts), calls, kib))
    if rank == 0:
        queue.put(rows)
    destroy_process_groups()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--group", type=int, default=2)
    parser.add_argument("--batch", type=int, default=32, help="images per rank")
    parser.add_argument("--size", type=int, default=56, help="height = width of the stage input")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory() as workdir:
        procs = mp.start_processes(_rank, args=(args.world, workdir, args, queue), nprocs=args.world,
                                   join=False, start_method="spawn")
        rows = queue.get()
        procs.join()
    print(f"# {args.world} gloo ranks x 1 thread, batch {args.batch}/rank, 64 ch, {args.size}x{args.size}, "
          f"median of {args.steps} steps (slowest rank), torch {torch.__version__}")
    print(f"| {'part':<16} | {'BN':<30} | {'fwd+bwd ms':>10} | {'vs local':>8} | {'collectives/step':>16} | {'KiB reduced/step':>16} |")
    print(f"|{'-' * 18}|{'-' * 32}|{'-' * 12}|{'-' * 10}|{'-' * 18}|{'-' * 18}|")
    base = {}
    for part, label, ms, calls, kib in rows:
        base.setdefault(part, ms)
        print(f"| {part:<16} | {label:<30} | {ms:>10.1f} | {ms / base[part]:>7.2f}x | {calls:>16.0f} | {kib:>16.2f} |")


if __name__ == "__main__":
    main()
