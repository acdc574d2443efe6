"""channels_last (NHWC) against NCHW for training steps on this CPU, in fp32 and bf16 autocast.

``model.channels_last: null`` turns NHWC on for CUDA only. oneDNN's CPU convolutions prefer
NHWC (or blocked) layouts too, and with AVX-512 BF16 / AMX its bf16 kernels are NHWC-native,
so the question is whether the default should follow the precision on CPUs as well. This
script times whole training steps (forward, backward, SGD step; the models and autocast the
trainer builds: ``largebatch.models.build_model``, ``torch.autocast("cpu", torch.bfloat16)``),
each configuration's steps **interleaved** with the others' round by round, so a machine that
gets busier or quieter mid-run moves every column alike; the table gives the median img/s over
the rounds and NHWC's ratio to NCHW at the same model and precision (its range over rounds).

    python benchmarks/cpu_layout.py                               # the default run's model
    python benchmarks/cpu_layout.py --model resnet50 --image-size 224 --batch 16 --rounds 5
"""

from __future__ import annotations

import argparse
import contextlib
import platform
import statistics
import sys
import time
from typing import Sequence

import torch
import torch.nn.functional as F

from largebatch.models import build_model


def has_bf16() -> bool:
    flags = open("/proc/cpuinfo").read() if sys.platform.startswith("linux") else ""
    return "avx512_bf16" in flags or "amx_bf16" in flags


def step_fn(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor, bf16: bool):
    def step() -> None:
        ctx = torch.autocast("cpu", torch.bfloat16) if bf16 else contextlib.nullcontext()
        with ctx:
            loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return step


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="resnet10t")
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--rounds", type=int, default=7, help="rounds; each times --steps steps of every configuration")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--precisions", nargs="+", default=None, choices=["fp32", "bf16"],
                   help="default: fp32, and bf16 where the CPU has AVX-512 BF16 or AMX")
    args = p.parse_args(argv)
    precisions = args.precisions or (["fp32", "bf16"] if has_bf16() else ["fp32"])
    torch.manual_seed(0)
    x0 = torch.randn(args.batch, 3, args.image_size, args.image_size)
    y = torch.randint(0, args.classes, (args.batch,))
    steps = {}
    for prec in precisions:
        for layout in ("NCHW", "NHWC"):
            torch.manual_seed(0)
            model = build_model(args.model, num_classes=args.classes)
            fmt = torch.channels_last if layout == "NHWC" else torch.contiguous_format
            model = model.to(memory_format=fmt)
            x = x0.contiguous(memory_format=fmt)
            opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
            steps[(prec, layout)] = step_fn(model, opt, x, y, prec == "bf16")
            for _ in range(args.warmup):
                steps[(prec, layout)]()
    rates: dict[tuple[str, str], list[float]] = {k: [] for k in steps}
    for r in range(args.rounds):
        order = list(steps) if r % 2 == 0 else list(reversed(steps))  # no configuration always first
        for k in order:
            t0 = time.perf_counter()
            for _ in range(args.steps):
                steps[k]()
            rates[k].append(args.steps * args.batch / (time.perf_counter() - t0))
    print(f"{platform.processor() or platform.machine()}; {torch.get_num_threads()} threads; torch {torch.__version__}; "
          f"bf16 instructions: {'yes' if has_bf16() else 'no'}")
    print(f"{args.model} @ {args.image_size} px, batch {args.batch}; {args.rounds} rounds of {args.steps} steps per "
          f"configuration, interleaved\n")
    print("| precision | layout | img/s (median) | NHWC / NCHW (median, range over rounds) |")
    print("|---|---|---:|---|")
    for prec in precisions:
        ratios = [a / b for a, b in zip(rates[(prec, "NHWC")], rates[(prec, "NCHW")])]
        for layout in ("NCHW", "NHWC"):
            extra = (f"**{statistics.median(ratios):.2f}x** [{min(ratios):.2f}, {max(ratios):.2f}]"
                     if layout == "NHWC" else "")
            print(f"| {prec} | {layout} | {statistics.median(rates[(prec, layout)]):.0f} | {extra} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
