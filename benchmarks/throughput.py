"""Whole-pipeline training throughput on one GPU: real JPEGs through each loader, in one table.

One run measures, on the same files and the same card:

* ``decode`` rows: decode-only img/s of each JPEG decoder (Pillow on one core and on every
  core, torchvision's libjpeg on one core, torchvision's nvJPEG batched on the GPU, DALI
  ``mixed`` where installed, timed over at least 50 batches after warm-up);
* ``loader`` rows: each pipeline's batches (decode + augment + copy), no model: the input
  ceiling, the most img/s that pipeline could feed a step;
* ``train`` rows, for each model x precision x compile mode x layout x optimizer:
  ``synthetic`` (one batch already on the GPU, in the dtype the loaders give: the model-only
  ceiling), then ``torchvision`` (DataLoader workers decode with Pillow, pinned copies),
  ``nvjpeg`` (workers read bytes, the GPU decodes and augments, decode and augmentation in two
  threads: ``largebatch.data.pipelines.nvjpeg``), ``nvjpeg-serial`` (the same, one thread doing
  both in turn: ``overlap=False``), ``dali`` (``mixed`` decode, if installed; at least 50 timed
  steps), ``decoded`` (batches cut from a store decoded once: ``largebatch.data.pipelines.decoded``;
  the CPU input of a CPU host, on ``--device cpu``).

Columns: img/s; MFU twice (see below); throughput loss = ``1 - img/s / synthetic img/s`` of the
same model, precision, layout, compile mode and optimizer (what the input costs the model's
rate); data wait = the share of the timed steps' wall time the training thread spent waiting
for its next batch (in ``next()``: the step's own wait; a loader that keeps up leaves ~0); the
nvJPEG loaders' time per batch by stage (``NvjpegLoader.stage_times``: its stream wait, the
decode, the augmentation's host time, and the time its producer was ahead of the step); GPU
memory peak. Every figure comes from the same timed steps. Each configuration builds and
compiles its model once and is measured on every data kind in turn (synthetic first). A row
whose timed steps crossed an epoch boundary (a new loader pass, nothing prefetched) says so: make
the data set hold warm-up + timed steps (``--files``; ``--distinct`` writes fewer JPEGs and
hard-links them up to ``--files``).

``--no-train-rows`` measures the loader rows alone (and the decode rows, unless ``--no-decode``):
no model is built and timm is not imported; ``--no-loader-rows`` the train rows alone.

``--budget-s S`` starts no row after S seconds and lists the rows it left out, so a run inside a
time-limited lease prints every finished row and says what is missing
(``benchmarks/gpu_campaign.py`` runs it that way).

MFU is achieved model FLOP/s (3 x the forward FLOPs of one image, counted by
``torch.utils.flop_counter``, x img/s) over two peaks, each named in its column header: the
dense bf16 matrix-multiply rate measured on this card in the same run, and the card
variant's dense bf16/fp16 spec peak (NVIDIA data sheet: H100 SXM 989, PCIe 756, NVL 835
TFLOP/s; fp16 rows use the same peaks). The header line names the card, its variant
(SXM/PCIe/NVL) and the driver.

The data: ``--make-data DIR`` writes an ImageNet-like set to the machine's local disk
(default 20,480 train JPEGs of 500x375, a quarter of them portrait, quality 90, 1,000 classes,
plus one val image per class; ~60-110 KB each, like ImageNet's), with every core.

    python benchmarks/throughput.py --make-data /local/jpegs --data-only  # once (~1 min, 16 cores)
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
import re
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch.utils.flop_counter import FlopCounterMode

from largebatch.data.synthetic import class_folder_name, render_image
from largebatch.engine.compile import compile_model, uses_cuda_graphs
from largebatch.optim import build_optimizer

DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
DALI_MIN_ITERS = 50  # DALI rows are timed over at least this many batches after warm-up
WIDTH, HEIGHT = 500, 375


@dataclass
class Row:
    kind: str  # decode | loader | train
    config: str
    img_per_s: float
    mfu_measured: Optional[float] = None
    mfu_spec: Optional[float] = None
    stall: Optional[float] = None
    data_wait: Optional[float] = None  # share of the timed steps' wall time spent in next()
    stages: Optional[dict[str, float]] = None  # the loader's ms per batch per stage
    mem_gib: Optional[float] = None


# Dense (no sparsity) bf16/fp16 tensor-core peak of each card variant, from NVIDIA's data
# sheets (half of the "with sparsity" figure): what "MFU of spec" divides by.
SPEC_PEAK_TFLOPS = {"H100 SXM": 989.4, "H100 PCIe": 756.5, "H100 NVL": 835.5, "H200 SXM": 989.4,
                    "H200 NVL": 835.5, "A100 SXM": 312.0, "A100 PCIe": 312.0}


def card_variant(name: str) -> Optional[str]:
    """``"H100 SXM"`` etc. from a CUDA device name (``NVIDIA H100 80GB HBM3`` is the SXM5 card;
    the PCIe and NVL cards say so); None for a card not in :data:`SPEC_PEAK_TFLOPS`."""
    for chip in ("H100", "H200", "A100"):
        if re.search(rf"\b{chip}\b", name):  # not GH200 (a Grace Hopper superchip)
            form = "NVL" if "NVL" in name else "PCIe" if "PCIE" in name.upper() else "SXM"
            return f"{chip} {form}"
    return None


def input_stall(img_per_s: float, synthetic_img_per_s: Optional[float]) -> Optional[float]:
    """``1 - img/s / synthetic img/s``: the share of the model-only rate the input pipeline
    costs (0 when the loader keeps up; at most 1). None without the synthetic row."""
    if not synthetic_img_per_s:
        return None
    return max(0.0, 1.0 - img_per_s / synthetic_img_per_s)


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


def make_data(root: Path, files: int, classes: int, workers: int, distinct: Optional[int] = None) -> None:
    """``files`` train JPEGs over ``classes`` class folders (and one val JPEG per class); with
    ``distinct``, only that many are written and the rest are hard links to them (each decodes
    as its original: the same work, written in a fraction of the time)."""
    per_class = -(-files // classes)
    unique = min(per_class, -(-distinct // classes)) if distinct else per_class
    t0 = time.perf_counter()
    with ProcessPoolExecutor(max_workers=workers) as pool:
        written = sum(pool.map(_write_class, [(str(root), c, unique, 0) for c in range(classes)]))
    size = sum(p.stat().st_size for p in root.rglob("*.JPEG"))
    links = 0
    for c in range(classes):
        folder = root / "train" / class_folder_name(c)
        for i in range(unique, per_class):
            os.link(folder / f"{c:04d}_{i % unique:05d}.JPEG", folder / f"{c:04d}_{i:05d}.JPEG")
            links += 1
    print(f"wrote {written:,} JPEGs ({size / written / 1024:.0f} KB mean) to {root} in "
          f"{time.perf_counter() - t0:.0f} s with {workers} processes"
          + (f"; {links:,} more train files hard-linked to them" if links else ""))


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
    iters = max(DALI_MIN_ITERS, len(files) // batch)  # the reader wraps around the files
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
    import timm

    model = timm.create_model(model_name, num_classes=1000).eval()
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(torch.randn(1, 3, image_size, image_size))
    return 3.0 * counter.get_total_flops()


def synthetic_batches(batch: int, size: int, device: torch.device, channels_last: bool,
                      dtype: Optional[torch.dtype] = None) -> Iterator:
    """One batch, forever, in the dtype the loaders give (the compute dtype: the same graph)."""
    images = torch.randn(batch, 3, size, size, device=device, dtype=dtype or torch.float32)
    if channels_last:
        images = images.contiguous(memory_format=torch.channels_last)
    labels = torch.randint(0, 1000, (batch,), device=device)
    return itertools.repeat((images, labels))


class LoaderProbe:
    """What a row reads of the loader behind its batches: the loader (its ``stage_times``, where
    it has them) and the epochs started."""

    def __init__(self) -> None:
        self.loader: Any = None
        self.epochs = 0

    def stage_times(self) -> Any:
        return getattr(self.loader, "stage_times", None)


def loader_batches(kind: str, args: argparse.Namespace, device: torch.device, channels_last: bool,
                   dtype: Optional[torch.dtype], probe: Optional[LoaderProbe] = None) -> Iterator:
    """Endless training batches on the device from the ``kind`` pipeline on ``args.root``."""
    from largebatch.data.contract import LoaderSpec

    spec = LoaderSpec(image_size=args.image_size, batch_size=args.batch, workers=args.workers,
                      device=device if device.type == "cuda" else torch.device("cpu"),
                      dtype=dtype or torch.float32, channels_last=channels_last)
    if kind == "dali":
        from largebatch.data.pipelines.dali_files import build_dali_loaders

        train, _, _ = build_dali_loaders(args.root, spec)
    elif kind in ("nvjpeg", "nvjpeg-serial"):
        from largebatch.data.pipelines.nvjpeg import build_nvjpeg_loaders

        train, _, _ = build_nvjpeg_loaders(args.root, spec, overlap=kind == "nvjpeg")
    elif kind == "decoded":
        from largebatch.data.pipelines.decoded import build_decoded_loaders

        train, _, _ = build_decoded_loaders(args.root, spec)  # the store is built on first use, before the rows
    else:
        from largebatch.data.pipelines.torchvision import build_loaders

        train, _, _ = build_loaders(args.root, spec)
    probe = probe or LoaderProbe()
    probe.loader = train
    for epoch in itertools.count():
        probe.epochs = epoch + 1
        train.set_epoch(epoch)
        for images, labels, *_ in train:  # already on the device for dali/nvjpeg: .to is a no-op
            images = images.to(device, non_blocking=True)
            if channels_last:
                images = images.contiguous(memory_format=torch.channels_last)
            yield images, labels.to(device, non_blocking=True)


def run_configs(model_name: str, datas: list[str], precision: str, channels_last: bool, compile_mode: str,
                optimizer: str, args: argparse.Namespace, device: torch.device) -> Iterator[Row]:
    """One ``train`` row per data kind in ``datas``, in that order, for one model x precision x
    layout x compile mode x optimizer. The model is built and compiled once and measured on each
    data kind in turn (a new input dtype costs one recompile, not a cold compile per row), so a
    lease spends its time on steps rather than on compiling the same graph again."""
    import timm  # here, not at the top: the loader and decode rows build no model

    torch.manual_seed(0)
    torch._dynamo.reset()  # fresh compile caches: no recompile limit carried over from other configs
    model = timm.create_model(model_name, num_classes=1000).to(device)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    opt = build_optimizer(optimizer, model, lr=0.1, weight_decay=5e-5, exclude_bn_bias=True, momentum=0.9)
    step_model = compile_model(model, compile_mode)
    graphs = uses_cuda_graphs(compile_mode) and device.type == "cuda"
    dtype = DTYPES[precision]
    scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")

    def step(images: torch.Tensor, labels: torch.Tensor) -> None:
        if graphs:
            torch.compiler.cudagraph_mark_step_begin()
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            loss = F.cross_entropy(step_model(images).float(), labels)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)

    for data in datas:
        probe = LoaderProbe()
        batches = (synthetic_batches(args.batch, args.image_size, device, channels_last, dtype) if data == "synthetic"
                   else loader_batches(data, args, device, channels_last, dtype, probe))
        yield measure(step, batches, data, args, device,
                      config_name(model_name, data, precision, channels_last, compile_mode, optimizer, args),
                      args.flops[model_name], probe)
        del batches
        gc.collect()  # stop this loader's worker processes before the next row


def config_name(model_name: str, data: str, precision: str, channels_last: bool, compile_mode: str,
                optimizer: str, args: argparse.Namespace) -> str:
    name = f"{model_name} {data} {precision} {'NHWC' if channels_last else 'NCHW'} "
    name += f"{'eager' if compile_mode == 'none' else 'compile=' + compile_mode} {optimizer}"
    if data != "synthetic":
        name += f" ({args.workers} {_workers_word(data)})"
    return name


def _workers_word(data: str) -> str:
    """What ``--workers`` counts for a pipeline: DataLoader processes, or threads."""
    return "threads" if data in ("dali", "decoded") else "workers"


def measure(step: Callable[[torch.Tensor, torch.Tensor], None], batches: Iterator, data: str,
            args: argparse.Namespace, device: torch.device, name: str, flops_per_image: float,
            probe: Optional[LoaderProbe] = None) -> Row:
    """Warm-up steps (compilation, cuDNN autotuning, loader start), then the timed steps, each
    figure of the row from them: img/s, the training thread's wait in ``next()``, the loader's
    stages per batch, the memory peak."""
    cuda = device.type == "cuda"
    sync = (lambda: torch.cuda.synchronize(device)) if cuda else (lambda: None)
    for _ in range(args.warmup):  # includes compilation and cuDNN autotuning
        step(*next(batches))
    sync()
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    times = probe.stage_times() if probe is not None else None
    if times is not None:
        times.reset()
    epochs = probe.epochs if probe is not None else 0
    steps, waited = timed_steps(data, args.steps), 0.0
    t0 = time.perf_counter()
    for _ in range(steps):
        before = time.perf_counter()
        batch = next(batches)
        waited += time.perf_counter() - before
        step(*batch)
    sync()
    window = time.perf_counter() - t0
    ips = steps * args.batch / window
    mem = torch.cuda.max_memory_allocated(device) / 2**30 if cuda else None
    flops = ips * flops_per_image
    if probe is not None and probe.epochs != epochs:
        name += " [an epoch boundary fell in the timed steps]"
    return Row("train", name, ips, flops / args.peak if args.peak else None,
               flops / args.spec_peak if args.spec_peak else None, None, waited / window,
               times.per_batch_ms() if times is not None else None, mem)


def timed_steps(data: str, steps: int) -> int:
    return max(steps, DALI_MIN_ITERS) if data == "dali" else steps


def loader_row(data: str, precision: str, channels_last: bool, args: argparse.Namespace,
               device: torch.device) -> Row:
    """Decode + augment only, no model: the rate the pipeline could feed (the input ceiling), and
    where a batch's time goes (the nvJPEG loaders' stages)."""
    probe = LoaderProbe()
    batches = loader_batches(data, args, device, channels_last, DTYPES[precision], probe)
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    for _ in range(args.warmup):
        next(batches)
    sync()
    times = probe.stage_times()
    if times is not None:
        times.reset()
    steps, epochs = timed_steps(data, args.steps), probe.epochs
    t0 = time.perf_counter()
    for _ in range(steps):
        next(batches)
    sync()
    ips = steps * args.batch / (time.perf_counter() - t0)
    stages = times.per_batch_ms() if times is not None else None
    crossed = probe.epochs != epochs
    del batches
    gc.collect()
    workers = f"{args.workers} {_workers_word(data)}"
    name = f"{data} {precision} {'NHWC' if channels_last else 'NCHW'}, no model ({workers})"
    return Row("loader", name + (" [an epoch boundary fell in the timed steps]" if crossed else ""), ips,
               stages=stages)


# ---------------------------------------------------------------------------------------


class Budget:
    """A wall-clock budget for the rows: once spent, the rows not started are listed, not measured
    (a lease that ends mid-table still leaves every finished row printed, and says what is missing)."""

    def __init__(self, seconds: Optional[float]) -> None:
        self.seconds, self.t0, self.skipped = seconds, time.perf_counter(), []

    def spent(self) -> bool:
        return self.seconds is not None and time.perf_counter() - self.t0 >= self.seconds

    def skip(self, what: str, rows: int = 1) -> None:
        self.skipped.append(f"{what} ({rows} row{'s' if rows > 1 else ''})")

    def report(self) -> None:
        if self.skipped:
            print(f"\nbudget of {self.seconds:.0f} s spent: not measured: " + "; ".join(self.skipped), flush=True)


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
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        gpu = (f"{name} (variant: {card_variant(name) or 'not in the spec table'}), CUDA {torch.version.cuda}, "
               f"driver {_driver_version()}")
    else:
        gpu = f"CPU ({platform.processor() or platform.machine()})"
    return (f"date {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {gpu}; {os.cpu_count()} CPUs; "
            f"torch {torch.__version__}, torchvision {torchvision.__version__}, timm {_version('timm')}, "
            f"DALI {dali}, Python {platform.python_version()}\ncommand: python {' '.join(sys.argv)}")


STAGES = ("device_wait", "decode", "augment", "ahead")


def stages_text(stages: Optional[dict[str, float]]) -> str:
    """``1.2 / 17.0 / 5.1 / 3.0``: the loader's ms per batch in :data:`STAGES` order; n/a for a
    loader without stage times."""
    if not stages:
        return "n/a"
    return " / ".join(f"{stages.get(stage, 0.0):.1f}" for stage in STAGES)


def _fmt(value: Optional[float], spec: str) -> str:
    return "n/a" if value is None else spec.format(value)


def argument_parser() -> argparse.ArgumentParser:
    """The command line (tests/test_gpu_campaign.py parses the GPU campaign's command lines with it)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--make-data", type=Path, default=None, help="write the JPEG set here first (then --root)")
    p.add_argument("--files", type=int, default=20480, help="train JPEGs to write with --make-data")
    p.add_argument("--distinct", type=int, default=None,
                   help="with --make-data: write this many distinct JPEGs, hard-link the rest up to --files")
    p.add_argument("--classes", type=int, default=1000)
    p.add_argument("--root", type=Path, default=None, help="ImageFolder root with train/ and val/")
    p.add_argument("--model", nargs="+", default=["resnet50"])
    p.add_argument("--data", nargs="+", default=["synthetic", "torchvision", "nvjpeg", "dali"],
                   choices=["synthetic", "torchvision", "nvjpeg", "nvjpeg-serial", "dali", "decoded"])
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
    p.add_argument("--no-loader-rows", action="store_true",
                   help="skip the loader-only rows (the train rows first: what a short GPU visit needs most)")
    p.add_argument("--no-train-rows", action="store_true",
                   help="skip the train rows: the loader-only rows (and decode rows) alone, no model built")
    p.add_argument("--budget-s", type=float, default=None,
                   help="start no row after this many seconds; list the rows left out (default: no limit)")
    p.add_argument("--data-only", action="store_true", help="with --make-data: write the JPEGs and stop")
    return p


def main(argv: Optional[list[str]] = None) -> int:
    p = argument_parser()
    args = p.parse_args(argv)
    budget = Budget(args.budget_s)
    # the names of the script's first version: eager / compiled
    args.compile = [{"eager": "none", "compiled": "default"}.get(c, c) for c in args.compile]
    device = torch.device(args.device)
    if args.make_data is not None:
        make_data(args.make_data, args.files, args.classes, args.workers, args.distinct)
        args.root = args.root or args.make_data
        if args.data_only:
            return 0
    if "dali" in args.data:
        from largebatch.data.pipelines.dali_graph import dali_available

        if not dali_available():
            print("DALI is not installed: no dali rows")
            args.data = [d for d in args.data if d != "dali"]
    if set(args.data) - {"synthetic"} and not args.root:
        p.error("--data torchvision/nvjpeg/dali/decoded needs --root (or --make-data)")
    if "decoded" in args.data:  # decode the store once now, not inside a timed row
        from largebatch.data.contract import LoaderSpec
        from largebatch.data.pipelines.decoded import ensure_decoded_stores

        t0 = time.perf_counter()
        ensure_decoded_stores(args.root, LoaderSpec(image_size=args.image_size, batch_size=args.batch,
                                                    workers=args.workers), announce=False)
        print(f"decoded store ready in {time.perf_counter() - t0:.1f} s (built once, then mapped)")
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    print(environment(device))
    args.peak = matmul_peak_flops(device)
    variant = card_variant(torch.cuda.get_device_name(device)) if device.type == "cuda" else None
    args.spec_peak = SPEC_PEAK_TFLOPS[variant] * 1e12 if variant in SPEC_PEAK_TFLOPS else None
    models = [] if args.no_train_rows else args.model
    args.flops = {m: train_flops_per_image(m, args.image_size) for m in models}
    measured = f"measured bf16 matmul {args.peak / 1e12:.0f} TFLOP/s" if args.peak else "measured matmul: n/a"
    spec = f"{variant} spec {args.spec_peak / 1e12:.0f} TFLOP/s" if args.spec_peak else "spec peak: n/a"
    print(f"MFU peaks: {measured}; {spec} (dense bf16/fp16, NVIDIA data sheet)")
    for m, f in args.flops.items():
        print(f"{m} @ {args.image_size}px: {f / 1e9:.2f} GFLOPs per training image")
    print(f"batch {args.batch} per GPU, {args.steps} timed steps after {args.warmup} warm-up steps "
          f"(DALI rows: at least {DALI_MIN_ITERS}); every column from the timed steps")
    print("throughput loss = 1 - img/s / synthetic img/s at the same model, precision, layout, compile mode and "
          "optimizer; data wait = share of the timed steps' wall time the training thread waited for a batch; "
          "loader ms per batch: the nvJPEG loader's stream wait / decode / augmentation (host) / time ahead\n")
    print(f"| kind | configuration | img/s | MFU ({measured}) | MFU ({spec}) | throughput loss "
          f"| data wait | loader ms per batch: wait / decode / augment / ahead | GPU mem peak (GiB) |")
    print("|---|---|---:|---:|---:|---:|---:|---|---:|")

    def show(r: Row) -> None:
        print(f"| {r.kind} | {r.config} | {r.img_per_s:,.0f} | {_fmt(r.mfu_measured, '{:.1%}')} "
              f"| {_fmt(r.mfu_spec, '{:.1%}')} | {_fmt(r.stall, '{:.1%}')} | {_fmt(r.data_wait, '{:.1%}')} "
              f"| {stages_text(r.stages)} | {_fmt(r.mem_gib, '{:.1f}')} |", flush=True)

    if args.root and not args.no_decode:
        for row in decode_rows(args.root, device, args.batch, args.workers):
            show(row)
    loaders = [d for d in args.data if d != "synthetic"]
    for data, prec, layout in itertools.product([] if args.no_loader_rows else loaders, args.precisions,
                                                args.layouts):
        if budget.spent():
            budget.skip(f"loader {data} {prec} {layout}")
        else:
            show(loader_row(data, prec, layout == "NHWC", args, device))
    if models and loaders and "synthetic" not in args.data:
        print("(synthetic rows added: the input stall is measured against them)")
    for model, prec, comp, layout, optim in itertools.product(
        models, args.precisions, args.compile, args.layouts, args.optimizers
    ):
        if budget.spent():
            budget.skip(config_name(model, "synthetic", prec, layout == "NHWC", comp, optim, args), len(loaders) + 1)
            continue
        ceiling = None
        for row in run_configs(model, ["synthetic", *loaders], prec, layout == "NHWC", comp, optim, args, device):
            if ceiling is None:
                ceiling = row
            else:
                row.stall = input_stall(row.img_per_s, ceiling.img_per_s)
            show(row)
    budget.report()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
