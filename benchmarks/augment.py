"""Augmentation of one decoded batch: image by image (``augment_each``) vs batched (``augment_batch``).

Decoded uint8 images of 500x375 (a quarter portrait, like ``throughput.py --make-data``) are
cut, resized to ``--size`` and flipped by both paths, training and evaluation geometry; the
table shows the median time per batch over ``--rounds`` after one warm-up round.

``--host``: the host time of a batch instead, what the decode thread pays in Python and
dispatch: the same batch with every image 25x smaller per side (20x15, resized to ``--size``
/ 25) and the group budget 625x smaller, so the batch splits into the same groups as at full
size and the kernels are negligible; on one CPU thread, with the kernels (non-view operators)
each path runs per batch.

    python benchmarks/augment.py --device cpu --batch 256 --rounds 5
    python benchmarks/augment.py --device cpu --batch 256 --rounds 30 --host
    python benchmarks/augment.py --device cuda --batch 256 --rounds 20
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable, Optional

import torch

from torch.utils._python_dispatch import TorchDispatchMode

from largebatch.data.augment import GROUP_PIXELS, CropRecipe, augment_batch, augment_each
from largebatch.data.batched_resize import group_by_area

SHRINK = 25  # --host: each side this many times smaller (area 625x)


class KernelCount(TorchDispatchMode):
    """Counts the aten operators run that are not views."""

    def __init__(self) -> None:
        super().__init__()
        self.kernels = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.kernels += not func.is_view
        return func(*args, **(kwargs or {}))


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
    p.add_argument("--host", action="store_true", help="host time per batch (images 25x smaller per side)")
    args = p.parse_args(argv)
    if args.host:
        return host_table(args)
    device = torch.device(args.device)
    g = torch.Generator().manual_seed(0)
    images = [torch.randint(0, 256, (3, 500, 375) if i % 4 == 3 else (3, 375, 500), dtype=torch.uint8,
                            generator=g).to(device) for i in range(args.batch)]
    print(f"torch {torch.__version__}, device {device}, threads {torch.get_num_threads()}, batch {args.batch} "
          f"of 500x375 -> {args.size}, median of {args.rounds}")
    print("| geometry | image by image (ms) | batched (ms) | max abs difference (0..255) |")
    print("|---|---:|---:|---:|")
    for train in (True, False):
        kw = dict(recipe=CropRecipe(args.size), train=train)
        draw = lambda: torch.Generator().manual_seed(0)  # noqa: E731
        each = median_ms(lambda: augment_each(images, generator=draw(), **kw), args.rounds, device)
        batched = median_ms(lambda: augment_batch(images, generator=draw(), **kw), args.rounds, device)
        diff = (augment_each(images, generator=draw(), **kw) - augment_batch(images, generator=draw(), **kw)).abs().max()
        print(f"| {'train' if train else 'val'} | {each:.1f} | {batched:.1f} | {float(diff):.4f} |")
    return 0


def host_table(args: argparse.Namespace) -> int:
    """The host time of one batch of each path (see the module docstring)."""
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    h, w = 375 // SHRINK, 500 // SHRINK
    images = [torch.randint(0, 256, (3, w, h) if i % 4 == 3 else (3, h, w), dtype=torch.uint8, generator=g)
              for i in range(args.batch)]
    max_pixels = GROUP_PIXELS // SHRINK**2
    groups = len(group_by_area([(375, 500) if i % 4 else (500, 375) for i in range(args.batch)], GROUP_PIXELS))
    assert len(group_by_area([tuple(i.shape[-2:]) for i in images], max_pixels)) == groups
    print(f"torch {torch.__version__}, CPU, 1 thread, batch {args.batch} of {w}x{h} -> {args.size // SHRINK} "
          f"(500x375 -> {args.size}, {SHRINK}x smaller per side), {groups} groups, median of {args.rounds}")
    print("| geometry | path | host ms per batch | kernels per batch |")
    print("|---|---|---:|---:|")
    device = torch.device("cpu")
    for train in (True, False):
        recipe = CropRecipe(args.size // SHRINK)
        paths = {"image by image": lambda: augment_each(images, recipe, train=train, generator=draw()),
                 "batched": lambda: augment_batch(images, recipe, train=train, generator=draw(),
                                                  max_pixels=max_pixels)}
        for name, run in paths.items():
            draw = lambda: torch.Generator().manual_seed(0)  # noqa: E731
            ms = median_ms(run, args.rounds, device)
            with KernelCount() as count:
                run()
            print(f"| {'train' if train else 'val'} | {name} | {ms:.2f} | {count.kernels} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
