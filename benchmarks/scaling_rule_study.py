"""The scaling-rule study's parts: its runs, rows, statistics, report and plot.

The study's design, its claims and its commands are ``scaling_rule.py``'s docstring (the command);
its page is ``scaling_rule_page.py``; ``steps_to_target.py`` shares its data, model and statistics.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import itertools
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from largebatch.data.synthetic import render_image
from largebatch.lr import build_lr_scheduler
from largebatch.optim import build_optimizer

# the options a row's number depends on besides its point (recipe, batch, lr, seed, epochs)
SETUP = ("classes", "width", "train_per_class", "val_per_class", "test_per_class", "side", "crop", "bn_group",
         "warmup_epochs")
# recipe: (optimizer, warmup). "goyal": linear from lr x base/batch; "zero": linear from 0.
RECIPES = {"sgd": ("sgd", None), "sgd+warmup": ("sgd", "goyal"), "lars": ("lars", "zero")}
# The embedded generator's seeds per split: train and val as ``largebatch.data.synthetic``
# renders them; test is a third, disjoint stream.
SPLIT_IDS = {"train": 0, "val": 1, "test": 2}
# the training's fixed hyperparameters (not options: every row of every setup has them)
MOMENTUM, WEIGHT_DECAY, POLY_POWER, LARS_TRUST = 0.9, 5e-4, 2.0, 0.001
MEAN = torch.tensor([0.5, 0.5, 0.5]).view(1, 3, 1, 1)
STD = torch.tensor([0.25, 0.25, 0.25]).view(1, 3, 1, 1)


def make_split(split: str, classes: int, per_class: int, side: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Render ``classes * per_class`` images (uint8, N x 3 x side x side) and their labels."""
    pix = np.stack([render_image(classes, c, np.random.default_rng([0, SPLIT_IDS[split], c, i]), side)
                    for i in range(per_class) for c in range(classes)])
    labels = torch.arange(classes).repeat(per_class)
    return torch.from_numpy(pix).permute(0, 3, 1, 2).contiguous(), labels


class GhostBatchNorm2d(nn.BatchNorm2d):
    """Batch norm whose training statistics come from groups of ``group`` images.

    This is the per-worker BN of data-parallel training (Goyal et al. sec. 2.3: n = 32 images
    per worker whatever the global batch) on one process, the "ghost batch norm" of Hoffer et
    al. 2017 (arXiv 1705.08741). Written here because neither torch nor timm has it; the
    project's GroupSyncBatchNorm groups ranks, not slices of one rank's batch. The running
    statistics are the mean of the groups' updates (every worker's, where DDP keeps rank 0's).
    """

    def __init__(self, num_features: int, group: int) -> None:
        super().__init__(num_features)
        self.group = group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, c, h, w = x.shape
        if not self.training or n <= self.group:
            return super().forward(x)
        if n % self.group:
            raise ValueError(f"batch {n} is not a multiple of the BN group {self.group}")
        g = n // self.group
        # groups side by side as channels: one batch_norm call normalises each group alone
        xg = x.view(g, self.group, c, h, w).transpose(0, 1).reshape(self.group, g * c, h, w)
        rm, rv = self.running_mean.repeat(g), self.running_var.repeat(g)
        y = F.batch_norm(xg, rm, rv, self.weight.repeat(g), self.bias.repeat(g), True, self.momentum, self.eps)
        with torch.no_grad():
            self.running_mean.copy_(rm.view(g, c).mean(0))
            self.running_var.copy_(rv.view(g, c).mean(0))
            self.num_batches_tracked.add_(1)
        return y.view(self.group, g, c, h, w).transpose(0, 1).reshape(n, c, h, w)


def small_net(num_classes: int, width: int, bn_group: int) -> nn.Module:
    """conv-BN-ReLU x3 (width, 2x, 4x; max-pool between), global pool, linear."""
    def block(i: int, o: int) -> list[nn.Module]:
        return [nn.Conv2d(i, o, 3, padding=1, bias=False), GhostBatchNorm2d(o, bn_group), nn.ReLU(inplace=True)]
    return nn.Sequential(*block(3, width), nn.MaxPool2d(2), *block(width, 2 * width), nn.MaxPool2d(2),
                         *block(2 * width, 4 * width), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(4 * width, num_classes))


def normalise(images: torch.Tensor) -> torch.Tensor:
    return (images.float() / 255.0 - MEAN) / STD


def augment(images: torch.Tensor, crop: int, gen: torch.Generator) -> torch.Tensor:
    """Random crop of side ``crop`` and horizontal flip per image (vectorised), normalised."""
    n, _, h, w = images.shape
    ys = torch.randint(0, h - crop + 1, (n, 1), generator=gen) + torch.arange(crop)
    xs = torch.randint(0, w - crop + 1, (n, 1), generator=gen) + torch.arange(crop)
    flip = torch.rand(n, generator=gen) < 0.5
    xs = torch.where(flip[:, None], xs.flip(1), xs)
    out = images[torch.arange(n)[:, None, None], :, ys[:, :, None], xs[:, None, :]]  # n, c, c, 3
    return normalise(out.permute(0, 3, 1, 2))


@torch.no_grad()
def accuracy(model: nn.Module, images: torch.Tensor, labels: torch.Tensor, crop: int) -> float:
    model.eval()
    off = (images.shape[-1] - crop) // 2
    x = normalise(images[..., off: off + crop, off: off + crop])
    correct = sum((model(x[i: i + 1000]).argmax(1) == labels[i: i + 1000]).sum().item()
                  for i in range(0, len(x), 1000))
    model.train()
    return 100.0 * correct / len(images)


# ---------------------------------------------------------------------------------------------
# one training


def train_one(job: dict[str, Any], data: dict[str, torch.Tensor], args: argparse.Namespace) -> dict[str, Any]:
    """Train one point (recipe, batch, lr, seed, epochs); its row has the test curve per epoch."""
    opt_name, warmup = RECIPES[job["recipe"]]
    batch, lr, epochs = job["batch"], job["lr"], job["epochs"]
    n = len(data["train_y"])
    torch.manual_seed(job["seed"])
    gen = torch.Generator().manual_seed(job["seed"])
    model = small_net(args.classes, args.width, args.bn_group)
    options: dict[str, Any] = {"momentum": MOMENTUM}
    if opt_name == "lars":
        options.update(trust_coefficient=LARS_TRUST, lr_in_momentum=True)
    opt = build_optimizer(opt_name, model, lr=lr, weight_decay=WEIGHT_DECAY, exclude_bn_bias=True, **options)
    steps_per_epoch = n // batch
    start = {None: 1.0, "goyal": args.base_batch / batch, "zero": 0.0}[warmup]
    sched = build_lr_scheduler(opt, name="poly", power=POLY_POWER, steps_per_epoch=steps_per_epoch, epochs=epochs,
                               warmup_epochs=0.0 if start == 1.0 else args.warmup_epochs,
                               warmup_start_factor=start)
    curve: list[float] = []
    diverged = False
    t0 = time.perf_counter()
    for _ in range(epochs):
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
        curve.append(round(accuracy(model, data["test_x"], data["test_y"], args.crop), 2))
    val = 0.0 if diverged else accuracy(model, data["val_x"], data["val_y"], args.crop)
    return {**job, "setup": args.setup, "steps_per_epoch": steps_per_epoch, "steps": steps_per_epoch * epochs,
            "val": round(val, 2), "test": curve[-1] if not diverged else 0.0, "test_curve": curve,
            "diverged": diverged, "seconds": round(time.perf_counter() - t0, 1)}


# ---------------------------------------------------------------------------------------------
# the plan: which points to train, given the rows so far


def key(j: dict[str, Any]) -> tuple:
    return (j["recipe"], j["batch"], float(j["lr"]), j["seed"], j["epochs"])


def read_rows(path: Path, point: Callable[[dict[str, Any]], tuple] = key) -> dict[tuple, dict[str, Any]]:
    """Rows by ``point`` (this study's key unless given); the first row written for a point counts."""
    rows: dict[tuple, dict[str, Any]] = {}
    if path.exists():
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.startswith("{"):
                r = json.loads(line)
                rows.setdefault(point(r), r)
    return rows


def cell_recipe(recipe: str, batch: int, base: int) -> str:
    """At the base batch SGD with Goyal's warmup is plain SGD: one cell."""
    return "sgd" if recipe == "sgd+warmup" and batch == base else recipe


def grid_of(rows: dict, recipe: str, batch: int, args: argparse.Namespace) -> list[float] | None:
    """The cell's lr grid; ``None`` while it waits for the base batch's SGD sweep.

    SGD at the base batch and LARS at every batch start from their ``--*-lrs`` grids; SGD at
    k x the base batch from [eta, k eta] (eta: the base batch's chosen lr), which holds the
    lrs of every rule (none: eta, sqrt: sqrt(k) eta, linear: k eta). A grid whose best val
    point (mean over the sweep seeds) is at an edge, not diverged, grows that edge by 2x.
    """
    if recipe == "lars":
        grid = list(args.lars_lrs)
    elif batch == args.base_batch:
        grid = list(args.sgd_lrs)
    else:
        eta = chosen_lr(rows, "sgd", args.base_batch, args)
        if eta is None:
            return None
        k = batch // args.base_batch
        grid = [eta * 2 ** j for j in range(int(math.log2(k)) + 1)]
    for _ in range(args.max_grow):
        means = sweep_means(rows, recipe, batch, grid, args)
        if means is None:
            break
        best = max(grid, key=lambda lr: means[lr])
        if best == grid[-1] and means[best] > 0:
            grid.append(grid[-1] * 2)
        elif best == grid[0] and means[best] > 0:
            grid.insert(0, grid[0] / 2)
        else:
            break
    return grid


def sweep_means(rows: dict, recipe: str, batch: int, grid: list[float], args: argparse.Namespace) -> dict | None:
    """Mean val top-1 per lr over the sweep seeds; ``None`` until every point has its rows."""
    out = {}
    for lr in grid:
        v = [rows.get((recipe, batch, float(lr), s, args.epochs)) for s in args.seeds[: args.sweep_seeds]]
        if any(r is None for r in v):
            return None
        out[lr] = statistics.mean(r["val"] for r in v)
    return out


def chosen_lr(rows: dict, recipe: str, batch: int, args: argparse.Namespace) -> float | None:
    """The cell's lr: best mean val top-1 over the sweep seeds, once its grid is complete."""
    recipe = cell_recipe(recipe, batch, args.base_batch)
    grid = grid_of(rows, recipe, batch, args)
    means = None if grid is None else sweep_means(rows, recipe, batch, grid, args)
    return None if means is None else max(grid, key=lambda lr: means[lr])


def predicted(rows: dict, recipe: str, batch: int, args: argparse.Namespace) -> dict[str, float]:
    """The lrs the linear rule and keeping the base lr predict at this batch, from the base
    batch's chosen SGD lr: these get every seed. (The square-root rule's lr is a sweep point,
    reported on val; compute went to the two rules the papers test.)"""
    eta = chosen_lr(rows, "sgd", args.base_batch, args)
    if eta is None or recipe == "lars" or batch == args.base_batch:
        return {}
    k = batch / args.base_batch
    rules = {"none": eta, "linear": eta * k}
    if recipe == "sgd+warmup":  # Goyal's warmup ramps from eta to the scaled lr: "none" is no recipe
        del rules["none"]
    return rules


def cells(args: argparse.Namespace) -> list[tuple[str, int]]:
    return [(r, b) for b in args.batches for r in RECIPES if cell_recipe(r, b, args.base_batch) == r]


def plan(rows: dict, args: argparse.Namespace) -> tuple[list[dict[str, Any]], int]:
    """(points runnable now and not yet trained, in priority order; points still blocked)."""
    jobs: list[dict[str, Any]] = []
    blocked = 0
    mk = lambda r, b, lr, s, e=args.epochs: {"recipe": r, "batch": b, "lr": float(lr), "seed": s, "epochs": e}  # noqa: E731
    for recipe, batch in cells(args):
        if args.base_only and (recipe, batch) != ("sgd", args.base_batch):
            continue
        grid = grid_of(rows, recipe, batch, args)
        if grid is None:
            blocked += 1
            continue
        jobs += [mk(recipe, batch, lr, s) for s in args.seeds[: args.sweep_seeds] for lr in grid]
        lr = chosen_lr(rows, recipe, batch, args)
        if lr is None:
            blocked += 1
            continue
        for p in [lr, *predicted(rows, recipe, batch, args).values()]:
            jobs += [mk(recipe, batch, p, s) for s in args.seeds[args.sweep_seeds:]]
        if recipe == "sgd" and batch == args.base_batch:  # the convergence check
            jobs += [mk(recipe, batch, lr, s, f * args.epochs)
                     for f in (2, 4)[: args.doublings] for s in args.seeds]
        elif args.largest_check and batch == max(args.batches) != args.base_batch:  # the largest batch's, at 2x
            jobs += [mk(recipe, batch, lr, s, 2 * args.epochs) for s in args.seeds]
    seen, todo = set(), []
    for j in jobs:
        if key(j) not in rows and key(j) not in seen:
            seen.add(key(j))
            todo.append(j)
    return todo, blocked


# ---------------------------------------------------------------------------------------------
# workers


@contextlib.contextmanager
def claim(folder: Path, j: dict[str, Any]) -> Iterator[bool]:
    """A lock file per point, so parallel workers train each point once; a dead owner's
    claim (its pid gone) is taken over."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / ("_".join(str(x) for x in key(j)).replace("+", "w") + ".claim")
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        try:
            os.kill(int(path.read_text() or 0), 0)
        except FileNotFoundError:  # its owner finished with it meanwhile
            yield False
            return
        except (ProcessLookupError, ValueError):
            path.unlink(missing_ok=True)
            try:
                fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:  # another worker took the dead owner's claim over first
                yield False
                return
        else:  # a live owner (outside the try: an error of the caller's body is not caught here)
            yield False
            return
    os.write(fd, str(os.getpid()).encode())
    os.close(fd)
    try:
        yield True
    finally:
        path.unlink(missing_ok=True)


def append_row(path: Path, row: dict[str, Any]) -> None:
    with path.open("a", encoding="utf-8") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.write(json.dumps(row) + "\n")
        f.flush()
        os.fsync(f.fileno())


def load_data(args: argparse.Namespace) -> dict[str, torch.Tensor]:
    data = {}
    for split, per in (("train", args.train_per_class), ("val", args.val_per_class), ("test", args.test_per_class)):
        data[f"{split}_x"], data[f"{split}_y"] = make_split(split, args.classes, per, args.side)
    return data


def worker(args: argparse.Namespace) -> int:
    torch.set_num_threads(1)
    rows_path = args.out.with_suffix(".jsonl")
    claims = args.out.parent / (args.out.name + ".claims")
    data = load_data(args)
    while True:
        rows = read_rows(rows_path)
        todo, blocked = plan(rows, args)
        ran = False
        for j in todo:
            with claim(claims, j) as mine:
                if not mine:
                    continue
                if key(j) in read_rows(rows_path):
                    break
                row = train_one(j, data, args)
                append_row(rows_path, row)
                print(f"[{os.getpid()}] {row['recipe']} b={row['batch']} lr={row['lr']:g} seed={row['seed']} "
                      f"E={row['epochs']}: val {row['val']} test {row['test']} ({row['seconds']} s)", flush=True)
                ran = True
                break
        if not ran:
            if not todo and not blocked:
                return 0
            time.sleep(2)  # the rest is claimed by another worker, or waits on its rows


# ---------------------------------------------------------------------------------------------
# statistics (scipy's t distribution)


def mean_ci(v: Sequence[float], conf: float = 0.95) -> tuple[float, float, float]:
    from scipy import stats
    m = statistics.mean(v)
    if len(v) < 2:
        return m, float("nan"), float("nan")
    h = stats.t.ppf(0.5 + conf / 2, len(v) - 1) * statistics.stdev(v) / math.sqrt(len(v))
    return m, m - h, m + h


def welch(a: Sequence[float], b: Sequence[float]) -> tuple[float, float, float]:
    """Difference of means a - b, its standard error and Welch's degrees of freedom."""
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    se = math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1)) if se > 0 else float("inf")
    return statistics.mean(a) - statistics.mean(b), se, df


def verdict(a: Sequence[float], b: Sequence[float], margin: float, alpha: float) -> dict[str, Any]:
    """a against b: the two-sided (1 - alpha) interval of the difference; "worse"/"better"
    where it excludes 0; "no loss" where TOST at level alpha (the 1 - 2 alpha interval) lies
    within +-margin; else "inconclusive"."""
    from scipy import stats
    d, se, df = welch(a, b)
    h = stats.t.ppf(1 - alpha / 2, df) * se
    h_tost = stats.t.ppf(1 - alpha, df) * se
    if d + h < 0:
        word = "worse"
    elif -margin < d - h_tost and d + h_tost < margin:
        word = "no loss"
    elif d - h > 0:
        word = "better"
    else:
        word = "inconclusive"
    return {"diff": d, "lo": d - h, "hi": d + h, "tost_lo": d - h_tost, "tost_hi": d + h_tost, "verdict": word}


def pooled_sd(groups: Sequence[Sequence[float]]) -> tuple[float, int]:
    """The seed spread: pooled within-group standard deviation of groups of 2 or more values,
    and its degrees of freedom (nan, 0 without any such group)."""
    gs = [g for g in groups if len(g) > 1]
    df = sum(len(g) - 1 for g in gs)
    if not df:
        return float("nan"), 0
    return math.sqrt(sum((len(g) - 1) * statistics.variance(g) for g in gs) / df), df


def mde(sd: float, n: int, alpha: float, power: float = 0.8, df: float | None = None) -> float:
    """Minimal detectable effect: the smallest true difference of two means that a two-sided
    t test at level ``alpha`` finds with probability ``power``, with ``n`` seeds per arm and
    seed spread ``sd`` in both (noncentral t, ``df`` degrees of freedom: 2n - 2 by default, the
    pooled test's; a Welch test with unequal spreads runs at fewer)."""
    from scipy import optimize, stats
    df, se = (2 * n - 2 if df is None else df), sd * math.sqrt(2 / n)
    crit = stats.t.ppf(1 - alpha / 2, df)

    def missed(d: float) -> float:
        far = stats.nct.cdf(-crit, df, d / se)  # the wrong-sign tail: nan (scipy) where it is ~0
        return power - stats.nct.sf(crit, df, d / se) - (0.0 if math.isnan(far) else far)
    hi = (crit + 4) * se
    while missed(hi) > 0:  # few degrees of freedom (a Welch test of tiny spreads): a wider bracket
        hi *= 2
    return optimize.brentq(missed, 0.0, hi)


def tost_power_at_zero(sd: float, n: int, alpha: float, margin: float, draws: int = 200_000) -> float:
    """How often TOST at level ``alpha`` (Welch, as ``verdict``) calls two arms of ``n`` seeds
    "no loss" within ``margin`` when their true difference is 0 and both spread ``sd``:
    simulated (fixed seed), since Welch's degrees of freedom vary with the sample."""
    from scipy import stats
    rng = np.random.default_rng(0)
    a, b = rng.normal(0.0, sd, (draws, n)), rng.normal(0.0, sd, (draws, n))
    va, vb = a.var(axis=1, ddof=1) / n, b.var(axis=1, ddof=1) / n
    d, se = a.mean(axis=1) - b.mean(axis=1), np.sqrt(va + vb)
    df = (va + vb) ** 2 / (va ** 2 / (n - 1) + vb ** 2 / (n - 1))
    h = stats.t.ppf(1 - alpha, df) * se
    return float(np.mean((d - h > -margin) & (d + h < margin)))


def verdict_text(v: dict[str, Any], margin: float) -> str:
    """A verdict as the report prints it: TOST's "no loss" with what it carries, the largest
    loss its interval leaves (the first arm against the second), not "no loss" alone."""
    if v["verdict"] != "no loss":
        return v["verdict"]
    return f"loss under {max(0.0, -v['tost_lo']):.2f} (TOST, margin {margin:g})"


def mde_normal(sd: float, n: int, alpha: float, power: float = 0.8) -> float:
    """``mde`` under the normal approximation: (z_{1-alpha/2} + z_power) sd sqrt(2/n)."""
    from scipy import stats
    return (stats.norm.ppf(1 - alpha / 2) + stats.norm.ppf(power)) * sd * math.sqrt(2 / n)


def stats_t(q: float, df: int) -> float:
    from scipy import stats
    return float(stats.t.ppf(q, df))


def tied_lrs(means: dict[float, float], sd: float, df: int, n: int) -> list[float]:
    """The lrs of a sweep that its rows cannot tell from the best one: the best mean minus theirs
    is within the 95% t half-width of a difference of two ``n``-seed means of spread ``sd``
    (uncorrected, so the generous test). One lr: the best lr is identified."""
    from scipy import stats
    if not means:
        return []
    h = stats.t.ppf(0.975, df) * sd * math.sqrt(2 / n) if df else float("inf")
    best = max(means.values())
    return sorted(lr for lr, m in means.items() if best - m < h)


def exponent_range(ks: Sequence[float], lr_sets: Sequence[Sequence[float]]) -> tuple[float, float]:
    """Least and greatest fitted a in lr ~ k^a over every choice of one lr per batch from
    ``lr_sets`` (the lrs the rows cannot tell apart at each batch ``ks``)."""
    xs = [math.log2(k) for k in ks]
    fits = [np.polyfit(xs, [math.log2(lr) for lr in pick], 1)[0] for pick in itertools.product(*lr_sets)]
    return round(min(fits), 9) + 0.0, round(max(fits), 9) + 0.0  # no "-0.00" from rounding error


# ---------------------------------------------------------------------------------------------
# the report


def points(rows: dict, recipe: str, batch: int, lr: float | None, args: argparse.Namespace,
           epochs: int | None = None) -> list[dict[str, Any]]:
    if lr is None:
        return []
    return [r for s in args.seeds if (r := rows.get((recipe, batch, float(lr), s, epochs or args.epochs)))]


def steps_to(r: dict[str, Any], target: float) -> int | None:
    for e, acc in enumerate(r["test_curve"]):
        if acc >= target:
            return (e + 1) * r["steps_per_epoch"]
    return None


def fmt_ci(v: Sequence[float]) -> str:
    if not v:
        return "pending"
    m, lo, hi = mean_ci(v)
    return f"{m:.1f} [{lo:.1f}, {hi:.1f}] (n={len(v)})" if len(v) > 1 else f"{m:.1f} (n=1)"


# the lr choices reported at a large batch, per recipe: every one gets every seed
CHOICES = {"sgd": ("tuned", "none", "linear"), "sgd+warmup": ("tuned", "linear"), "lars": ("tuned",)}
# setups whose width and epochs were chosen on the test split (before the rule below): said in their report
CHOSEN_ON_TEST = {(32, 48): "width and epochs were chosen after the first study (width 16, 24 epochs) by the base "
                            "batch's convergence check on the test split"}


def lr_of(rows: dict, recipe: str, batch: int, choice: str, args: argparse.Namespace) -> float | None:
    """The lr of a choice at a cell: ``tuned`` (val-chosen) or a rule's (``none``, ``linear``)."""
    if choice == "tuned":
        return chosen_lr(rows, recipe, batch, args)
    return predicted(rows, recipe, batch, args).get(choice)


def comparisons(rows: dict, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every comparison the report makes: {name, a, b (test top-1 lists, empty while pending), arms
    ((recipe, batch, lr choice) of each), same (both arms the same points)}. Their number is fixed by
    the design (batches and recipes), not by the rows, so the Bonferroni correction over them does
    not move as rows come in:
      - each large-batch point (every recipe's tuned lr, the rules' lrs) against the base batch;
      - with warmup, the linear rule's lr against the tuned one, at each large batch;
      - at the linear lr, SGD with warmup against SGD without, at each large batch;
      - at the largest batch, LARS against SGD with warmup, each at its tuned lr.
    """
    base = args.base_batch
    large = sorted(b for b in args.batches if b != base)

    def arm(recipe: str, batch: int, choice: str) -> tuple[str, float | None, list[float], tuple[str, int, str]]:
        recipe = cell_recipe(recipe, batch, base)
        lr = lr_of(rows, recipe, batch, choice, args)
        txt = f"{recipe} @ {batch}, {choice} lr " + (f"{lr:g}" if lr is not None else "(pending)")
        return txt, lr, [r["test"] for r in points(rows, recipe, batch, lr, args)], (recipe, batch, choice)

    def pair(a: tuple, b: tuple) -> dict[str, Any]:
        return {"name": f"{a[0]} - {b[0]}", "a": a[2], "b": b[2], "arms": (a[3], b[3]),
                "same": a[1] is not None and a[0].split(",")[0] == b[0].split(",")[0] and a[1] == b[1]}

    ref = arm("sgd", base, "tuned")
    out = [pair(arm(recipe, batch, choice), ref)
           for batch in large for recipe, choices in CHOICES.items() for choice in choices]
    out += [pair(arm("sgd+warmup", b, "linear"), arm("sgd+warmup", b, "tuned")) for b in large]
    out += [pair(arm("sgd+warmup", b, "linear"), arm("sgd", b, "linear")) for b in large]
    if large:
        out.append(pair(arm("lars", large[-1], "tuned"), arm("sgd+warmup", large[-1], "tuned")))
    return out


def seed_groups(rows: dict, args: argparse.Namespace, split: str) -> list[list[float]]:
    """Per point trained with every seed (any budget): its ``split`` top-1s, for the seed spread."""
    by: dict[tuple, list[float]] = {}
    for r in rows.values():
        if not r["diverged"]:
            by.setdefault((r["recipe"], r["batch"], float(r["lr"]), r["epochs"]), []).append(r[split])
    return [v for v in by.values() if len(v) == len(args.seeds)]


def converged_word(v: dict[str, Any], margin: float) -> str:
    return {"no loss": "converged: twice the epochs gains less than the margin, and" + (
                " still gains (the interval excludes 0)" if v["lo"] > 0 else " the gain's interval holds 0"),
            "better": "not converged: twice the epochs still gains" + (
                " more than the margin" if v["lo"] > margin else ", and TOST cannot put the gain within the margin"),
            "worse": "twice the epochs loses accuracy",
            "inconclusive": "inconclusive"}[v["verdict"]]


def steps_reached(pts: Sequence[dict[str, Any]], target: float | None) -> list[int]:
    """Each seed's steps to ``target`` (test top-1, evaluated every epoch), for the seeds that reach it."""
    return [] if target is None else [x for r in pts if (x := steps_to(r, target)) is not None]


def resolution(rows: dict, args: argparse.Namespace, family: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """What the rows can resolve at the corrected level (alpha 0.05 over the ``family``'s number):
    the seed spread (test, val), the minimal detectable effect at the pooled test's and at the
    Welch tests' degrees of freedom, the margin against the base batch's test error, and how often
    TOST calls a true difference of 0 "no loss". ``None`` while no point has all its seeds."""
    n, m = len(args.seeds), len(family)
    alpha = 0.05 / m
    groups = seed_groups(rows, args, "test")
    s_test, df_test = pooled_sd(groups)
    if not df_test:
        return None
    dfs = [welch(c["a"], c["b"])[2] for c in family if not c["same"] and len(c["a"]) > 1 and len(c["b"]) > 1]
    ref = points(rows, "sgd", args.base_batch, chosen_lr(rows, "sgd", args.base_batch, args), args)
    base_err = 100 - statistics.mean(r["test"] for r in ref) if ref else float("nan")
    return {"points": len(groups), "sd_test": s_test, "sd_val": pooled_sd(seed_groups(rows, args, "val"))[0],
            "m": m, "alpha": alpha, "df": 2 * n - 2, "mde": mde(s_test, n, alpha),
            "mde_normal": mde_normal(s_test, n, alpha),
            "welch_df": (min(dfs), max(dfs)) if dfs else None,
            "mde_welch": (mde(s_test, n, alpha, df=max(dfs)), mde(s_test, n, alpha, df=min(dfs))) if dfs else None,
            "base_err": base_err, "margin_share": 100 * args.margin / base_err,
            "tost_power": tost_power_at_zero(s_test, n, alpha, args.margin)}


def doubling_check(short: Sequence[dict[str, Any]], long: Sequence[dict[str, Any]], margin: float
                   ) -> dict[str, tuple[list[float], list[float], dict[str, Any]]] | None:
    """Twice the epochs against the budget, per split: (short, long top-1s, ``verdict`` at 0.05);
    ``None`` while either side has under two seeds."""
    if len(short) < 2 or len(long) < 2:
        return None
    out = {}
    for split in ("val", "test"):
        a, b = [r[split] for r in long], [r[split] for r in short]
        out[split] = (b, a, verdict(a, b, margin, 0.05))
    return out


def base_convergence(rows: dict, args: argparse.Namespace) -> list[tuple[int, dict | None]]:
    """The base batch's chosen point per doubling of the budget (each against the one before it):
    (epochs of the longer run, ``doubling_check``); it stops at the first pending doubling."""
    eta = chosen_lr(rows, "sgd", args.base_batch, args)
    shorter, out = points(rows, "sgd", args.base_batch, eta, args), []
    for f in (2, 4)[: args.doublings]:
        long = points(rows, "sgd", args.base_batch, eta, args, f * args.epochs)
        out.append((f * args.epochs, doubling_check(shorter, long, args.margin)))
        if out[-1][1] is None:
            break
        shorter = long
    return out


def largest_convergence(rows: dict, args: argparse.Namespace) -> list[tuple[str, float | None, dict | None]]:
    """Each recipe at the largest batch, its tuned lr: (recipe, lr, ``doubling_check`` of 2x the epochs)."""
    top, out = max(args.batches), []
    for recipe in [r for r, b in cells(args) if b == top]:
        lr = chosen_lr(rows, recipe, top, args)
        short, long = points(rows, recipe, top, lr, args), points(rows, recipe, top, lr, args, 2 * args.epochs)
        out.append((recipe, lr, doubling_check(short, long, args.margin)))
    return out


def check_line(label: str, check: tuple[list[float], list[float], dict[str, Any]], margin: float, bold: bool) -> str:
    b, a, v = check
    word = converged_word(v, margin)
    return (f"- {label}: {fmt_ci(b)} -> {fmt_ci(a)}; gain {v['diff']:+.2f} [{v['lo']:+.2f}, {v['hi']:+.2f}], TOST "
            f"[{v['tost_lo']:+.2f}, {v['tost_hi']:+.2f}] -> " + (f"**{word}**" if bold else word))


def largest_check_section(rows: dict, args: argparse.Namespace, heading: str = "##") -> list[str]:
    """The report's (and the page's) "Has the largest batch converged?"."""
    top = max(args.batches)
    L = [f"{heading} Has the largest batch converged?", "",
         f"Each recipe at batch {top}, its tuned lr, every seed at {args.epochs} and {2 * args.epochs} epochs: "
         "the gain of twice the epochs (95% interval; TOST 90% interval against the margin), decided on val as "
         "the base batch's; test for the record. Where twice the epochs still gains, the deficit against the "
         "base batch at this budget is partly the budget's, not only the batch's.", ""]
    for recipe, lr, check in largest_convergence(rows, args):
        if check is None:
            L.append(f"- {recipe}, lr {f'{lr:g}' if lr else 'pending'}: pending")
            continue
        L += [check_line(f"{recipe}, lr {lr:g}, {args.epochs} -> {2 * args.epochs} epochs, {split}", check[split],
                         args.margin, split == "val") for split in ("val", "test")]
    return L + [""]


def identified(rows: dict, args: argparse.Namespace, s_val: float, df_val: int) -> dict[tuple[str, int], list[float]]:
    """Per cell whose sweep is done: the lrs its rows cannot tell from the chosen one (``tied_lrs``)."""
    tied = {}
    for recipe, batch in cells(args):
        grid = grid_of(rows, recipe, batch, args)
        means = sweep_means(rows, recipe, batch, grid, args) if grid else None
        if chosen_lr(rows, recipe, batch, args) is not None and means is not None and df_val:
            tied[(recipe, batch)] = tied_lrs(means, s_val, df_val, args.sweep_seeds)
    return tied


def exponent_fits(rows: dict, args: argparse.Namespace, tied: dict[tuple[str, int], list[float]]
                  ) -> dict[str, dict[str, Any]]:
    """Per recipe: the chosen lr and the tied lrs per batch, the exponent a of lr* ~ k^a the chosen
    lrs fit and its range over the tied lrs, over the batches whose sweeps are done (``ks``)."""
    base, out = args.base_batch, {}
    for recipe in RECIPES:
        crs = [cell_recipe(recipe, b, base) for b in args.batches]
        lrs = [chosen_lr(rows, cr, b, args) for cr, b in zip(crs, args.batches)]
        sets = [tied.get((cr, b)) for cr, b in zip(crs, args.batches)]
        have = [i for i, (lr, t) in enumerate(zip(lrs, sets)) if lr and t]
        ks = [args.batches[i] / base for i in have]
        done = len(have) > 1
        out[recipe] = {"lrs": lrs, "sets": sets, "ks": ks, "all": len(have) == len(args.batches),
                       "a": float(np.polyfit([math.log2(k) for k in ks], [math.log2(lrs[i]) for i in have], 1)[0])
                       if done else None,
                       "range": exponent_range(ks, [sets[i] for i in have]) if done else None}
    return out


def write_report(args: argparse.Namespace, rows: dict) -> str:
    """The study's report from its rows, section by section; written to ``--out``.md with its plot."""
    family = comparisons(rows, args)
    ref = points(rows, "sgd", args.base_batch, chosen_lr(rows, "sgd", args.base_batch, args), args)
    lines = [*_setup_section(args, rows), *_resolution_section(args, rows, family), *_convergence_section(args, rows)]
    if args.largest_check and max(args.batches) != args.base_batch:
        lines += largest_check_section(rows, args)
    tied = identified(rows, args, *pooled_sd(seed_groups(rows, args, "val")))
    lines += [*_sweeps_section(args, rows, tied), *_claim1_section(args, rows, tied), *_test_section(args, rows, ref),
              *_comparisons_section(args, family)]
    trained = list(rows.values())
    lines += ["", f"{len(trained)} trainings, {sum(r['seconds'] for r in trained) / 60:.1f} min of training summed "
              "(workers of one thread each, on a shared 2-core machine; docs/scaling-rule.md gives the wall time)."]
    text = "\n".join(lines) + "\n"
    args.out.with_suffix(".md").write_text(text, encoding="utf-8")
    plot(args, rows)
    return text


def _setup_section(args: argparse.Namespace, rows: dict) -> list[str]:
    """The title, the setup in one paragraph, and what is still pending."""
    todo, blocked = plan(rows, args)
    n_train = args.classes * args.train_per_class
    L = ["# The scaling-rule study, version 3", "",
         f"Rows: `{args.out.with_suffix('.jsonl').name}` (one per training); written by `benchmarks/scaling_rule.py "
         "--render`; the design and the commands are in that module's docstring.", "",
         f"{args.classes} classes of the embedded generator: {n_train} train / {args.classes * args.val_per_class} val "
         f"(chooses the lrs) / {args.classes * args.test_per_class} test (every number below) images, {args.side} px "
         f"stored, {args.crop} px crops; conv net width {args.width} with BN over groups of {args.bn_group} images; "
         f"{args.epochs} epochs at every batch (poly(2) decay; warmup {args.warmup_epochs} epochs where used); base "
         f"batch {args.base_batch}; seeds {args.seeds} ({args.sweep_seeds} of them over each whole lr sweep). "
         f"Intervals: 95% t; equivalence margin {args.margin} points.", ""]
    if (args.width, args.epochs) in CHOSEN_ON_TEST:
        L += [f"**How this setup was chosen**: {CHOSEN_ON_TEST[(args.width, args.epochs)]}. From now on any setup "
              "(width, epochs, data) is chosen on the val split only; the convergence check below decides on val "
              "and gives test for the record.", ""]
    if todo or blocked:
        L += [f"**Pending: {len(todo)} trainings runnable now, {blocked} cell(s) waiting on others' rows** "
              "(run the command again to go on). Pending points: " +
              ", ".join(f"{j['recipe']}@{j['batch']} lr {j['lr']:g} seed {j['seed']}"
                        + (f" ({j['epochs']} epochs)" if j["epochs"] != args.epochs else "") for j in todo[:40])
              + (" ..." if len(todo) > 40 else ""), ""]
    if args.base_only:
        L += ["**Only the base batch's cell was run (`--base-only`: its sweep and the convergence check); every "
              "other cell below is pending.**", ""]
    return L


def _resolution_section(args: argparse.Namespace, rows: dict, family: list[dict[str, Any]]) -> list[str]:
    """What the rows can resolve: the seed spread, the smallest effect m corrected tests find."""
    res = resolution(rows, args, family)
    m, n = len(family), len(args.seeds)
    L = ["## What the rows can resolve", ""]
    if not res:
        return [*L, "Seed spread: pending (no point has all its seeds yet).", ""]
    L += [f"Seed spread (pooled standard deviation over the {res['points']} points run "
          f"with all {n} seeds): test {res['sd_test']:.2f} points, val {res['sd_val']:.2f} points. Minimal "
          f"detectable effect with {n} seeds per arm at the corrected level (two-sided, alpha 0.05/{m}, 80% "
          f"power, t with {res['df']} degrees of freedom): **{res['mde']:.2f} points** of test top-1 (normal "
          f"approximation: {res['mde_normal']:.2f}). A true difference smaller than that is more likely missed "
          f"than found; an \"inconclusive\" below says no more than that.", ""]
    if res["welch_df"]:
        L += [f"The comparisons' Welch tests run at {res['welch_df'][0]:.1f} to {res['welch_df'][1]:.1f} degrees "
              f"of freedom (unequal spreads cost some), where the same effect is {res['mde_welch'][0]:.2f} to "
              f"**{res['mde_welch'][1]:.2f} points**.", ""]
    L += [f"The equivalence margin, {args.margin:g} point{'' if args.margin == 1 else 's'}, is "
          f"{res['margin_share']:.0f}% of the base batch's test error ({res['base_err']:.2f}%). With this spread "
          f"and {n} seeds, TOST at the corrected level calls a comparison \"no loss\" only "
          f"{100 * res['tost_power']:.0f}% of the time when the true difference is 0 (simulated): a missing "
          "\"no loss\" is no evidence of a loss, and each \"no loss\" below is given with the largest loss its "
          "interval leaves.", ""]
    return L


def _convergence_section(args: argparse.Namespace, rows: dict) -> list[str]:
    """The base batch's chosen point at 2x and 4x the epochs, each against the budget half its own
    (24 vs 48, 48 vs 96 epochs); the verdict on val (setups are chosen on val)."""
    eta = chosen_lr(rows, "sgd", args.base_batch, args)
    L = ["## Has the base batch converged?", "",
         f"SGD at batch {args.base_batch}, lr {f'{eta:g}' if eta else 'pending'}, top-1 at 1x, 2x"
         + (" and 4x" if args.doublings == 2 else "") + " the epoch budget; each doubling against the budget "
         "before it (95% interval of the gain; TOST 90% interval against the margin). The verdict is on val; "
         "test is given for the record.", ""]
    for epochs, check in base_convergence(rows, args):
        if check is None:
            L.append(f"- {epochs} epochs: pending")
            break
        L += [check_line(f"{epochs // 2} -> {epochs} epochs, {split}", check[split], args.margin, split == "val")
              for split in ("val", "test")]
    return [*L, ""]


def _sweeps_section(args: argparse.Namespace, rows: dict, tied: dict[tuple[str, int], list[float]]) -> list[str]:
    """Each cell's lr sweep (val top-1) and whether it identifies the best lr."""
    s_val, df_val = pooled_sd(seed_groups(rows, args, "val"))
    se = s_val * math.sqrt(2 / args.sweep_seeds)
    h_id = stats_t(0.975, df_val) * se if df_val else float("nan")
    L = ["## lr sweeps: val top-1, mean over the sweep seeds (the chosen lr in bold)", "",
         f"The best lr is identified only where its mean beats every other lr's by more than the 95% half-width of "
         f"a difference of two {args.sweep_seeds}-seed means with the rows' val seed spread: "
         + (f"{h_id:.2f} points (standard error {se:.2f})" if df_val else "pending")
         + ". Elsewhere the lrs it cannot tell from the chosen one are listed.", ""]
    for recipe, batch in cells(args):
        lr = chosen_lr(rows, recipe, batch, args)
        cellv = []
        for g in grid_of(rows, recipe, batch, args) or []:
            v = [r for r in points(rows, recipe, batch, g, args) if r["seed"] in args.seeds[: args.sweep_seeds]]
            s = "pending" if len(v) < args.sweep_seeds else (
                "div" if all(r["diverged"] for r in v) else f"{statistics.mean(r['val'] for r in v):.1f}")
            cellv.append(f"**{g:g}: {s}**" if g == lr else f"{g:g}: {s}")
        note = ""
        if (recipe, batch) in tied:
            t = tied[(recipe, batch)]
            note = " -> identified" if t == [lr] else " -> **not identified**: " + ", ".join(f"{x:g}" for x in t)
        L.append(f"- {recipe} @ {batch}: " + (", ".join(cellv) if cellv else "waiting on the base sweep") + note)
    return L


def _claim1_section(args: argparse.Namespace, rows: dict, tied: dict[tuple[str, int], list[float]]) -> list[str]:
    """Claim 1: the best lr against the batch, and the exponent a of lr* ~ k^a per recipe."""
    L = ["", "## Claim 1: does the best lr grow linearly with the batch?", "",
         "| recipe | " + " | ".join(f"batch {b} (k={b // args.base_batch})" for b in args.batches) +
         " | a in lr* ~ k^a, chosen lrs | a over the lrs the rows cannot tell apart |",
         "|---|" + "---:|" * len(args.batches) + "---:|---:|"]
    for recipe, f in exponent_fits(rows, args, tied).items():
        fit = ("pending" if f["a"] is None else f"{f['a']:.2f}" + (
            "" if f["all"] else f" (k = {', '.join(f'{k:g}' for k in f['ks'])})"))
        rng = f["range"]
        L.append(f"| {recipe} | " + " | ".join(
            (f"{lr:g}" + ("" if t == [lr] else f" ({', '.join(f'{x:g}' for x in t)})") if t else f"{lr:g}")
            if lr else "pending" for lr, t in zip(f["lrs"], f["sets"]))
            + f" | {fit} | " + (f"{rng[0]:.2f} to {rng[1]:.2f}" if rng else "pending") + " |")
    return [*L, "", "In parentheses: the lrs the sweep cannot tell from the chosen one. Linear scaling is a = 1, "
            "square-root scaling a = 0.5; where a batch's best lr is not identified, neither is a: the last column "
            "is the range of the fit over every choice of those lrs. While a batch's sweep is pending the fit is over "
            "the batches done (their k in parentheses).", ""]


def _test_section(args: argparse.Namespace, rows: dict, ref: list[dict[str, Any]]) -> list[str]:
    """Test top-1 and steps to target for each cell's tuned and predicted lrs."""
    target = (statistics.mean(r["test"] for r in ref) - args.margin) if ref else None
    L = ["## Test top-1 (%) at each batch: mean [95% interval] (n)", "",
         "Steps to target: optimizer steps until the test top-1 (evaluated after every epoch, so a seed's steps "
         "are a multiple of its steps per epoch) first reaches "
         + (f"{target:.1f}% (the base batch's mean {target + args.margin:.1f} minus the margin)" if target is not None
            else "the target") + "; mean over the seeds that reach it, and how many do. Means over different "
         "numbers of seeds are not compared, and no interval is given: this column ranks nothing.", "",
         "| recipe | lr choice | batch | lr | steps | test top-1 | steps to target |", "|---|---|---:|---:|---:|---|---|"]
    for recipe, batch in cells(args):
        choices = {"tuned": chosen_lr(rows, recipe, batch, args), **predicted(rows, recipe, batch, args)}
        done_lr: dict[float, str] = {}
        for name, lr in choices.items():
            if lr is None:
                L.append(f"| {recipe} | {name} | {batch} | - | - | pending | - |")
                continue
            if float(lr) in done_lr:
                L.append(f"| {recipe} | {name} | {batch} | {lr:g} | | = {done_lr[float(lr)]} | |")
                continue
            done_lr[float(lr)] = name
            pts = points(rows, recipe, batch, lr, args)
            st = steps_reached(pts, target)
            stxt = (f"{statistics.mean(st):.0f} ({len(st)}/{len(pts)})" if st
                    else f"never (0/{len(pts)})" if pts else "-")
            steps = pts[0]["steps"] if pts else "-"
            L.append(f"| {recipe} | {name} | {batch} | {lr:g} | {steps} | {fmt_ci([r['test'] for r in pts])} | "
                     f"{stxt} |")
    return L


def _comparisons_section(args: argparse.Namespace, family: list[dict[str, Any]]) -> list[str]:
    """The design's comparisons (claims 1-4), Bonferroni-corrected over the whole family."""
    m = len(family)
    alpha = 0.05 / m
    L = ["", f"## Comparisons (claims 1-4), Bonferroni-corrected over all {m}", "",
         f"Difference of test top-1 means (points), first arm minus second; {100 * (1 - alpha):.2f}% Welch interval "
         f"(95% with a Bonferroni correction over the {m} comparisons below, a number fixed by the design, pending "
         f"ones included); \"worse\"/\"better\" where it excludes 0; \"no loss\" where TOST at the same corrected "
         f"level puts the difference within +-{args.margin}; else inconclusive. The base batch is SGD at batch "
         f"{args.base_batch}, tuned lr.", "",
         "| comparison | first arm | second arm | difference | corrected interval | TOST interval | verdict |",
         "|---|---|---|---:|---|---|---|"]
    for c in family:
        if c["same"]:
            L.append(f"| {c['name']} | {fmt_ci(c['a'])} | | 0 | | | the same lr: one point |")
        elif len(c["a"]) < 2 or len(c["b"]) < 2:
            L.append(f"| {c['name']} | {fmt_ci(c['a'])} | {fmt_ci(c['b'])} | - | - | - | pending |")
        else:
            v = verdict(c["a"], c["b"], args.margin, alpha)
            L.append(f"| {c['name']} | {fmt_ci(c['a'])} | {fmt_ci(c['b'])} | {v['diff']:+.2f} | "
                     f"[{v['lo']:+.2f}, {v['hi']:+.2f}] | [{v['tost_lo']:+.2f}, {v['tost_hi']:+.2f}] | "
                     f"**{verdict_text(v, args.margin)}** |")
    return L


def pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend (files only), or None with a line where matplotlib is
    not installed (the [dev] and [report] extras install it): the reports are written without plots."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot", file=sys.stderr)
        return None
    return plt


def plot(args: argparse.Namespace, rows: dict) -> None:
    plt = pyplot()
    if plt is None:
        return
    base = args.base_batch
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for i, recipe in enumerate(RECIPES):
        xs, ms, errs, bx, blr = [], [], [], [], []
        for b in args.batches:
            cr = cell_recipe(recipe, b, base)
            lr = chosen_lr(rows, cr, b, args)
            v = [r["test"] for r in points(rows, cr, b, lr, args)]
            if len(v) > 1:
                m, lo, hi = mean_ci(v)
                xs.append(b * (1 + 0.04 * (i - 1)))
                ms.append(m)
                errs.append(hi - m)
            if lr:
                bx.append(b)
                blr.append(lr)
        ax1.errorbar(xs, ms, yerr=errs, marker="o", capsize=3, label=f"{recipe}, tuned lr")
        ax2.plot(bx, blr, marker="o", label=recipe)
    eta = chosen_lr(rows, "sgd", base, args)
    if eta:
        for name, fn in (("linear", lambda k: k), ("sqrt", math.sqrt)):
            lin = [chosen_lr(rows, "sgd", base, args) * fn(b / base) for b in args.batches]
            ax2.plot(args.batches, lin, ls="--", alpha=0.6, label=f"{name} rule from SGD@{base}")
            v = [[r["test"] for r in points(rows, "sgd+warmup", b, eta * fn(b / base), args)] for b in args.batches[1:]]
            pts = [(b, statistics.mean(x)) for b, x in zip(args.batches[1:], v) if x]
            if pts and name == "linear":  # the sqrt rule's lr has the sweep seeds only
                ax1.plot(*zip(*pts), ls=":", marker="x", label=f"sgd+warmup, {name} rule lr")
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("global batch size")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    ax1.set_ylabel("final test top-1 (%), mean, 95% interval")
    ax1.set_title(f"{args.epochs} epochs at every batch")
    if any(len(line.get_xdata()) for line in ax2.get_lines()):  # nothing to log-scale before the first sweep
        ax2.set_yscale("log", base=2)
    ax2.set_ylabel("val-chosen lr")
    ax2.set_title("best lr vs batch")
    fig.tight_layout()
    fig.savefig(args.out.with_suffix(".png"), dpi=80)
    plt.close(fig)


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The study's settings (``--quick`` shrinks them), checked."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=2, help="parallel training processes, one thread each")
    p.add_argument("--render", action="store_true", help="no training: the report from the rows file")
    p.add_argument("--quick", action="store_true", help="smoke test: tiny data, 2 epochs, temp folder")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--batches", type=int, nargs="+", default=[32, 64, 128, 256, 512],
                   help="global batches; the smallest is the base (k = 1). By the share of the training set "
                        "per step, k = 2 is Goyal et al.'s 8K on ImageNet, k = 16 is 64K")
    p.add_argument("--epochs", type=int, default=48)
    p.add_argument("--warmup-epochs", type=float, default=2.0)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    p.add_argument("--sweep-seeds", type=int, default=2, help="the first N seeds run every lr of every sweep")
    p.add_argument("--sgd-lrs", type=float, nargs="+", default=[0.05, 0.1, 0.2, 0.4])
    p.add_argument("--lars-lrs", type=float, nargs="+", default=[2.0, 4.0, 8.0, 16.0])
    p.add_argument("--max-grow", type=int, default=3, help="how many times a sweep may grow an edge")
    p.add_argument("--base-only", action="store_true",
                   help="train only the base batch's SGD cell (its sweep, seeds and convergence check): is a "
                        "setup's budget converged, before the whole study is spent on it")
    p.add_argument("--doublings", type=int, default=1, choices=[1, 2],
                   help="the base batch's convergence check: at 2x the epochs (1), and at 4x (2)")
    p.add_argument("--largest-check", action=argparse.BooleanOptionalAction, default=True,
                   help="the largest batch's convergence check: each recipe's tuned lr at 2x the epochs, every seed "
                        "(are its deficits the budget's?)")
    p.add_argument("--margin", type=float, default=1.0, help="equivalence margin, top-1 points")
    add_data_model_args(p)
    p.add_argument("--out", type=Path, default=None,
                   help="rows/report/plot path without suffix (default benchmarks/results/scaling_rule; "
                        "with --quick, scaling_rule_quick in the temp folder)")
    args = p.parse_args(argv)
    args.page = args.out is None and not args.quick  # the committed study's rows: its page is rendered too
    if args.quick:
        args.train_per_class, args.val_per_class, args.test_per_class, args.epochs = 32, 8, 8, 2
        args.batches, args.bn_group, args.warmup_epochs = [16, 64], 16, 0.5
        args.sgd_lrs, args.lars_lrs, args.seeds, args.max_grow = [0.1, 0.2], [2.0, 4.0], [0, 1, 2], 0
    if args.out is None:  # a smoke test must not append to the committed rows
        args.out = (Path(tempfile.gettempdir()) / "scaling_rule_quick" if args.quick
                    else Path(__file__).parent / "results" / "scaling_rule")
    args.base_batch = min(args.batches)
    if args.sweep_seeds > len(args.seeds) or args.sweep_seeds < 1:
        p.error("--sweep-seeds must be between 1 and the number of --seeds")
    n = args.classes * args.train_per_class
    bad = [b for b in args.batches if n % b or b % args.bn_group or b % args.base_batch]
    if bad:
        p.error(f"batches {bad}: each must divide the {n} training images and be a multiple of --bn-group "
                f"{args.bn_group} and of the base batch {args.base_batch}")
    # what a row's number depends on besides its point (key): rows of two setups never mix
    args.setup = {k: getattr(args, k) for k in SETUP}
    args.setup["base_batch"] = args.base_batch
    refuse_other_setup(p, args.out.with_suffix(".jsonl"), args.setup)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    return args


def add_data_model_args(p: argparse.ArgumentParser) -> None:
    """The data and model options both studies share (the embedded generator's splits, the conv net)."""
    p.add_argument("--bn-group", type=int, default=32)
    p.add_argument("--width", type=int, default=32, help="conv widths: width, 2x, 4x")
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--train-per-class", type=int, default=1024)
    p.add_argument("--val-per-class", type=int, default=300)
    p.add_argument("--test-per-class", type=int, default=300)
    p.add_argument("--side", type=int, default=20)
    p.add_argument("--crop", type=int, default=16)


def refuse_other_setup(p: argparse.ArgumentParser, rows_path: Path, setup: dict[str, Any]) -> None:
    """A rows file holds one setup: argparse's one-line error (exit 2) for a row of another."""
    if not rows_path.exists():
        return
    for line in rows_path.read_text(encoding="utf-8").splitlines():
        if line.startswith("{") and (other := json.loads(line).get("setup")) != setup:
            diff = ", ".join(f"{k} {(other or {}).get(k)} (not {v})" for k, v in setup.items()
                             if (other or {}).get(k) != v)
            p.error(f"{rows_path} holds rows of another setup: {diff}; pass those options, or --out for "
                    "a new rows file")


def run_workers(script: str, argv: Sequence[str] | None, workers: int) -> int:
    """Start ``workers`` processes of ``script --worker <the same arguments>`` and wait for them
    (Ctrl-C: they finish their point's row or stop; run the command again to go on)."""
    cmd = [sys.executable, script, "--worker", *(argv if argv is not None else sys.argv[1:])]
    procs = [subprocess.Popen(cmd) for _ in range(workers)]
    try:
        codes = [pr.wait() for pr in procs]
    except KeyboardInterrupt:
        for pr in procs:
            pr.wait()
        print("stopped: run the same command again to go on", file=sys.stderr)
        return 130
    return max(codes)
