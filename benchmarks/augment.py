"""Augmentation of one decoded batch: image by image (``augment_each``) vs batched (``augment_batch``).

Decoded uint8 images of 500x375 (a quarter portrait, like ``throughput.py --make-data``) are
cut, resized to ``--size`` and flipped by both paths, training and evaluation geometry; the
table shows the median time per batch over ``--rounds`` after one warm-up round.

    python benchmarks/augment.py --device cpu --batch 256 --rounds 5
    python benchmarks/augment.py --device cuda --batch 256 --rounds 20
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable, Optional

import torch

from largebatch.data.augment import CropRecipe, augment_batch, augment_each


def median_ms(fn: Callable[[], torch.Tensor], rounds: int, device: torch.device) -> float:
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    fn()
    sync()
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args(argv)
    device = torch.device(args.device)
    g = torch.Generator().manual_seed(0)
    images = [torch.randint(0, 256, (3, 500, 375) if i % 4 == 3 else (3, 375, 500), dtype=torch.uint8,
                            generator=g).to(device) for i in range(args.batch)]
    indices = list(range(args.batch))
    print(f"torch {torch.__version__}, device {device}, threads {torch.get_num_threads()}, batch {args.batch} "
          f"of 500x375 -> {args.size}, median of {args.rounds}")
    print("| geometry | image by image (ms) | batched (ms) | max abs difference (0..255) |")
    print("|---|---:|---:|---:|")
    for train in (True, False):
        kw = dict(recipe=CropRecipe(args.size), train=train, epoch=0, seed=0)
        each = median_ms(lambda: augment_each(images, indices, **kw), args.rounds, device)
        batched = median_ms(lambda: augment_batch(images, indices, **kw), args.rounds, device)
        diff = (augment_each(images, indices, **kw) - augment_batch(images, indices, **kw)).abs().max()
        print(f"| {'train' if train else 'val'} | {each:.1f} | {batched:.1f} | {float(diff):.4f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
