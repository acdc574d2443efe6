"""Small-scale reproduction of the large-batch papers' central claim, on this CPU.

Claim (Goyal et al. 2017, arXiv 1706.02677, fig. 1 and table 2; You et al. 2017, arXiv
1708.03888; Jia et al. 2018, arXiv 1807.11205; Ying et al. 2018, arXiv 1811.06992): with a
fixed epoch budget, growing the global batch while keeping the small-batch learning rate
loses accuracy; scaling the lr linearly with the batch recovers it up to some batch size,
but only with a gradual warmup; beyond that, LARS (layer-wise trust ratios) plus warmup
goes further.

What is run: the embedded synthetic ImageNet-style set (``largebatch.data.synthetic``),
decoded once into memory (random crop + flip per step, so the input pipeline does not
dominate a 2-core CPU), timm ``resnet10t`` from ``largebatch.models``, the project's
optimizers (``largebatch.optim``), lr scaling rule and schedules (``largebatch.lr``). Every
run trains the same number of epochs; only the global batch and the recipe change:

  a. ``none``:        SGD, the base lr at every batch (no scaling), cosine decay
  b. ``linear``:      SGD, lr x batch/base, cosine decay, no warmup
  c. ``linear+warmup``: as b, plus linear warmup over the first ``warmup_epochs``
  d. ``lars+warmup``: LARS, lr x batch/base, the same warmup and decay

The batch/data-set ratio is what matters (ImageNet at batch 8k is 0.6% of the data set per
step; at 64k, 5%). Here the data set is small, so batches from 1% to ~40% of it span the
regime from "many steps per epoch" to "a handful of steps per epoch".

    python benchmarks/scaling_rule.py                  # the table: 14 trainings
    python benchmarks/scaling_rule.py --quick          # 2 batch sizes, 2 epochs: a smoke test
    python benchmarks/scaling_rule.py --batches 1024 & python benchmarks/scaling_rule.py --batches 32 &
    python benchmarks/scaling_rule.py --render rows.jsonl   # merge the printed rows of parallel parts

Cost: one training is 6 epochs of 2,600 images at 24 px; on an idle 2-core CPU about 1
minute at batch >= 256 and 3-4 minutes at batch 32 (per-step overhead), so the default grid
is about 20 minutes; on a shared machine expect more (the committed table took longer).

Learning rates are not tuned per recipe (tuning each point would measure the tuner): SGD uses
0.05 per 32 images (0.4 per 256), a usual small-batch value; LARS uses 0.25 per 32 images
with trust coefficient 0.001, the first value tried (one calibration run at batch 1,024).
At the base batch the three SGD recipes are the same run (no scaling, warmup from 1/1), so
it is trained once and reported in all three columns.

Writes ``benchmarks/results/scaling_rule.md`` and ``.png`` (``--out`` to change).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import torch
import torch.nn.functional as F

from largebatch.data.synthetic import ensure_synthetic
from largebatch.lr import build_lr_scheduler, scale_lr
from largebatch.models import build_model
from largebatch.optim import build_optimizer

RECIPES = {
    # name: (optimizer, lr scaling rule, warmup?)
    "none": ("sgd", "none", False),
    "linear": ("sgd", "linear", False),
    "linear+warmup": ("sgd", "linear", True),
    "lars+warmup": ("lars", "linear", True),
}
SGD_AT_BASE = ("none", "linear", "linear+warmup")
MEAN = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)
STD = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)


def load_split(root: Path, split: str, side: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Decode one split of an ImageFolder tree into uint8 (N, 3, side, side) and labels."""
    from torchvision.datasets import ImageFolder
    from torchvision.transforms import v2

    from largebatch.data.folder import load_rgb

    tf = v2.Compose([v2.Resize((side, side), antialias=True), v2.PILToTensor()])
    ds = ImageFolder(str(root / split), loader=load_rgb, transform=tf)
    images = torch.stack([ds[i][0] for i in range(len(ds))])
    labels = torch.tensor(ds.targets)
    return images, labels


def augment(images: torch.Tensor, crop: int, gen: torch.Generator) -> torch.Tensor:
    """Random crop of side ``crop`` and horizontal flip per image, then normalise."""
    n, _, h, w = images.shape
    ys = torch.randint(0, h - crop + 1, (n,), generator=gen)
    xs = torch.randint(0, w - crop + 1, (n,), generator=gen)
    flip = torch.rand(n, generator=gen) < 0.5
    out = torch.empty(n, 3, crop, crop, dtype=torch.uint8)
    for i in range(n):
        patch = images[i, :, ys[i]: ys[i] + crop, xs[i]: xs[i] + crop]
        out[i] = patch.flip(-1) if flip[i] else patch
    return normalise(out)


def normalise(images: torch.Tensor) -> torch.Tensor:
    return (images.float() / 255.0 - MEAN) / STD


def centre(images: torch.Tensor, crop: int) -> torch.Tensor:
    off = (images.shape[-1] - crop) // 2
    return normalise(images[..., off: off + crop, off: off + crop])


@torch.no_grad()
def accuracy(model: torch.nn.Module, images: torch.Tensor, labels: torch.Tensor, crop: int) -> float:
    model.eval()
    correct = 0
    for i in range(0, len(images), 500):
        logits = model(centre(images[i: i + 500], crop))
        correct += (logits.argmax(1) == labels[i: i + 500]).sum().item()
    model.train()
    return 100.0 * correct / len(images)


def train_one(
    recipe: str,
    batch: int,
    *,
    data: dict[str, torch.Tensor],
    num_classes: int,
    epochs: int,
    base_batch: int,
    sgd_lr: float,
    lars_lr: float,
    warmup_epochs: float,
    crop: int,
    seed: int,
) -> dict[str, Any]:
    """Train one (recipe, batch) point; return final/best top-1 and whether it diverged."""
    opt_name, rule, warm = RECIPES[recipe]
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    model = build_model("resnet10t", num_classes, zero_init_last_bn_gamma=True)
    base_lr = lars_lr if opt_name == "lars" else sgd_lr
    lr = scale_lr(base_lr, batch, base_batch, rule)
    options: dict[str, Any] = {"momentum": 0.9}
    if opt_name == "lars":
        options["trust_coefficient"] = 0.001
    opt = build_optimizer(opt_name, model, lr=lr, weight_decay=5e-4, exclude_bn_bias=True, **options)
    n = len(data["train_y"])
    steps_per_epoch = n // batch
    sched = build_lr_scheduler(
        opt, name="cosine", steps_per_epoch=steps_per_epoch, epochs=epochs,
        warmup_epochs=warmup_epochs if warm else 0.0, warmup_start_factor=1.0 / max(1, batch // base_batch),
    )
    diverged = False
    t0 = time.perf_counter()
    for _ in range(epochs):
        perm = torch.randperm(n, generator=gen)
        for s in range(steps_per_epoch):
            idx = perm[s * batch: (s + 1) * batch]
            x = augment(data["train_x"][idx], crop, gen)
            loss = F.cross_entropy(model(x), data["train_y"][idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
        if not math.isfinite(loss.item()):
            diverged = True
            break
    top1 = 0.0 if diverged else accuracy(model, data["val_x"], data["val_y"], crop)
    return {
        "recipe": recipe, "batch": batch, "lr": lr, "steps": steps_per_epoch * epochs,
        "top1": round(top1, 2), "diverged": diverged, "seconds": round(time.perf_counter() - t0, 1),
    }


def write_markdown(path: Path, rows: list[dict[str, Any]], args: argparse.Namespace, n_train: int,
                   wall_s: float, batches: Sequence[int]) -> None:
    """The table: one line per batch size, one column per recipe (mean top-1 over seeds)."""
    lines = [
        "# Final top-1 vs global batch size at a fixed epoch budget",
        "",
        args.command,
        "",
        f"resnet10t, embedded synthetic set ({args.classes} classes, {n_train} training and "
        f"{args.classes * args.val_per_class} validation images, {args.crop}px crops), {args.epochs} epochs "
        f"for every run, cosine decay, base lr {args.sgd_lr} (SGD) / {args.lars_lr} (LARS) per "
        f"{args.base_batch} images, warmup {args.warmup_epochs} epochs where used, seeds "
        f"{args.seeds}. Top-1 (%) on the validation split, mean over seeds (each seed in brackets); "
        f"'div' = the loss became non-finite. {args.time_note}",
        "",
        "| global batch | batch / data set | steps | " + " | ".join(args.recipes) + " |",
        "|---:|---:|---:|" + "---:|" * len(args.recipes),
    ]
    for b in batches:
        cells = []
        for r in args.recipes:
            pts = [row for row in rows if row["batch"] == b and row["recipe"] == r]
            if not pts:
                cells.append("-")
                continue
            vals = ["div" if p["diverged"] else f"{p['top1']:.1f}" for p in pts]
            mean = sum(p["top1"] for p in pts) / len(pts)
            cells.append(f"{mean:.1f} ({', '.join(vals)})" if len(pts) > 1 else vals[0])
        steps = next(row["steps"] for row in rows if row["batch"] == b)
        lines.append(f"| {b} | {100 * b / n_train:.1f}% | {steps} | " + " | ".join(cells) + " |")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def write_plot(path: Path, rows: list[dict[str, Any]], batches: Sequence[int], recipes: Sequence[str]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for r in recipes:
        pts = {b: [p["top1"] for p in rows if p["batch"] == b and p["recipe"] == r] for b in batches}
        xs = [b for b in batches if pts[b]]
        ax.plot(xs, [sum(pts[b]) / len(pts[b]) for b in xs], marker="o", label=r)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("global batch size")
    ax.set_ylabel("final val top-1 (%)")
    ax.set_title("fixed epoch budget: top-1 vs batch size")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def render(args: argparse.Namespace) -> int:
    """Table and plot from the JSON rows of a run (its .jsonl file, or its printed log)."""
    rows = []
    for line in args.render.read_text(encoding="utf-8").splitlines():
        if line.startswith("{"):
            rows.append(json.loads(line))
    for base in [r for r in rows if r["batch"] == args.base_batch and r["recipe"] == "none"]:
        for name in SGD_AT_BASE[1:]:  # the same run at the base batch (see the module docstring)
            if not any(r["batch"] == base["batch"] and r["seed"] == base["seed"] and r["recipe"] == name for r in rows):
                rows.append(dict(base, recipe=name))
    args.batches = sorted({r["batch"] for r in rows})
    args.recipes = [r for r in RECIPES if any(x["recipe"] == r for x in rows)]
    args.seeds = sorted({r["seed"] for r in rows})
    seeds = " ".join(map(str, args.seeds))
    args.command = f"`python benchmarks/scaling_rule.py --seeds {seeds}` (table redrawn from its rows with `--render`)"
    n_train = args.classes * args.train_per_class
    wall = sum(r["seconds"] for r in rows if not (r["batch"] == args.base_batch and r["recipe"] in SGD_AT_BASE[1:]))
    args.time_note = (f"Training time summed over the runs: {wall / 60:.1f} min (the rows may come from "
                      f"parts run in parallel).")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_markdown(args.out.with_suffix(".md"), rows, args, n_train, wall, args.batches)
    write_plot(args.out.with_suffix(".png"), rows, args.batches, args.recipes)
    print(args.out.with_suffix(".md").read_text(), flush=True)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batches", type=int, nargs="+", default=[32, 128, 256, 1024])
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--train-per-class", type=int, default=260)
    p.add_argument("--val-per-class", type=int, default=50)
    p.add_argument("--crop", type=int, default=24)
    p.add_argument("--base-batch", type=int, default=32)
    p.add_argument("--sgd-lr", type=float, default=0.05)
    p.add_argument("--lars-lr", type=float, default=0.25)
    p.add_argument("--warmup-epochs", type=float, default=1.5)
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--recipes", nargs="+", default=list(RECIPES), choices=list(RECIPES))
    p.add_argument("--quick", action="store_true", help="2 batch sizes, 2 epochs")
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "scaling_rule")
    p.add_argument("--render", type=Path, metavar="ROWS.jsonl",
                   help="no training: redraw the table and plot from rows saved (or printed) by a run")
    args = p.parse_args(argv)
    if args.render is not None:
        return render(args)
    args.command = "`" + " ".join(["python benchmarks/scaling_rule.py", *(argv if argv is not None else sys.argv[1:])]) + "`"
    if args.quick:
        args.batches, args.epochs, args.warmup_epochs = [32, 256], 2, 0.5
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", torch.get_num_threads())))

    root = ensure_synthetic(num_classes=args.classes, train_per_class=args.train_per_class,
                            val_per_class=args.val_per_class, image_size=48)
    side = args.crop + args.crop // 8
    train_x, train_y = load_split(root, "train", side)
    val_x, val_y = load_split(root, "val", side)
    data = {"train_x": train_x, "train_y": train_y, "val_x": val_x, "val_y": val_y}
    n_train = len(train_y)
    print(f"{n_train} training images, {len(val_y)} validation images, {side}px stored, {args.crop}px crops",
          flush=True)

    rows: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    for seed in args.seeds:
        for b in args.batches:
            for r in args.recipes:
                same = [x for x in rows if x["seed"] == seed and x["batch"] == b and x["recipe"] in SGD_AT_BASE]
                if b == args.base_batch and r in SGD_AT_BASE and same:
                    # At the base batch the three SGD recipes are the same run: no scaling,
                    # and the warmup starts at 1/(batch/base) = 1. Train it once.
                    rows.append(dict(same[0], recipe=r))
                    continue
                row = train_one(r, b, data=data, num_classes=args.classes, epochs=args.epochs,
                                base_batch=args.base_batch, sgd_lr=args.sgd_lr, lars_lr=args.lars_lr,
                                warmup_epochs=args.warmup_epochs, crop=args.crop, seed=seed)
                row["seed"] = seed
                rows.append(row)
                print(json.dumps(row), flush=True)
    wall = time.perf_counter() - t0
    args.time_note = f"Wall time {wall / 60:.1f} min on {torch.get_num_threads()} CPU threads."
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_markdown(args.out.with_suffix(".md"), rows, args, n_train, wall, args.batches)
    (args.out.with_suffix(".jsonl")).write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    try:
        write_plot(args.out.with_suffix(".png"), rows, args.batches, args.recipes)
    except ImportError:
        print("matplotlib is not installed: no plot (pip install largebatch[report])", file=sys.stderr)
    print(args.out.with_suffix(".md").read_text(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
