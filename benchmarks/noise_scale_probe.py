"""What the noise-scale probe costs a step: the default job's model and batch, probed every N steps.

The default run's size (conf/train.yaml: timm ``resnet10t``, 10 classes, global batch 64 of 32 px,
SGD momentum 0.9, fp32, one process) on batches already in memory, so the data pipeline does not
blur the model's time. Blocks of ``--every`` optimizer steps (each holds one probe step when the
probe is on) are timed round-robin, probe off / on, so that a noisy machine slows both alike; the
table gives the median block time per step and the probe's share. A probe runs the batch's two
halves forward and backward once more, so its expected cost is about one step per block: ~100/N %.

Run:
    python benchmarks/noise_scale_probe.py                   # every 10 steps, 7 rounds
    python benchmarks/noise_scale_probe.py --every 20 --rounds 5 --threads 1
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from largebatch.backends.torch_dist import TorchDistributedBackend
from largebatch.engine.loop import StepSettings, Trainer
from largebatch.engine.noise_scale_hook import NoiseScaleHook, plan_noise_scale
from largebatch.models import build_model

BATCH, IMAGE, CLASSES = 64, 32, 10


def _trainer(probe_every: int) -> Trainer:
    torch.manual_seed(0)
    model = build_model("resnet10t", CLASSES)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    plan = plan_noise_scale(world_size=1, accumulation_steps=1, per_device_batch=BATCH, local_norm_tap=None,
                            probe_every=probe_every)
    hooks = [NoiseScaleHook(plan)] if probe_every else []
    # train_loader: a placeholder of one batch (the steps are run directly with run_step)
    return Trainer(model=model, optimizer=opt, scheduler=torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0),
                   train_loader=[None], backend=TorchDistributedBackend("cpu"), hooks=hooks,
                   settings=StepSettings(epochs=1, global_batch_size=BATCH))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--every", type=int, default=10, help="probe_every (steps per timed block)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads (default: torch's); 1 on a machine shared with other jobs, where "
                             "2 OpenMP threads spend their time waiting for each other")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    batch = (torch.randn(BATCH, 3, IMAGE, IMAGE, generator=gen), torch.randint(0, CLASSES, (BATCH,), generator=gen))
    trainers = {"off": _trainer(0), "on": _trainer(args.every)}
    for t in trainers.values():  # warm-up: a block each (allocator, oneDNN primitives for both shapes)
        for _ in range(args.every):
            t.run_step([batch])
    times: dict[str, list[float]] = {k: [] for k in trainers}
    for _ in range(args.rounds):
        for name, t in trainers.items():
            start = time.perf_counter()
            for _ in range(args.every):
                t.run_step([batch])
            times[name].append((time.perf_counter() - start) / args.every)
    off, on = statistics.median(times["off"]), statistics.median(times["on"])
    print(f"resnet10t, batch {BATCH} x {IMAGE} px, fp32, {torch.get_num_threads()} threads, probe every "
          f"{args.every} steps, {args.rounds} rounds (median per-step time of a block)")
    print("| probe | ms/step | steps/s | cost |")
    print("|---|---:|---:|---:|")
    print(f"| off | {off * 1e3:.1f} | {1 / off:.2f} | |")
    print(f"| every {args.every} | {on * 1e3:.1f} | {1 / on:.2f} | +{(on / off - 1) * 100:.1f}% |")
    print(f"probe step alone: ~{(on - off) * args.every * 1e3:.0f} ms extra = {(on - off) * args.every / off:.2f} steps")


if __name__ == "__main__":
    main()
