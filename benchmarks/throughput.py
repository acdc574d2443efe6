"""Whole-pipeline training throughput on one GPU: real JPEGs through each loader, in one table.

One run measures, on the same files and the same card:

* ``decode`` rows: decode-only img/s of each JPEG decoder (Pillow on one core and on every
  core, torchvision's libjpeg on one core, torchvision's nvJPEG batched on the GPU, DALI
  ``mixed`` where installed);
* ``train`` rows, for each data source x precision x compile mode (x layout x optimizer):
  ``synthetic`` (one batch already on the GPU: the model-only ceiling), ``torchvision``
  (DataLoader workers decode with Pillow, pinned copies), ``nvjpeg`` (workers read bytes, the
  GPU decodes and augments: ``largebatch.data.pipelines.nvjpeg``), ``dali`` (``mixed`` decode, if
  installed). Columns: img/s; MFU; input stall = share of the wall time the host spent
  waiting in ``next()`` for a batch; GPU input = share of the GPU stream's time between the
  end of one step and the start of the next (decode/augment kernels the loader queued, plus
  idle time while the host was late); GPU memory peak.

MFU is achieved model FLOP/s (3 x the forward FLOPs of one image, counted by
``torch.utils.flop_counter``, x img/s) over the dense bf16 matrix-multiply rate measured on
this card in the same run (fp16 rows use the same peak: the tensor-core rate is the same).

The data: ``--make-data DIR`` writes an ImageNet-like set to the machine's local disk
(default 20,480 train JPEGs of 500x375, a quarter of them portrait, quality 90, 1,000 classes,
plus one val image per class; ~60-110 KB each, like ImageNet's), with every core.

    python benchmarks/throughput.py --make-data /local/jpegs              # once (~1 min, 16 cores)
    python benchmarks/throughput.py --root /local/jpegs \\
        --data synthetic torchvision nvjpeg dali --precisions bf16 fp16 --compile none default
    python benchmarks/throughput.py --device cpu --make-data /tmp/jpegs --files 64 --classes 4 \\
        --model resnet10t --image-size 32 --batch 8 --steps 2 --warmup 1 --precisions fp32 \\
        --data synthetic torchvision nvjpeg --workers 2                  # smoke run, no GPU
"""

from __future__ import annotations

import argparse
import gc
import importlib.metadata
import itertools
import os
import platform
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import numpy as np
import timm
import torch
import torch.nn.functional as F
from PIL import Image
from torch.utils.flop_counter import FlopCounterMode

from largebatch.data.synthetic import class_folder_name, render_image
from largebatch.engine.compile import compile_model, uses_cuda_graphs
from largebatch.optim import build_optimizer

DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
WIDTH, HEIGHT = 500, 375


@dataclass
class Row:
    kind: str  # decode | train
    config: str
    img_per_s: float
    mfu: Optional[float] = None
    stall: Optional[float] = None
    gpu_input: Optional[float] = None
    mem_gib: Optional[float] = None


# ---------------------------------------------------------------------------------------
# the data set


def _write_class(job: tuple[str, int, int, int]) -> int:
    root, c, per_class, seed = job
    for split, count in (("train", per_class), ("val", 1)):
        folder = Path(root, split, class_folder_name(c))
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(count):
            rng = np.random.default_rng([seed, c, i, split == "val"])
            pixels = render_image(1000, c % 100, rng, WIDTH)[:HEIGHT]
            if (c + i) % 4 == 3:  # a quarter portrait, as in ImageNet
                pixels = pixels.transpose(1, 0, 2)
            Image.fromarray(np.ascontiguousarray(pixels)).save(folder / f"{c:04d}_{i:05d}.JPEG", quality=90)
    return per_class + 1


def make_data(root: Path, files: int, classes: int, workers: int) -> None:
    """``files`` train JPEGs over ``classes`` class folders (and one val JPEG per class)."""
    per_class = -(-files // classes)
    t0 = time.perf_counter()
    with ProcessPoolExecutor(max_workers=workers) as pool:
        written = sum(pool.map(_write_class, [(str(root), c, per_class, 0) for c in range(classes)]))
    size = sum(p.stat().st_size for p in root.rglob("*.JPEG"))
    print(f"wrote {written:,} JPEGs ({size / written / 1024:.0f} KB mean) to {root} in "
          f"{time.perf_counter() - t0:.0f} s with {workers} processes")


def train_files(root: Path, n: int) -> list[Path]:
    files = sorted((root / "train").rglob("*.JPEG"))
    return files[:: max(1, len(files) // n)][:n]


# ---------------------------------------------------------------------------------------
# decode-only rows


def _pil_decode_file(path: str) -> int:
    with Image.open(path) as img:
        return img.convert("RGB").width


def decode_rows(root: Path, device: torch.device, batch: int, workers: int) -> list[Row]:
    """Decode-only img/s of each decoder on the same files (read from the page cache)."""
    from torchvision.io import ImageReadMode, decode_jpeg

    files = train_files(root, max(batch * 4, 256))
    data = [torch.frombuffer(bytearray(p.read_bytes()), dtype=torch.uint8) for p in files]
    rows = []

    def rate(fn: Callable[[], None], images: int, sync: Callable[[], None] = lambda: None) -> float:
        fn()  # warm-up (thread pools, nvJPEG handles)
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        return images / (time.perf_counter() - t0)

    n1 = min(len(files), 256)
    rows.append(Row("decode", "Pillow, 1 core", rate(lambda: [_pil_decode_file(str(p)) for p in files[:n1]], n1)))
    with ProcessPoolExecutor(max_workers=workers) as pool:
        rows.append(Row("decode", f"Pillow, {workers} processes", rate(
            lambda: list(pool.map(_pil_decode_file, map(str, files), chunksize=16)), len(files))))
    rows.append(Row("decode", "torchvision decode_jpeg (libjpeg), 1 core", rate(
        lambda: decode_jpeg(data[:n1], mode=ImageReadMode.RGB), n1)))
    if device.type == "cuda":
        sync = lambda: torch.cuda.synchronize(device)  # noqa: E731
        chunks = [data[i : i + batch] for i in range(0, len(data), batch)]
        rows.append(Row("decode", f"torchvision decode_jpeg (nvJPEG), batches of {batch}", rate(
            lambda: [decode_jpeg(c, mode=ImageReadMode.RGB, device=device) for c in chunks], len(data), sync)))
        dali = dali_decode_rate(files, device, batch, workers)
        if dali is not None:
            rows.append(Row("decode", f"DALI mixed decode, batches of {batch}, {workers} threads", dali))
    return rows


def dali_decode_rate(files: list[Path], device: torch.device, batch: int, threads: int) -> Optional[float]:
    """DALI ``mixed`` decode-only img/s (None when DALI is not installed)."""
    try:
        from nvidia.dali import fn, pipeline_def
    except ImportError:
        return None

    @pipeline_def(batch_size=batch, num_threads=threads, device_id=device.index or 0, prefetch_queue_depth=2)
    def decode() -> Any:
        jpegs, _ = fn.readers.file(files=[str(p) for p in files], random_shuffle=False, name="r")
        return fn.decoders.image(jpegs, device="mixed")

    pipe = decode()
    pipe.build()
    iters = max(1, len(files) // batch)
    for _ in range(2):
        pipe.run()
    torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    for _ in range(iters):
        pipe.run()
    torch.cuda.synchronize(device)
    return iters * batch / (time.perf_counter() - t0)


# ---------------------------------------------------------------------------------------
# training rows


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


def loader_batches(kind: str, args: argparse.Namespace, device: torch.device, channels_last: bool,
                   dtype: Optional[torch.dtype]) -> Iterator:
    """Endless training batches on the device from the ``kind`` pipeline on ``args.root``."""
    common = dict(image_size=args.image_size, batch_size=args.batch, workers=args.workers)
    if kind == "dali":
        from largebatch.data.pipelines.dali_files import build_dali_loaders

        train, _, _ = build_dali_loaders(
            args.root, device_id=(device.index or 0) if device.type == "cuda" else None,
            layout="NHWC" if channels_last else "NCHW", **common)
    elif kind == "nvjpeg":
        from largebatch.data.pipelines.nvjpeg import build_nvjpeg_loaders

        train, _, _ = build_nvjpeg_loaders(args.root, device=device, dtype=dtype or torch.float32,
                                           channels_last=channels_last, pin_memory=device.type == "cuda", **common)
    else:
        from largebatch.data.pipelines.torchvision import build_loaders

        train, _, _ = build_loaders(args.root, pin_memory=device.type == "cuda", **common)
    for epoch in itertools.count():
        train.set_epoch(epoch)
        for images, labels, *_ in train:  # already on the device for dali/nvjpeg: .to is a no-op
            images = images.to(device, non_blocking=True)
            if channels_last:
                images = images.contiguous(memory_format=torch.channels_last)
            yield images, labels.to(device, non_blocking=True)


def run_config(model_name: str, data: str, precision: str, channels_last: bool, compile_mode: str,
               optimizer: str, args: argparse.Namespace, device: torch.device) -> Row:
    torch.manual_seed(0)
    torch._dynamo.reset()  # fresh compile caches: no recompile limit carried over from other rows
    model = timm.create_model(model_name, num_classes=1000).to(device)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    opt = build_optimizer(optimizer, model, lr=0.1, weight_decay=5e-5, exclude_bn_bias=True, momentum=0.9)
    step_model = compile_model(model, compile_mode)
    graphs = uses_cuda_graphs(compile_mode) and device.type == "cuda"
    dtype = DTYPES[precision]
    scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")
    batches = (synthetic_batches(args.batch, args.image_size, device, channels_last) if data == "synthetic"
               else loader_batches(data, args, device, channels_last, dtype))

    def step(images: torch.Tensor, labels: torch.Tensor) -> None:
        if graphs:
            torch.compiler.cudagraph_mark_step_begin()
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            loss = F.cross_entropy(step_model(images).float(), labels)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)

    cuda = device.type == "cuda"
    sync = (lambda: torch.cuda.synchronize(device)) if cuda else (lambda: None)
    for _ in range(args.warmup):  # includes compilation and cuDNN autotuning
        step(*next(batches))
    sync()
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    events: list[tuple[Any, Any]] = []
    waited = 0.0
    t0 = time.perf_counter()
    for _ in range(args.steps):
        if cuda:
            events.append((torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)))
            events[-1][0].record()
        w0 = time.perf_counter()
        images, labels = next(batches)
        waited += time.perf_counter() - w0
        if cuda:
            events[-1][1].record()
        step(images, labels)
    sync()
    elapsed = time.perf_counter() - t0
    ips = args.steps * args.batch / elapsed
    gpu_input = sum(a.elapsed_time(b) for a, b in events) / 1e3 / elapsed if cuda else None
    mem = torch.cuda.max_memory_allocated(device) / 2**30 if cuda else None
    mfu = ips * args.flops[model_name] / args.peak if args.peak else None
    name = f"{model_name} {data} {precision} {'NHWC' if channels_last else 'NCHW'} "
    name += f"{'eager' if compile_mode == 'none' else 'compile=' + compile_mode} {optimizer}"
    if data in ("torchvision", "nvjpeg", "dali"):
        name += f" ({args.workers} workers)" if data != "dali" else f" ({args.workers} threads)"
    del batches
    gc.collect()  # stop this loader's worker processes before the next configuration
    stall = None if data == "synthetic" else waited / elapsed
    return Row("train", name, ips, mfu, stall, None if data == "synthetic" else gpu_input, mem)


# ---------------------------------------------------------------------------------------


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _driver_version() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
        return out.stdout.split("\n")[0].strip() or "?"
    except (OSError, subprocess.SubprocessError):
        return "?"


def environment(device: torch.device) -> str:
    import torchvision

    dali = next((v for v in map(_version, ("nvidia-dali-cuda130", "nvidia-dali-cuda120", "nvidia-dali-cuda110"))
                 if v != "not installed"), "not installed")
    gpu = (f"{torch.cuda.get_device_name(device)}, CUDA {torch.version.cuda}, driver {_driver_version()}"
           if device.type == "cuda" else f"CPU ({platform.processor() or platform.machine()})")
    return (f"date {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {gpu}; {os.cpu_count()} CPUs; "
            f"torch {torch.__version__}, torchvision {torchvision.__version__}, timm {timm.__version__}, "
            f"DALI {dali}, Python {platform.python_version()}\ncommand: python {' '.join(sys.argv)}")


def _fmt(value: Optional[float], spec: str) -> str:
    return "n/a" if value is None else spec.format(value)


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--make-data", type=Path, default=None, help="write the JPEG set here first (then --root)")
    p.add_argument("--files", type=int, default=20480, help="train JPEGs to write with --make-data")
    p.add_argument("--classes", type=int, default=1000)
    p.add_argument("--root", type=Path, default=None, help="ImageFolder root with train/ and val/")
    p.add_argument("--model", nargs="+", default=["resnet50"])
    p.add_argument("--data", nargs="+", default=["synthetic", "torchvision", "nvjpeg", "dali"],
                   choices=["synthetic", "torchvision", "nvjpeg", "dali"])
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                   help="DataLoader workers / DALI threads / decode processes (default: every core)")
    p.add_argument("--precisions", nargs="+", default=["bf16", "fp16"], choices=list(DTYPES))
    p.add_argument("--layouts", nargs="+", default=["NHWC"], choices=["NHWC", "NCHW"])
    p.add_argument("--compile", nargs="+", default=["none", "default"],
                   help="compile modes: none default reduce-overhead max-autotune-no-cudagraphs")
    p.add_argument("--optimizers", nargs="+", default=["lars"])
    p.add_argument("--batch", type=int, default=256, help="images per step (per GPU)")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--no-decode", action="store_true", help="skip the decode-only rows")
    args = p.parse_args(argv)
    # the names of the script's first version: eager / compiled
    args.compile = [{"eager": "none", "compiled": "default"}.get(c, c) for c in args.compile]
    device = torch.device(args.device)
    if args.make_data is not None:
        make_data(args.make_data, args.files, args.classes, args.workers)
        args.root = args.root or args.make_data
    if "dali" in args.data:
        from largebatch.data.pipelines.dali_graph import dali_available

        if not dali_available():
            print("DALI is not installed: no dali rows")
            args.data = [d for d in args.data if d != "dali"]
    if set(args.data) - {"synthetic"} and not args.root:
        p.error("--data torchvision/nvjpeg/dali needs --root (or --make-data)")
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    print(environment(device))
    args.peak = matmul_peak_flops(device)
    args.flops = {m: train_flops_per_image(m, args.image_size) for m in args.model}
    if args.peak:
        print(f"measured dense bf16 matmul: {args.peak / 1e12:.0f} TFLOP/s")
    for m, f in args.flops.items():
        print(f"{m} @ {args.image_size}px: {f / 1e9:.2f} GFLOPs per training image")
    print(f"batch {args.batch} per GPU, {args.steps} timed steps after {args.warmup} warm-up steps\n")
    print("| kind | configuration | img/s | MFU | input stall | GPU input | GPU mem peak (GiB) |")
    print("|---|---|---:|---:|---:|---:|---:|")

    def show(r: Row) -> None:
        print(f"| {r.kind} | {r.config} | {r.img_per_s:,.0f} | {_fmt(r.mfu, '{:.1%}')} | {_fmt(r.stall, '{:.1%}')} "
              f"| {_fmt(r.gpu_input, '{:.1%}')} | {_fmt(r.mem_gib, '{:.1f}')} |", flush=True)

    if args.root and not args.no_decode:
        for row in decode_rows(args.root, device, args.batch, args.workers):
            show(row)
    for model, data, prec, comp, layout, optim in itertools.product(
        args.model, args.data, args.precisions, args.compile, args.layouts, args.optimizers
    ):
        show(run_config(model, data, prec, layout == "NHWC", comp, optim, args, device))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
