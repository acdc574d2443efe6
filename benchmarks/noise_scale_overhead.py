"""What measuring the gradient noise scale costs a training step, against the same step without it.

The noise scale (``diagnostics.noise_scale``, McCandlish et al. 2018) is measured three ways:
from the micro-batches of one process with ``accumulation_steps`` >= 2 (one squared norm of the
first micro-batch's gradient, one of the step's: on by default), from the ranks under DDP (each
bucket's local squared norm recorded by the comm hook before the all-reduce, the reduced one
after: on by default), and, in one process without accumulation, by the opt-in probe
(``probe_every=N``: every N steps the batch's two halves run forward and backward once more).
This script times the project's own training step (``Trainer.run_step``: forward, backward, the
noise scale's hook, the optimizer step) on the default job's model and batch (timm
``resnet10t``, global batch 64 of 32 px, fp32, LARS) with the measurement on and off, in the same
process: blocks of ``--steps`` steps, alternating off / on so that a noisy machine slows both
alike. It prints one table: the median per-step time of a block for each, and their ratio.

Run:
    python benchmarks/noise_scale_overhead.py                        # 1 process, accumulation 2
    python benchmarks/noise_scale_overhead.py --ranks 2              # 2 gloo ranks under torchrun, DDP
    python benchmarks/noise_scale_overhead.py --probe-every 10       # 1 process, the probe
    python benchmarks/noise_scale_overhead.py --device cuda          # synchronises after each block

The data are random tensors already in memory (the loader is not what is measured). ``--ranks``
N starts N processes through ``torch.distributed.run`` (torchrun), each timing its own steps;
rank 0 prints the table. On a machine shared with other jobs, ``--threads 1`` keeps OpenMP
threads from waiting on each other (torchrun's ranks get one thread each already).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from typing import Any

import timm
import torch

from largebatch.backends.torch_dist import TorchDistributedBackend
from largebatch.engine.loop import StepSettings, Trainer
from largebatch.engine.noise_scale_hook import NoiseScaleHook, plan_noise_scale
from largebatch.optim import LARS, param_groups


def build(args: argparse.Namespace, backend: TorchDistributedBackend, measured: bool, micro: list) -> Trainer:
    """The default job's step (resnet10t, LARS) with or without the noise scale's hook."""
    torch.manual_seed(0)
    model = backend.prepare_model(timm.create_model(args.model, num_classes=10))
    wrapped = backend.wrap_model(model, tap_local_norm=measured)
    model, tap = wrapped.model, wrapped.local_norm_tap
    optimizer = LARS(param_groups(model, weight_decay=5e-5), lr=0.1, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    per_device = args.batch // (backend.world_size * args.accumulation)
    hooks: list[Any] = []
    if measured:
        plan = plan_noise_scale(world_size=backend.world_size, accumulation_steps=args.accumulation,
                                per_device_batch=per_device, local_norm_tap=tap,
                                probe_every=args.probe_every)
        if plan.source is None:
            raise SystemExit(f"noise_scale_overhead: nothing to measure here ({plan.reason}): "
                             "use --accumulation 2, --ranks 2 or --probe-every N")
        hooks.append(NoiseScaleHook(plan, local_norm_tap=tap))
    settings = StepSettings(epochs=1, global_batch_size=args.batch, accumulation_steps=args.accumulation,
                            log_every=10**9)
    return Trainer(model=model, optimizer=optimizer, scheduler=scheduler, train_loader=micro, backend=backend,
                   settings=settings, hooks=hooks)


def time_block(trainer: Trainer, micro: list, steps: int, device: torch.device) -> float:
    """Seconds per step over a block of ``steps`` steps (a probe step is one of them)."""
    t0 = time.perf_counter()
    for _ in range(steps):
        trainer.run_step(micro)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return (time.perf_counter() - t0) / steps


def measure(args: argparse.Namespace) -> None:
    backend = TorchDistributedBackend(args.device)
    backend.start()
    per_device = args.batch // (backend.world_size * args.accumulation)
    g = torch.Generator().manual_seed(backend.rank)
    micro = [(torch.randn(per_device, 3, args.image_size, args.image_size, generator=g).to(backend.device),
              torch.randint(0, 10, (per_device,), generator=g).to(backend.device)) for _ in range(args.accumulation)]
    trainers = {False: build(args, backend, False, micro), True: build(args, backend, True, micro)}
    times: dict[bool, list[float]] = {False: [], True: []}
    for trainer in trainers.values():  # warm-up: first-step allocations, oneDNN primitives of each shape
        time_block(trainer, micro, args.warmup, backend.device)
    for _ in range(args.rounds):  # alternate: a slow stretch of a shared machine hits both
        for measured, trainer in trainers.items():
            times[measured].append(time_block(trainer, micro, args.steps, backend.device))
    hook = next(h for h in trainers[True].hooks if isinstance(h, NoiseScaleHook))
    steps = args.warmup + args.rounds * args.steps
    expected = steps // args.probe_every if args.probe_every else steps
    if hook.tracker.updates != expected:  # the "on" steps measured nothing: the table would lie
        raise SystemExit(f"noise_scale_overhead: the noise scale was updated {hook.tracker.updates} times "
                         f"in {expected} steps")
    if backend.rank == 0:
        off, on = statistics.median(times[False]), statistics.median(times[True])
        where = (f"{backend.world_size} ranks (DDP, gloo), local vs reduced gradient" if backend.world_size > 1
                 else f"1 process, a probe every {args.probe_every} steps, half batch ({per_device // 2}) vs "
                      f"batch ({per_device})" if args.probe_every
                 else f"1 process, micro-batch ({per_device}) vs step ({args.batch})")
        threads = torch.get_num_threads()
        print(f"{args.model}, {args.image_size} px, global batch {args.batch}, accumulation {args.accumulation}, "
              f"{args.device}, {threads} thread(s) per process; {where}; "
              f"{args.rounds} blocks of {args.steps} steps each, alternating")
        print("| noise scale | ms per step (median block) | ratio |")
        print("|---|---:|---:|")
        print(f"| off | {1000 * off:.1f} | 1.000 |")
        print(f"| on | {1000 * on:.1f} | {on / off:.3f} |")
    backend.shutdown()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--model", default="resnet10t")
    p.add_argument("--image-size", type=int, default=32, help="the default job trains at 32 px")
    p.add_argument("--batch", type=int, default=64, help="global batch (the default job's 64)")
    p.add_argument("--accumulation", type=int, default=None,
                   help="micro-batches a step (default: 2 in one process, 1 with --ranks)")
    p.add_argument("--ranks", type=int, default=1, help="processes under torchrun (DDP over gloo/NCCL)")
    p.add_argument("--probe-every", type=int, default=0, help="one process: the probe every N steps")
    p.add_argument("--steps", type=int, default=10, help="steps per timed block (a multiple of --probe-every)")
    p.add_argument("--rounds", type=int, default=9, help="blocks per setting")
    p.add_argument("--warmup", type=int, default=10, help="untimed steps per setting first")
    p.add_argument("--threads", type=int, default=None, help="torch threads per process (default: torch's)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)  # a torchrun rank
    args = p.parse_args(argv)
    if args.accumulation is None:
        args.accumulation = 2 if args.ranks == 1 and not args.probe_every else 1
    if args.probe_every and (args.steps % args.probe_every or args.warmup % args.probe_every):
        p.error(f"--steps and --warmup must be multiples of --probe-every ({args.probe_every}): each block "
                "then holds the same number of probes")
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.batch % (args.ranks * args.accumulation):
        p.error(f"--batch {args.batch} is not a multiple of ranks x accumulation ({args.ranks * args.accumulation})")
    if args.ranks > 1 and not args.worker:
        forwarded = list(argv if argv is not None else sys.argv[1:])
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={args.ranks}",
               os.path.abspath(__file__), *forwarded, "--worker", "--accumulation", str(args.accumulation)]
        return subprocess.call(cmd)
    measure(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
