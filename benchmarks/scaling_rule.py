"""Small-scale test of the large-batch papers' lr-scaling claims, on this CPU.

Claims tested (Goyal et al. 2017, arXiv 1706.02677, sec. 2.1-2.2 and fig. 1; You et al. 2017,
arXiv 1708.03888; Ying et al. 2018, arXiv 1811.06992): at a fixed epoch budget, keeping the
small-batch learning rate at a large batch loses accuracy; scaling it linearly with the batch
recovers the small-batch accuracy, but only with a gradual warmup; LARS plus warmup holds up
further.

The regime is chosen to be the papers' one, in miniature: the largest batch is 5% of the
training set per step (ImageNet at 64k) and still gets >= 100 optimizer steps; every batch
divides the training set, so every recipe sees exactly the same number of images per epoch.

What is run: images drawn by the embedded synthetic generator
(``largebatch.data.synthetic.render_image``, 20 classes: 10 pattern families, each alone or
over a faint second texture) rendered straight into a uint8 tensor in memory (random crop and
flip per step), a 3-layer conv net with BN (width 16) defined here, and the project's
optimizers (``largebatch.optim``), lr scaling rule and schedules (``largebatch.lr``): poly
decay (power 2) after warmup, weight decay 5e-4 off BN and bias, momentum 0.9. Recipes:

  ``none``           SGD, the base lr at every batch (no scaling)
  ``linear``         SGD, lr x batch/base, no warmup
  ``linear+warmup``  SGD, lr x batch/base, linear warmup from the base lr over ``warmup_epochs``
  ``sqrt+warmup``    SGD, lr x sqrt(batch/base), the same warmup
  ``lars+warmup``    LARS (trust coefficient 0.001), lr x batch/base, the same warmup

At the base batch the SGD recipes are one run (no scaling; warmup from the base lr to itself).

The base lr of SGD and of LARS is tuned at the base batch first (``--stage sweep``: each lr of
``--sgd-sweep`` / ``--lars-sweep``, seed 0; best final top-1 wins), then the grid
(``--stage grid``) uses it. Rows go to a JSONL file as they finish; a row already there (same
recipe, batch, lr, seed) is not trained again, so parts can run in parallel and resume.

    python benchmarks/scaling_rule.py --stage sweep --optimizer sgd &     # the committed rows:
    python benchmarks/scaling_rule.py --stage sweep --optimizer lars; wait
    python benchmarks/scaling_rule.py --stage grid --batches 1024 64 &    # two parts in parallel
    python benchmarks/scaling_rule.py --stage grid --batches 256           # (a third, --batches 64
    wait                                                                   #  --seeds 2 1, took over
    python benchmarks/scaling_rule.py --render                             #  the tail of the first)
    python benchmarks/scaling_rule.py --quick           # smoke test: tiny set, 1 epoch, temp folder

Cost: one training is 102,400 images (5 epochs); 1-2.5 minutes each on the shared 2-core
machine with two at a time (batch 64 is the slowest, per-step overhead). The committed rows
(12 sweep and 34 grid trainings) took the wall time given in the README.

Writes ``benchmarks/results/scaling_rule.{jsonl,md,png}`` (``--out`` to change).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from largebatch.data.synthetic import _image_rng, render_image
from largebatch.lr import build_lr_scheduler, scale_lr
from largebatch.optim import build_optimizer

RECIPES = {
    # name: (optimizer, lr scaling rule, warmup?)
    "none": ("sgd", "none", False),
    "linear": ("sgd", "linear", False),
    "linear+warmup": ("sgd", "linear", True),
    "sqrt+warmup": ("sgd", "sqrt", True),
    "lars+warmup": ("lars", "linear", True),
}
SGD_RECIPES = ("none", "linear", "linear+warmup", "sqrt+warmup")
MEAN = torch.tensor([0.5, 0.5, 0.5]).view(1, 3, 1, 1)
STD = torch.tensor([0.25, 0.25, 0.25]).view(1, 3, 1, 1)


def make_split(split: str, classes: int, per_class: int, side: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Render ``classes * per_class`` images (uint8, N x 3 x side x side) and their labels."""
    pix = np.stack([render_image(classes, c, _image_rng(0, split, c, i), side)
                    for i in range(per_class) for c in range(classes)])
    labels = torch.arange(classes).repeat(per_class)
    return torch.from_numpy(pix).permute(0, 3, 1, 2).contiguous(), labels


def small_net(num_classes: int, width: int = 16) -> nn.Module:
    """conv-BN-ReLU x3 (width, 2x, 4x; max-pool between), global pool, linear."""
    def block(i: int, o: int) -> list[nn.Module]:
        return [nn.Conv2d(i, o, 3, padding=1, bias=False), nn.BatchNorm2d(o), nn.ReLU(inplace=True)]
    return nn.Sequential(*block(3, width), nn.MaxPool2d(2), *block(width, 2 * width), nn.MaxPool2d(2),
                         *block(2 * width, 4 * width), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(4 * width, num_classes))


def augment(images: torch.Tensor, crop: int, gen: torch.Generator) -> torch.Tensor:
    """Random crop of side ``crop`` and horizontal flip per image (vectorised), normalised."""
    n, _, h, w = images.shape
    ys = torch.randint(0, h - crop + 1, (n, 1), generator=gen) + torch.arange(crop)
    xs = torch.randint(0, w - crop + 1, (n, 1), generator=gen) + torch.arange(crop)
    flip = torch.rand(n, generator=gen) < 0.5
    xs = torch.where(flip[:, None], xs.flip(1), xs)
    out = images[torch.arange(n)[:, None, None], :, ys[:, :, None], xs[:, None, :]]  # n, c, c, 3
    return normalise(out.permute(0, 3, 1, 2))


def normalise(images: torch.Tensor) -> torch.Tensor:
    return (images.float() / 255.0 - MEAN) / STD


@torch.no_grad()
def accuracy(model: nn.Module, images: torch.Tensor, labels: torch.Tensor, crop: int) -> float:
    model.eval()
    off = (images.shape[-1] - crop) // 2
    x = normalise(images[..., off: off + crop, off: off + crop])
    correct = sum((model(x[i: i + 1000]).argmax(1) == labels[i: i + 1000]).sum().item()
                  for i in range(0, len(x), 1000))
    model.train()
    return 100.0 * correct / len(images)


def train_one(recipe: str, batch: int, base_lr: float, seed: int, *, data: dict[str, torch.Tensor],
              args: argparse.Namespace) -> dict[str, Any]:
    """Train one (recipe, batch, base lr, seed) point; return its row."""
    opt_name, rule, warm = RECIPES[recipe]
    n = len(data["train_y"])
    if n % batch:
        raise SystemExit(f"batch {batch} does not divide the {n} training images: every recipe must see them all")
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    model = small_net(args.classes)
    lr = scale_lr(base_lr, batch, args.base_batch, rule)
    options: dict[str, Any] = {"momentum": 0.9}
    if opt_name == "lars":
        options["trust_coefficient"] = 0.001
    opt = build_optimizer(opt_name, model, lr=lr, weight_decay=5e-4, exclude_bn_bias=True, **options)
    steps_per_epoch = n // batch
    sched = build_lr_scheduler(
        opt, name="poly", power=2.0, steps_per_epoch=steps_per_epoch, epochs=args.epochs,
        warmup_epochs=args.warmup_epochs if warm else 0.0, warmup_start_factor=base_lr / lr,
    )
    diverged = False
    t0 = time.perf_counter()
    for _ in range(args.epochs):
        perm = torch.randperm(n, generator=gen)
        for s in range(steps_per_epoch):
            idx = perm[s * batch: (s + 1) * batch]
            loss = F.cross_entropy(model(augment(data["train_x"][idx], args.crop, gen)), data["train_y"][idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
        if not math.isfinite(loss.item()):
            diverged = True
            break
    top1 = 0.0 if diverged else accuracy(model, data["val_x"], data["val_y"], args.crop)
    return {"recipe": recipe, "batch": batch, "base_lr": base_lr, "lr": round(lr, 6), "seed": seed,
            "steps": steps_per_epoch * args.epochs, "images": steps_per_epoch * args.epochs * batch,
            "top1": round(top1, 2), "diverged": diverged, "seconds": round(time.perf_counter() - t0, 1)}


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a rows file, one per (stage, recipe, batch, base lr, seed): parts run in
    parallel may both have trained the same point; the first row written counts."""
    if not path.exists():
        return []
    rows: dict[tuple, dict[str, Any]] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("{"):
            r = json.loads(line)
            rows.setdefault((r["stage"], r["recipe"], r["batch"], r["base_lr"], r["seed"]), r)
    return list(rows.values())


def best_lr(rows: list[dict[str, Any]], optimizer: str, base_batch: int) -> float:
    """The sweep's winner: the base lr with the best final top-1 at the base batch."""
    recipe = "lars+warmup" if optimizer == "lars" else "none"
    pts = [r for r in rows if r.get("stage") == "sweep" and r["recipe"] == recipe and r["batch"] == base_batch]
    if not pts:
        raise SystemExit(f"no {optimizer} sweep rows in the rows file: run --stage sweep --optimizer {optimizer} first")
    return max(pts, key=lambda r: r["top1"])["base_lr"]


def cell(rows: list[dict[str, Any]], recipe: str, batch: int, base_batch: int) -> list[dict[str, Any]]:
    """The grid rows of one cell; at the base batch the SGD recipes share the ``none`` run."""
    name = "none" if batch == base_batch and recipe in SGD_RECIPES else recipe
    return [r for r in rows if r.get("stage") == "grid" and r["recipe"] == name and r["batch"] == batch]


def write_report(args: argparse.Namespace, rows: list[dict[str, Any]]) -> None:
    """Markdown table (mean +- sample std over seeds, min..max) and plot with error bars."""
    grid = [r for r in rows if r.get("stage") == "grid"]
    batches = sorted({r["batch"] for r in grid})
    n_train = args.classes * args.train_per_class
    lines = ["# Final top-1 vs global batch size at a fixed epoch budget", "",
             f"Rows: `{args.out.with_suffix('.jsonl').name}`. Command: see the module docstring of "
             "`benchmarks/scaling_rule.py` (sweep, then grid, then `--render`).", "",
             f"Small conv net, {args.classes} classes, {n_train} training / {args.classes * args.val_per_class} "
             f"validation images ({args.side}px stored, {args.crop}px crops), {args.epochs} epochs for every run, "
             f"poly decay (power 2), warmup {args.warmup_epochs} epoch(s) from the base lr where used, "
             f"base batch {args.base_batch}.", "", "## Base-lr sweep at the base batch (seed 0)", "",
             "| optimizer | base lr | top-1 |", "|---|---:|---:|"]
    for r in sorted((r for r in rows if r.get("stage") == "sweep"), key=lambda r: (r["recipe"], r["base_lr"])):
        opt = "LARS" if r["recipe"] == "lars+warmup" else "SGD"
        lines.append(f"| {opt} | {r['base_lr']} | {'div' if r['diverged'] else r['top1']} |")
    lines += ["", "## Grid: top-1 (%), mean +- std over seeds [min, max]", "",
              "| global batch | batch / data set | steps | " + " | ".join(RECIPES) + " |",
              "|---:|---:|---:|" + "---:|" * len(RECIPES)]
    for b in batches:
        cells = []
        for rec in RECIPES:
            v = [r["top1"] for r in cell(grid, rec, b, args.base_batch)]
            if not v:
                cells.append("-")
                continue
            sd = statistics.stdev(v) if len(v) > 1 else 0.0
            cells.append(f"{statistics.mean(v):.1f} +- {sd:.1f} [{min(v):.1f}, {max(v):.1f}] (n={len(v)})")
        steps = next(r["steps"] for r in grid if r["batch"] == b)
        lines.append(f"| {b} | {100 * b / n_train:.1f}% | {steps} | " + " | ".join(cells) + " |")
    swept = {(r["recipe"], r["batch"], r["base_lr"], r["seed"]) for r in rows if r["stage"] == "sweep"}
    trained = [r for r in rows if r["stage"] == "sweep" or (r["recipe"], r["batch"], r["base_lr"], r["seed"]) not in swept]
    cpu_s = sum(r["seconds"] for r in trained)
    lines += ["", f"Training time summed over the {len(trained)} trainings ({len(rows) - len(trained)} grid rows "
              f"reuse the sweep's run): {cpu_s / 60:.1f} min (two at a time on a shared 2-core machine; "
              "see the README for the wall time)."]
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot", file=sys.stderr)
        return
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for i, rec in enumerate(RECIPES):
        xs, ms, sds = [], [], []
        for b in batches:
            v = [r["top1"] for r in cell(grid, rec, b, args.base_batch)]
            if v:
                xs.append(b * (1 + 0.03 * (i - 2)))  # small offsets so error bars do not overlap
                ms.append(statistics.mean(v))
                sds.append(statistics.stdev(v) if len(v) > 1 else 0.0)
        ax.errorbar(xs, ms, yerr=sds, marker="o", capsize=3, label=rec)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("global batch size")
    ax.set_ylabel("final val top-1 (%), mean +- std over seeds")
    ax.set_title(f"{args.epochs} epochs at every batch")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out.with_suffix(".png"), dpi=90)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--stage", choices=["sweep", "grid"], default="grid")
    p.add_argument("--optimizer", choices=["sgd", "lars"], default="sgd", help="which lr --stage sweep tunes")
    p.add_argument("--sgd-sweep", type=float, nargs="+", default=[0.025, 0.05, 0.1, 0.2, 0.4, 0.8])
    p.add_argument("--lars-sweep", type=float, nargs="+", default=[0.25, 0.5, 1.0, 2.0, 4.0, 8.0])
    p.add_argument("--batches", type=int, nargs="+", default=[64, 256, 1024])
    p.add_argument("--base-batch", type=int, default=64)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--warmup-epochs", type=float, default=1.0)
    p.add_argument("--classes", type=int, default=20)
    p.add_argument("--train-per-class", type=int, default=1024)
    p.add_argument("--val-per-class", type=int, default=150)
    p.add_argument("--side", type=int, default=20)
    p.add_argument("--crop", type=int, default=16)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--recipes", nargs="+", default=list(RECIPES), choices=list(RECIPES))
    p.add_argument("--quick", action="store_true", help="smoke test: 20x32 images, 1 epoch, batches 16 and 64")
    p.add_argument("--render", action="store_true", help="no training: table and plot from the rows file")
    p.add_argument("--out", type=Path, default=None,
                   help="rows/table/plot path without suffix (default: benchmarks/results/scaling_rule; "
                        "with --quick, scaling_rule_quick in the temp folder)")
    args = p.parse_args(argv)
    if args.quick:
        args.train_per_class, args.val_per_class, args.epochs, args.base_batch = 32, 8, 1, 16
        args.batches, args.sgd_sweep, args.lars_sweep, args.seeds = [16, 64], [0.1], [1.0], [0]
    if args.out is None:  # a smoke test must not append to the committed rows
        args.out = (Path(tempfile.gettempdir()) / "scaling_rule_quick" if args.quick
                    else Path(__file__).parent / "results" / "scaling_rule")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    rows_path = args.out.with_suffix(".jsonl")
    if args.render:
        write_report(args, read_rows(rows_path))
        print(args.out.with_suffix(".md").read_text(), flush=True)
        return 0
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    t0 = time.perf_counter()
    train_x, train_y = make_split("train", args.classes, args.train_per_class, args.side)
    val_x, val_y = make_split("val", args.classes, args.val_per_class, args.side)
    data = {"train_x": train_x, "train_y": train_y, "val_x": val_x, "val_y": val_y}
    print(f"{len(train_y)} training / {len(val_y)} validation images rendered in {time.perf_counter() - t0:.0f} s",
          flush=True)

    if args.stage == "sweep":
        recipe = "lars+warmup" if args.optimizer == "lars" else "none"
        jobs = [(recipe, args.base_batch, lr, 0) for lr in (args.lars_sweep if args.optimizer == "lars" else args.sgd_sweep)]
    else:
        rows = read_rows(rows_path)
        lrs = {"sgd": best_lr(rows, "sgd", args.base_batch), "lars": best_lr(rows, "lars", args.base_batch)}
        print(f"base lr per {args.base_batch} images from the sweep: SGD {lrs['sgd']}, LARS {lrs['lars']}", flush=True)
        jobs = [(rec, b, lrs[RECIPES[rec][0]], seed) for seed in args.seeds for b in args.batches for rec in args.recipes
                if not (b == args.base_batch and rec in SGD_RECIPES[1:])]  # the base-batch SGD run is ``none``
    for recipe, batch, lr, seed in jobs:
        rows = read_rows(rows_path)
        same = [r for r in rows if r["recipe"] == recipe and r["batch"] == batch and r["base_lr"] == lr
                and r["seed"] == seed]
        if any(r["stage"] == args.stage for r in same):
            continue
        if same:  # the sweep's winner at the base batch, seed 0, is the grid's run: same settings
            row = dict(same[0], stage=args.stage)
        else:
            row = dict(train_one(recipe, batch, lr, seed, data=data, args=args), stage=args.stage)
        with rows_path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
        print(json.dumps(row), flush=True)
    print(f"wall {time.perf_counter() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
