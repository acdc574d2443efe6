"""Input pipeline throughput: DALI (CPU, and GPU mixed decode) and the decoded store vs the torchvision DataLoader.

Both read the same JPEG files (ImageNet-like, 400x350, generated into a temporary folder
unless ``--root`` names an ImageFolder tree) and do the same training work at 224 px:
decode, random-resized crop, flip, normalise to float32, batch. Same number of CPU threads
(DALI) and worker processes (torchvision). Each pipeline runs a warm-up epoch, then
``--epochs`` timed epochs; the table shows the median epoch. The decoded store
(``data.loader=decoded``) decodes the files once, before its epochs (the time it took is in its
row), then cuts and augments each batch as a whole: one row with one thread, one with
``--threads`` batches augmented at once. Run:

    python benchmarks/input_pipeline.py                   # CPU: DALI vs torchvision
    python benchmarks/input_pipeline.py --device gpu      # + DALI mixed (nvJPEG / HW decoder)
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from largebatch.data.contract import LoaderSpec
from largebatch.data.pipelines.dali_files import build_dali_loaders
from largebatch.data.pipelines.dali_graph import dali_available
from largebatch.data.pipelines.decoded import build_decoded_loaders, ensure_decoded_stores
from largebatch.data.pipelines.torchvision import build_loaders
from largebatch.data.synthetic import class_folder_name, render_image

WIDTH, HEIGHT = 400, 350  # about ImageNet's mean train image size


def _write_class(job: tuple[str, int, int, int, int]) -> None:
    root, c, count, num_classes, seed = job
    for split in ("train", "val"):
        folder = Path(root, split, class_folder_name(c))
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(count if split == "train" else 1):
            rng = np.random.default_rng([seed, c, i])
            pixels = render_image(num_classes, c, rng, WIDTH)[:HEIGHT]
            Image.fromarray(pixels).save(folder / f"{c:04d}_{i:05d}.JPEG", quality=90)


def make_jpegs(root: str, images: int, classes: int = 8, workers: int = 2) -> None:
    """``images`` RGB JPEGs of 400x350 in ``root/train/<class>/`` (and one per class in val/)."""
    per_class = -(-images // classes)
    jobs = [(root, c, per_class, classes, 0) for c in range(classes)]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        list(pool.map(_write_class, jobs))


_TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds() -> float:
    """CPU time (user + system) of this process and its live children (DataLoader workers).

    Images per CPU-second is the per-core rate a fully busy core gives, whatever else runs on
    the machine; wall-clock img/s drops when other jobs share the cores.
    """
    me = os.getpid()
    total = 0.0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            fields = Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(entry.name) == me or int(fields[1]) == me:  # fields[1]: parent pid
            total += (int(fields[11]) + int(fields[12])) / _TICK  # utime + stime
    return total


def time_epochs(loader, epochs: int, sync) -> tuple[float, float]:
    """Median images per wall second and per CPU second over the timed epochs (after a warm-up)."""
    rates, per_cpu = [], []
    for epoch in range(epochs + 1):
        loader.set_epoch(epoch)
        cpu, start = cpu_seconds(), time.perf_counter()
        n = 0
        for images, _labels, *_ in loader:
            n += images.shape[0]
        sync()
        if epoch > 0:
            rates.append(n / (time.perf_counter() - start))
            per_cpu.append(n / max(cpu_seconds() - cpu, 1e-9))
    return statistics.median(rates), statistics.median(per_cpu)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", default=None, help="ImageFolder tree to read (default: generate)")
    parser.add_argument("--images", type=int, default=768, help="JPEGs to generate")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                        help="DALI CPU threads = DataLoader worker processes")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--epochs", type=int, default=3, help="timed epochs per pipeline")
    parser.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
    parser.add_argument("--hw-decoder-load", default="0,0.65,0.99",
                        help="comma-separated hw_decoder_load values for --device gpu")
    parser.add_argument("--skip-torchvision", action="store_true")
    args = parser.parse_args(argv)
    if not dali_available():
        print("NVIDIA DALI is not installed: pip install -e '.[dali]' (in the clone)", file=sys.stderr)
        return 2
    gpu = args.device == "gpu"
    if gpu and not torch.cuda.is_available():
        print("--device gpu needs a CUDA GPU", file=sys.stderr)
        return 2
    torch.set_num_threads(1)  # the main process only iterates
    with tempfile.TemporaryDirectory(prefix="lb-bench-") as tmp:
        root = args.root
        if root is None:
            root = tmp
            t = time.perf_counter()
            make_jpegs(root, args.images, workers=args.threads)
            print(f"wrote {args.images} JPEGs of {WIDTH}x{HEIGHT} in {time.perf_counter() - t:.1f} s")
        for path in Path(root, "train").rglob("*"):  # warm the page cache: time decoding, not disk
            if path.is_file():
                path.read_bytes()
        spec = LoaderSpec(image_size=args.image_size, batch_size=args.batch_size, workers=args.threads)
        rows: list[tuple[str, tuple[float, float]]] = []
        nosync = lambda: None  # noqa: E731
        if not args.skip_torchvision:
            train, _, _ = build_loaders(root, spec)
            rows.append((f"torchvision DataLoader ({args.threads} workers)",
                         time_epochs(train, args.epochs, nosync)))
            del train
        cache = Path(tmp, "decoded-stores")
        started = time.perf_counter()
        stores = ensure_decoded_stores(root, spec, cache=cache, announce=False)
        built = time.perf_counter() - started
        for threads in sorted({1, args.threads}):  # its augmenting threads: data.workers
            train, _, _ = build_decoded_loaders(root, replace(spec, workers=threads), cache=cache)
            rows.append((f"decoded store at {stores['train'].side} px, built in {built:.1f} s ({threads} thr.)",
                         time_epochs(train, args.epochs, nosync)))
            train.close()
            del train
        del stores
        train, _, _ = build_dali_loaders(root, spec)
        rows.append((f"DALI cpu ({args.threads} threads)",
                     time_epochs(train, args.epochs, nosync)))
        del train
        if gpu:
            for load in (float(x) for x in args.hw_decoder_load.split(",")):
                train, _, _ = build_dali_loaders(root, replace(spec, device="cuda:0"), hw_decoder_load=load)
                rows.append((f"DALI mixed, hw_decoder_load {load:g} ({args.threads} threads)",
                             time_epochs(train, args.epochs, torch.cuda.synchronize)))
                del train
        n_images = sum(1 for _ in Path(root, "train").rglob("*.JPEG"))
    base = rows[0][1][0] if not args.skip_torchvision else None
    print(f"\n{n_images} JPEGs, {WIDTH}x{HEIGHT} -> {args.image_size} px random-resized crop + flip + "
          f"normalise (float32), batch {args.batch_size}, median of {args.epochs} epochs, "
          f"{os.cpu_count()} CPUs visible")
    print("img/s/core: wall img/s / threads; img/CPU-s: images per CPU-second used (the per-core "
          "rate, unaffected by other jobs on the machine)")
    print(f"{'pipeline':<48} {'img/s':>8} {'img/s/core':>11} {'img/CPU-s':>10} {'vs torchvision':>15}")
    for name, (rate, per_cpu) in rows:
        ratio = f"{rate / base:.2f}x" if base else "-"
        print(f"{name:<48} {rate:>8.0f} {rate / args.threads:>11.0f} {per_cpu:>10.0f} {ratio:>15}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
