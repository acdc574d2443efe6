"""Training augmentation on the CPU: per batch from a decoded store vs torchvision's per-sample transforms.

The same decoded images (the embedded set generated at the stored side, decoded once by
``largebatch.data.decoded_store.decode_split``) are augmented into batches of random-resized
crops, flipped and normalised, by:

* ``batched``: ``largebatch.data.batched_crop.augment_same_size``, what the decoded loader runs:
  boxes for the batch, the resize it picks by side (below), flip by index, one normalise
  (float32 out); the batch's uint8 pixels gathered from the store by index first, as a loader
  would;
* ``roi_align`` and ``each image uint8``: the same with each resize forced: one ``roi_align``
  call for the batch (``resized_crops``), or each uint8 crop by its own ``F.interpolate`` call
  (``resized_crops_each``: torch's vectorised antialiased bilinear kernel, the one torchvision
  v2 uses for tensors), which ``augment_same_size`` uses for uint8 images;
* ``per-sample v2``: the torchvision loader's transform (``build_train_transform``: v2
  ``RandomResizedCrop`` antialiased, flip, ``PILToTensor``, ``ToDtype``, ``Normalize``) on each
  PIL image, then ``torch.stack`` (the collate), i.e. the loader's work per batch minus the JPEG
  decode;
* ``per-sample v1``: the classic ``RandomResizedCrop`` + ``RandomHorizontalFlip`` + ``ToTensor`` +
  ``Normalize`` on each PIL image, then ``torch.stack``;

Images/s of each, per wall second and per CPU second of the process (with one thread, the work
itself, which other jobs on a shared machine disturb less), over ``--batches`` batches per
round, rounds interleaved (every path once per round, in turn) after one warm-up round; the
median of ``--rounds``. ``--threads 1`` (default) measures one core, as a DataLoader worker runs.

    python benchmarks/cpu_input.py                      # 48 -> 32 and 160 -> 128, batch 128
    python benchmarks/cpu_input.py --cases 64:48,96:80,112:96,160:128,256:224
    python benchmarks/cpu_input.py --cases 64:56 --rounds 9
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from typing import Callable, Optional

import numpy as np
import torch
from PIL import Image
from torchvision import transforms as v1

from largebatch.data.augment import (
    IMAGENET_DEFAULT_MEAN,
    IMAGENET_DEFAULT_STD,
    CropRecipe,
    build_train_transform,
    normalise_cast,
)
from largebatch.data.batched_crop import (
    augment_same_size,
    draw_flips,
    flip_rows,
    random_resized_crop_boxes,
    resized_crops,
    resized_crops_each,
)
from largebatch.data.decoded_store import DecodedStore, decode_split
from largebatch.data.synthetic import make_synthetic_imagenet


def _batched(store: DecodedStore, side: int, generator: torch.Generator) -> Callable[[np.ndarray], torch.Tensor]:
    def run(rows: np.ndarray) -> torch.Tensor:
        images, _ = store.batch(rows)
        return augment_same_size(images, CropRecipe(side), generator=generator)
    return run


def _per_sample(pil: list[Image.Image], transform: Callable) -> Callable[[np.ndarray], torch.Tensor]:
    def run(rows: np.ndarray) -> torch.Tensor:
        return torch.stack([transform(pil[k]) for k in rows])
    return run


def _per_sample_uint8(store: DecodedStore, side: int, generator: torch.Generator) -> Callable[[np.ndarray], torch.Tensor]:
    def run(rows: np.ndarray) -> torch.Tensor:
        images, _ = store.batch(rows)
        boxes = random_resized_crop_boxes(len(rows), store.side, store.side, generator=generator)
        flips = draw_flips(len(rows), generator=generator)
        return normalise_cast(flip_rows(resized_crops_each(images, boxes, side), flips), IMAGENET_DEFAULT_MEAN,
                              IMAGENET_DEFAULT_STD, torch.float32)
    return run


def _roi_align(store: DecodedStore, side: int, generator: torch.Generator) -> Callable[[np.ndarray], torch.Tensor]:
    def run(rows: np.ndarray) -> torch.Tensor:
        images, _ = store.batch(rows)
        boxes = random_resized_crop_boxes(len(rows), store.side, store.side, generator=generator)
        flips = draw_flips(len(rows), generator=generator)
        return normalise_cast(flip_rows(resized_crops(images, boxes, side), flips), IMAGENET_DEFAULT_MEAN,
                              IMAGENET_DEFAULT_STD, torch.float32)
    return run


def measure(paths: dict[str, Callable[[np.ndarray], torch.Tensor]], batches: list[np.ndarray],
            rounds: int) -> dict[str, tuple[float, float]]:
    """``(wall, cpu)``: the median images per wall second and per CPU second of this process
    (one thread: the work, whatever else the machine runs) of each path, over ``rounds``
    interleaved rounds after one warm-up."""
    rates: dict[str, list[tuple[float, float]]] = {name: [] for name in paths}
    images = sum(len(b) for b in batches)
    for r in range(rounds + 1):
        for name, run in paths.items():
            wall, cpu = time.perf_counter(), time.process_time()
            for rows in batches:
                run(rows)
            if r:
                rates[name].append((images / (time.perf_counter() - wall), images / (time.process_time() - cpu)))
    return {name: (statistics.median(w for w, _ in values), statistics.median(c for _, c in values))
            for name, values in rates.items()}


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", default="48:32,160:128", help="stored:side pairs, comma-separated")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--batches", type=int, default=4, help="batches per round")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--per-class", type=int, default=52, help="images per class of the 10-class set")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} thread(s), batch {args.batch}, {args.batches} batches a "
          f"round, median of {args.rounds} interleaved rounds; load average at start "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print("each cell: images per wall second (per CPU second of this process: the work alone, less "
          "sensitive to other jobs); store decode: per wall second")
    print("| stored -> side | batched | roi_align | each image uint8 | per-sample v2 | per-sample v1 "
          "| batched / v2 | store decode |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    normalize = v1.Normalize(IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD)
    for case in args.cases.split(","):
        stored, side = (int(v) for v in case.split(":"))
        with tempfile.TemporaryDirectory(prefix="cpu-input-") as tmp:
            root = make_synthetic_imagenet(os.path.join(tmp, "set"), num_classes=10, train_per_class=args.per_class,
                                           val_per_class=1, image_size=stored)
            start = time.perf_counter()
            store = decode_split(root, "train", side=stored)
            decode_rate = len(store) / (time.perf_counter() - start)
        pil = [Image.fromarray(np.ascontiguousarray(image.transpose(1, 2, 0))) for image in store.images]
        order = np.random.default_rng(0).permutation(np.resize(np.arange(len(store)), args.batch * args.batches))
        batches = [order[k * args.batch : (k + 1) * args.batch] for k in range(args.batches)]
        classic = v1.Compose([v1.RandomResizedCrop(side), v1.RandomHorizontalFlip(), v1.ToTensor(), normalize])
        rates = measure({
            "batched": _batched(store, side, torch.Generator().manual_seed(0)),
            "v2": _per_sample(pil, build_train_transform(side)),
            "v1": _per_sample(pil, classic),
            "roi_align": _roi_align(store, side, torch.Generator().manual_seed(0)),
            "uint8": _per_sample_uint8(store, side, torch.Generator().manual_seed(0)),
        }, batches, args.rounds)
        cells = " | ".join(f"{rates[k][0]:,.0f} ({rates[k][1]:,.0f})" for k in ("roi_align", "uint8", "v2", "v1"))
        print(f"| {stored} -> {side} | {rates['batched'][0]:,.0f} ({rates['batched'][1]:,.0f}) | {cells} "
              f"| {rates['batched'][0] / rates['v2'][0]:.1f}x "
              f"({rates['batched'][1] / rates['v2'][1]:.1f}x) | {decode_rate:,.0f} |", flush=True)
    print(f"load average at end {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
