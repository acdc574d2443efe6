"""Training throughput on one GPU: img/s, MFU, memory peak and input stall, per configuration.

For each model x data source x precision x memory layout x compile x optimizer, runs
``--warmup`` untimed then ``--steps`` timed training steps of ``--batch`` images and prints one
table. The data sources:

* ``synthetic``: one batch already on the GPU (the model-only ceiling);
* ``torchvision``: ``largebatch.data.folder`` (DataLoader workers, pinned memory) on ``--root``;
* ``dali``: ``largebatch.data.dali`` (``mixed`` decode: nvJPEG + the hardware decoder) on ``--root``.

MFU is achieved model FLOP/s (3 x the forward FLOPs of one image, counted by
``torch.utils.flop_counter``, x img/s) over the bf16 matrix-multiply rate measured on this card
in the same run. The stall fraction is the share of the step time spent waiting for the next
batch (time in ``next()`` on the host, with the step's kernels already queued).

    python benchmarks/throughput.py                                   # resnet50, synthetic
    python benchmarks/throughput.py --data synthetic dali torchvision --root /data/imagenet
    python benchmarks/throughput.py --device cpu --model resnet10t --image-size 32 --batch 8 \\
        --steps 2 --warmup 1 --precisions fp32                       # smoke run, no GPU
"""

from __future__ import annotations

import argparse
import itertools
import time
from dataclasses import dataclass
from typing import Any, Iterator, Optional

import timm
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from largebatch.optim import build_optimizer

DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class Result:
    config: str
    img_per_s: float
    mfu: Optional[float]
    mem_gib: Optional[float]
    stall: Optional[float]


def matmul_peak_flops(device: torch.device, n: int = 8192, reps: int = 10) -> Optional[float]:
    """Measured bf16 matrix-multiply FLOP/s of the card (None on CPU)."""
    if device.type != "cuda":
        return None
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    for _ in range(reps):
        a @ b
    torch.cuda.synchronize(device)
    return 2 * n**3 * reps / (time.perf_counter() - t0)


def train_flops_per_image(model_name: str, image_size: int) -> float:
    """3 x forward FLOPs of one image (forward + backward w.r.t. inputs and weights)."""
    model = timm.create_model(model_name, num_classes=1000).eval()
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(torch.randn(1, 3, image_size, image_size))
    return 3.0 * counter.get_total_flops()


def synthetic_batches(batch: int, size: int, device: torch.device, channels_last: bool) -> Iterator:
    images = torch.randn(batch, 3, size, size, device=device)
    if channels_last:
        images = images.contiguous(memory_format=torch.channels_last)
    labels = torch.randint(0, 1000, (batch,), device=device)
    return itertools.repeat((images, labels))


def loader_batches(kind: str, args: argparse.Namespace, device: torch.device, channels_last: bool) -> Iterator:
    """Endless batches from the torchvision or DALI pipeline on ``args.root``."""
    if kind == "dali":
        from largebatch.data.dali import build_dali_loaders

        train, _, _ = build_dali_loaders(
            args.root, image_size=args.image_size, batch_size=args.batch, workers=args.workers,
            device_id=device.index or 0 if device.type == "cuda" else None,
            layout="NHWC" if channels_last else "NCHW",
        )
    else:
        from largebatch.data.folder import build_loaders

        train, _, _ = build_loaders(
            args.root, image_size=args.image_size, batch_size=args.batch, workers=args.workers,
            pin_memory=device.type == "cuda",
        )
    for epoch in itertools.count():
        train.set_epoch(epoch)
        for images, labels, *_ in train:
            images = images.to(device, non_blocking=True)
            if channels_last:
                images = images.contiguous(memory_format=torch.channels_last)
            yield images, labels.to(device, non_blocking=True)


def run_config(model_name: str, data: str, precision: str, channels_last: bool, compiled: bool,
               optimizer: str, args: argparse.Namespace, device: torch.device) -> Result:
    torch.manual_seed(0)
    model = timm.create_model(model_name, num_classes=1000).to(device)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    opt = build_optimizer(optimizer, model, lr=0.1, weight_decay=5e-5, exclude_bn_bias=True, momentum=0.9)
    step_model = torch.compile(model) if compiled else model
    dtype = DTYPES[precision]
    scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")
    batches = (synthetic_batches(args.batch, args.image_size, device, channels_last) if data == "synthetic"
               else loader_batches(data, args, device, channels_last))

    def step(images: torch.Tensor, labels: torch.Tensor) -> None:
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            loss = F.cross_entropy(step_model(images).float(), labels)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda *_: None)
    for _ in range(args.warmup):
        step(*next(batches))
    sync()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    waited = 0.0
    t0 = time.perf_counter()
    for _ in range(args.steps):
        w0 = time.perf_counter()
        images, labels = next(batches)
        waited += time.perf_counter() - w0
        step(images, labels)
    sync()
    elapsed = time.perf_counter() - t0
    ips = args.steps * args.batch / elapsed
    mem = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
    mfu = ips * args.flops[model_name] / args.peak if args.peak else None
    name = f"{model_name} {data} {precision} {'NHWC' if channels_last else 'NCHW'}"
    name += f" {'compiled' if compiled else 'eager'} {optimizer}"
    return Result(name, ips, mfu, mem, waited / elapsed if data != "synthetic" else None)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--model", nargs="+", default=["resnet50"])
    p.add_argument("--data", nargs="+", default=["synthetic"], choices=["synthetic", "torchvision", "dali"])
    p.add_argument("--root", default=None, help="ImageFolder root for torchvision/dali")
    p.add_argument("--workers", type=int, default=8, help="DataLoader workers / DALI threads")
    p.add_argument("--precisions", nargs="+", default=["bf16", "fp16"], choices=list(DTYPES))
    p.add_argument("--layouts", nargs="+", default=["NHWC", "NCHW"], choices=["NHWC", "NCHW"])
    p.add_argument("--compile", nargs="+", default=["eager"], choices=["eager", "compiled"])
    p.add_argument("--optimizers", nargs="+", default=["sgd", "lars"])
    p.add_argument("--batch", type=int, default=256, help="images per step (per GPU)")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=10)
    args = p.parse_args()
    if set(args.data) - {"synthetic"} and not args.root:
        p.error("--data torchvision/dali needs --root (an ImageFolder tree with train/)")
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    args.peak = matmul_peak_flops(device)
    args.flops = {m: train_flops_per_image(m, args.image_size) for m in args.model}
    print(f"device: {torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}; "
          f"measured bf16 matmul: {args.peak / 1e12:.0f} TFLOP/s" if args.peak else "device: cpu")
    for m, f in args.flops.items():
        print(f"{m} @ {args.image_size}px: {f / 1e9:.1f} GFLOPs per training image")
    print(f"\n| configuration | img/s | MFU | GPU mem peak (GiB) | input stall |")
    print("|---|---:|---:|---:|---:|")
    for model, data, prec, layout, comp, optim in itertools.product(
        args.model, args.data, args.precisions, args.layouts, args.compile, args.optimizers
    ):
        r = run_config(model, data, prec, layout == "NHWC", comp == "compiled", optim, args, device)
        fmt = lambda v, f: "n/a" if v is None else f.format(v)  # noqa: E731
        print(f"| {r.config} | {r.img_per_s:,.0f} | {fmt(r.mfu, '{:.1%}')} | {fmt(r.mem_gib, '{:.1f}')} "
              f"| {fmt(r.stall, '{:.1%}')} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
