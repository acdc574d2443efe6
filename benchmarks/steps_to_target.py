"""The scaling study, version 4: steps to a validation target against the batch, and whether the
gradient noise scale measured in the same runs predicts where scaling stops.

Question (Shallue et al. 2018, "Measuring the Effects of Data Parallelism on Neural Network
Training", arXiv 1811.03600): up to which batch does doubling it halve the steps to a target?
Their answer is a curve, steps-to-target S against batch B with the lr tuned per batch and no
fixed epoch budget, in three regions: perfect scaling (S ~ 1/B), diminishing returns, maximal
data parallelism (S flat). McCandlish, Kaplan, Amodei et al. 2018 ("An Empirical Model of
Large-Batch Training", arXiv 1812.06162, eq. 2.11) model it as

    S = S_min (1 + B_crit / B)

and predict B_crit from the simple gradient noise scale B_simple = tr(Sigma) / |G|^2 measured
during training, at the loss of the target (their section 3). This study fits S_min and B_crit
per recipe (least squares on log S, a bootstrap over seeds for the interval) and compares
B_crit with B_simple measured in the very runs that reach the target.

Design:
- data, model and BN as ``benchmarks/scaling_rule.py`` (the embedded generator's images, a
  3-layer conv net with BN over groups of ``--bn-group`` images at every batch); train / val /
  test splits; the target is on **val** (``--target``, top-1 %), and so is the lr choice;
- recipes: ``sgd+warmup`` (Goyal et al.'s gradual warmup from lr x base/batch; plain SGD at the
  base batch) and ``lars`` (its references' update, warmup from 0), each at a **constant lr
  after the warmup**: with no epoch budget there is no decay to place (Shallue et al. sec. 4.1
  found the same scaling curves with constant and decayed lrs); a run stops when val top-1
  first reaches the target (checked ``--evals-per-epoch`` times per epoch) or at
  ``--max-epochs`` (then "not reached");
- the lr is tuned per batch on a sqrt(2) grid by mean log steps-to-target over the sweep seeds
  (a lr where a sweep seed misses the target scores infinity, and its other sweep seeds are not
  run: they cannot change that score); a grid whose best point is at an
  edge grows that edge by sqrt(2); SGD's grid at k x the base batch is centred on k x the base's
  chosen lr, LARS's on ``--lars-lr`` at every batch; the chosen lr then gets the other seeds;
- the noise scale (``largebatch.diagnostics.noise_scale.GradientNoiseScale``, McCandlish et
  al. appendix A.1): on ``--probes-per-epoch`` steps per epoch the batch's gradient is taken as
  the mean of its two halves' (two backward passes of one forward; the halves are whole BN
  groups, so each half's gradient is exactly the half-batch gradient and the step is the one
  without a probe): B_small = B/2, B_big = B; averaged (EMA ``--noise-beta``) and read at each
  evaluation; the row keeps B_simple at the evaluation that reached the target. Batches whose
  halves are not whole BN groups (the base, 32 = one group) are not probed;
- a sweep run stops early, as "not reached", once it has taken ``--cap-factor`` (4) times the
  fewest steps a run of its cell has reached the target in so far: a too large (or small) lr
  would otherwise train to ``--max-epochs`` and cost 2-3 hits; it cannot change which lr is
  chosen unless a seed of the best lr needs 4x another run's steps (the row keeps its cap). The
  chosen lr's other seeds run uncapped;
- the target, and power first: a first crossing of a level the curve approaches slowly is mostly
  noise (the first rows, trained to 95% at a constant lr, spread 0.48 in log steps over seeds:
  5 seeds per batch would resolve only a 4.7x ratio of steps). So a **pilot** at the base batch
  (``--pilot``, rows of runs trained to 95%) is read at every candidate level
  (``--candidate-targets``) before the study runs: the seed spread of log first-crossing steps
  and the ratio of steps the study's seeds resolve at its Bonferroni level; the target is the
  highest level no pilot run missed that resolves ``--resolve`` (sqrt(2)) or less. ``--plan``
  prints that table, the cost estimate and the resolution; the report repeats the table and
  gives the resolution again from the study's own rows. The pilot's 12 runs (batch 32, SGD,
  lrs 0.071 / 0.1 / 0.14; 8 seeds at 0.1) chose **89%**: smoothed spread 0.117, which 8 seeds per
  batch resolve to 1.28x (5 seeds: 1.45x); the levels above 90% spread 0.23-0.29, those under
  86% 0.16-0.24 (the early curve swings at a constant lr too). Batches 32-1024 (32x the base):
  ~144 trainings, estimated ~4.6 h of one core.

Running (resumable, as ``scaling_rule.py``: rows go to ``benchmarks/results/steps_to_target.jsonl``
as they finish; parallel workers claim points with lock files; run at low priority beside other
work, and stop it while the test suite runs):

    python benchmarks/steps_to_target.py --out benchmarks/results/steps_to_target_pilot --batches 32 \
        --recipes sgd+warmup --target 95 --seeds 0 1 2 3 4 5 6 7   # the pilot (the target's choice)
    python benchmarks/steps_to_target.py --plan                # target, cost and resolution, nothing run
    nice -n 19 python benchmarks/steps_to_target.py --workers 1   # the study, then the report
    python benchmarks/steps_to_target.py --render              # report from the rows: .md and .png
    python benchmarks/steps_to_target.py --quick               # smoke test: tiny, temp folder
"""

from __future__ import annotations

import argparse
import itertools
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
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the fixed-budget study's parts, a sibling script
import scaling_rule_study as fixed  # noqa: E402

from largebatch.diagnostics.noise_scale import GradientNoiseScale, squared_norm  # noqa: E402
from largebatch.lr import build_lr_scheduler  # noqa: E402
from largebatch.optim import build_optimizer  # noqa: E402

RECIPES = {"sgd+warmup": ("sgd", "goyal"), "lars": ("lars", "zero")}
SETUP = ("classes", "width", "train_per_class", "val_per_class", "test_per_class", "side", "crop", "bn_group",
         "warmup_epochs", "target", "max_epochs", "evals_per_epoch", "probes_per_epoch", "noise_beta")
SQRT2 = math.sqrt(2.0)
# Region names (Shallue et al. sec. 4.1), by how much one doubling of B cuts the steps in the fitted
# model, r(B) = (1 + B_crit/B) / (1 + B_crit/(2B)): perfect scaling while r >= 1.8 (B <= B_crit/8),
# maximal data parallelism once r <= 1.1 (B >= 4.5 B_crit), diminishing returns between.
PERFECT_RATIO, FLAT_RATIO = 1.8, 1.1


# ---------------------------------------------------------------------------------------------
# one training, until the target


def eval_every(steps_per_epoch: int, per_epoch: int) -> int:
    return max(1, round(steps_per_epoch / per_epoch))


def probed(batch: int, bn_group: int) -> bool:
    """Whether a batch's halves are whole BN groups (so each half's gradient is its own)."""
    return batch >= 2 * bn_group and (batch // 2) % bn_group == 0


def step_grads(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, probe: bool
               ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
    """Forward and backward of one batch; the loss. With ``probe``: each half's gradient by its own
    backward pass (one forward), ``.grad`` set to their mean (the full batch's mean gradient), and
    (mean of the halves' squared norms, squared norm of their mean) returned for the tracker."""
    out = model(x)
    if not probe:
        loss = F.cross_entropy(out, y)
        loss.backward()
        return loss.detach(), None
    params = [p for p in model.parameters() if p.requires_grad]
    h = len(y) // 2
    halves = [F.cross_entropy(out[:h], y[:h]), F.cross_entropy(out[h:], y[h:])]
    g1 = torch.autograd.grad(halves[0], params, retain_graph=True)
    g2 = torch.autograd.grad(halves[1], params)
    for p, a, b in zip(params, g1, g2):
        p.grad = (a + b) / 2
    small = (squared_norm(g1) + squared_norm(g2)) / 2
    big = squared_norm([p.grad for p in params])
    return ((halves[0] + halves[1]) / 2).detach(), (small, big)


def train_one(job: dict[str, Any], data: dict[str, torch.Tensor], args: argparse.Namespace) -> dict[str, Any]:
    """Train one point (recipe, batch, lr, seed) until val top-1 reaches the target."""
    opt_name, warmup = RECIPES[job["recipe"]]
    batch, lr = job["batch"], job["lr"]
    n = len(data["train_y"])
    torch.manual_seed(job["seed"])
    gen = torch.Generator().manual_seed(job["seed"])
    model = fixed.small_net(args.classes, args.width, args.bn_group)
    options: dict[str, Any] = {"momentum": 0.9}
    if opt_name == "lars":
        options.update(trust_coefficient=0.001, lr_in_momentum=True)
    opt = build_optimizer(opt_name, model, lr=lr, weight_decay=5e-4, exclude_bn_bias=True, **options)
    spe = n // batch
    start = {"goyal": args.base_batch / batch, "zero": 0.0}[warmup]
    sched = build_lr_scheduler(opt, name="constant", steps_per_epoch=spe, epochs=args.max_epochs,
                               warmup_epochs=0.0 if start == 1.0 else args.warmup_epochs, warmup_start_factor=start)
    every = eval_every(spe, args.evals_per_epoch)
    probe_every = eval_every(spe, args.probes_per_epoch)
    can_probe = probed(batch, args.bn_group)
    tracker = GradientNoiseScale(beta=args.noise_beta)
    curve: list[list[float]] = []
    noise: list[list[float]] = []
    reached, diverged, step = False, False, 0
    last = min(spe * args.max_epochs, job.get("cap") or spe * args.max_epochs)
    # wall and CPU seconds: the CPU's are the cost (one thread), which a paused worker's wall time is not
    t0, c0 = time.perf_counter(), time.process_time()
    while step < last and not reached and not diverged:
        perm = torch.randperm(n, generator=gen)
        for s in range(spe):
            idx = perm[s * batch: (s + 1) * batch]
            probe = can_probe and step % probe_every == 0
            loss, norms = step_grads(model, fixed.augment(data["train_x"][idx], args.crop, gen),
                                     data["train_y"][idx], probe)
            if norms is not None:
                tracker.update(norms[0], batch / 2, norms[1], batch)
            opt.step()
            opt.zero_grad(set_to_none=True)
            sched.step()
            step += 1
            if step % every == 0 or step == last:
                if not math.isfinite(loss.item()):
                    diverged = True
                    break
                acc = fixed.accuracy(model, data["val_x"], data["val_y"], args.crop)
                curve.append([step, round(acc, 2)])
                if tracker.updates:
                    noise.append([step, float(tracker.noise_scale()), float(tracker.grad_sq_norm()),
                                  float(tracker.noise_trace())])
                if acc >= args.target:
                    reached = True
                if reached or step == last:
                    break
    test = 0.0 if diverged else fixed.accuracy(model, data["test_x"], data["test_y"], args.crop)
    at_target = noise[-1][1] if reached and noise and noise[-1][0] == step else None
    return {**job, "setup": args.setup, "steps_per_epoch": spe, "eval_every": every, "reached": reached,
            "diverged": diverged, "steps": step, "examples": step * batch, "val_curve": curve,
            "noise_curve": noise, "b_simple_at_target": at_target, "test": round(test, 2),
            "seconds": round(time.perf_counter() - t0, 1), "cpu_seconds": round(time.process_time() - c0, 1)}


# ---------------------------------------------------------------------------------------------
# the plan


def key(j: dict[str, Any]) -> tuple:
    return (j["recipe"], j["batch"], float(j["lr"]), j["seed"])


def read_rows(path: Path) -> dict[tuple, dict[str, Any]]:
    """Rows by point (recipe, batch, lr, seed); the first row written for a point counts."""
    return fixed.read_rows(path, key)


def on_grid(centre: float, j: int) -> float:
    """The j-th point of the sqrt(2) grid through ``centre`` (rounded, so rows' keys match)."""
    return float(f"{centre * SQRT2 ** j:.6g}")


def score(rows: dict, recipe: str, batch: int, lr: float, seeds: Sequence[int]) -> float | None:
    """Mean log steps-to-target over ``seeds``; inf as soon as one has missed it (the others
    cannot change that, so they are not run); None until all ran."""
    rs = [rows.get((recipe, batch, float(lr), s)) for s in seeds]
    if any(r is not None and not r["reached"] for r in rs):
        return math.inf
    if any(r is None for r in rs):
        return None
    return statistics.mean(math.log(r["steps"]) for r in rs)


def grid_of(rows: dict, recipe: str, batch: int, args: argparse.Namespace) -> list[float] | None:
    """The cell's lr grid (None while SGD waits for the base batch's choice): three sqrt(2)-spaced
    points around the centre, an edge grown while the best (least mean log steps) sits on it, the
    low edge while no lr reaches the target (the usual failure of a too large lr)."""
    if recipe == "lars":
        centre = args.lars_lr
    elif batch == args.base_batch:
        centre = args.sgd_lr
    else:
        eta = chosen_lr(rows, recipe, args.base_batch, args)
        if eta is None:
            return None
        centre = eta * batch / args.base_batch
    lo, hi = -1, 1
    for _ in range(args.max_grow):
        grid = [on_grid(centre, j) for j in range(lo, hi + 1)]
        scores = [score(rows, recipe, batch, lr, args.seeds[: args.sweep_seeds]) for lr in grid]
        if any(s is None for s in scores):
            break
        best = min(range(len(grid)), key=lambda i: scores[i])
        if math.isinf(scores[best]) or best == 0:
            lo -= 1
        elif best == len(grid) - 1:
            hi += 1
        else:
            break
    return [on_grid(centre, j) for j in range(lo, hi + 1)]


def chosen_lr(rows: dict, recipe: str, batch: int, args: argparse.Namespace) -> float | None:
    """The lr with the fewest mean log steps over the sweep seeds, once the grid is complete and
    settled (its best inside it); None before, or when no lr of a fully grown grid reaches the target."""
    grid = grid_of(rows, recipe, batch, args)
    if grid is None:
        return None
    scores = [score(rows, recipe, batch, lr, args.seeds[: args.sweep_seeds]) for lr in grid]
    if any(s is None for s in scores):
        return None
    best = min(range(len(grid)), key=lambda i: scores[i])
    return None if math.isinf(scores[best]) else grid[best]


def cells(args: argparse.Namespace) -> list[tuple[str, int]]:
    return [(r, b) for b in args.batches for r in args.recipes]


def plan(rows: dict, args: argparse.Namespace) -> tuple[list[dict[str, Any]], int]:
    """(points runnable now and not yet trained, base batch first; cells still blocked)."""
    jobs: list[dict[str, Any]] = []
    blocked = 0
    for recipe, batch in cells(args):
        grid = grid_of(rows, recipe, batch, args)
        if grid is None:
            blocked += 1
            continue
        sweep = args.seeds[: args.sweep_seeds]
        jobs += [{"recipe": recipe, "batch": batch, "lr": lr, "seed": s}
                 for s in sweep for lr in grid if score(rows, recipe, batch, lr, sweep) != math.inf]
        lr = chosen_lr(rows, recipe, batch, args)
        if lr is not None:
            jobs += [{"recipe": recipe, "batch": batch, "lr": lr, "seed": s} for s in args.seeds[args.sweep_seeds:]]
    seen: set[tuple] = set()
    todo = []
    for j in jobs:
        if key(j) not in rows and key(j) not in seen:
            seen.add(key(j))
            todo.append(j)
    return todo, blocked


def cap_of(rows: dict, job: dict[str, Any], args: argparse.Namespace) -> int | None:
    """A sweep run's step cap: ``--cap-factor`` x the fewest steps any run of its cell reached the
    target in; None (no cap) before one has, and for the chosen lr's other seeds."""
    if job["seed"] not in args.seeds[: args.sweep_seeds]:
        return None
    hits = [r["steps"] for r in rows.values() if (r["recipe"], r["batch"]) == (job["recipe"], job["batch"])
            and r["reached"]]
    return math.ceil(args.cap_factor * min(hits)) if hits else None


def worker(args: argparse.Namespace) -> int:
    torch.set_num_threads(1)
    rows_path = args.out.with_suffix(".jsonl")
    claims = args.out.parent / (args.out.name + ".claims")
    data = fixed.load_data(args)
    while True:
        todo, blocked = plan(read_rows(rows_path), args)
        ran = False
        for j in todo:
            with fixed.claim(claims, {**j, "epochs": 0}) as mine:
                if not mine:
                    continue
                rows = read_rows(rows_path)  # again: another worker may have written since the plan
                if key(j) in rows:
                    break
                row = train_one({**j, "cap": cap_of(rows, j, args)}, data, args)
                fixed.append_row(rows_path, row)
                print(f"[{os.getpid()}] {row['recipe']} b={row['batch']} lr={row['lr']:g} seed={row['seed']}: "
                      f"{'reached' if row['reached'] else 'missed'} at step {row['steps']} "
                      f"B_simple {row['b_simple_at_target']} ({row['seconds']} s)", flush=True)
                ran = True
                break
        if not ran:
            if not todo:  # done, or the cells left wait on a base batch no lr of which reached the target
                return 0
            time.sleep(2)  # the rest is claimed by another worker


# ---------------------------------------------------------------------------------------------
# the model S = S_min (1 + B_crit / B), fitted; the resolution


def fit_curve(batches: Sequence[float], steps: Sequence[float]) -> tuple[float, float]:
    """Least-squares fit of log S = log S_min + log(1 + B_crit / B) over the points (B, S): (S_min, B_crit).

    Log steps, since the seed spread of steps is roughly proportional to the steps. Both parameters
    are fitted on the log scale (positive by construction); B_crit is bounded to [1e-3, 1e9] x the
    batches' range, so a curve with no visible bend returns an edge, which the bootstrap shows."""
    from scipy import optimize
    b = np.asarray(batches, dtype=float)
    ls = np.log(np.asarray(steps, dtype=float))

    def resid(p: np.ndarray) -> np.ndarray:
        return p[0] + np.log1p(np.exp(p[1]) / b) - ls

    def jac(p: np.ndarray) -> np.ndarray:  # exact: the bootstrap's ~6,000 fits spent a third of
        c = np.exp(p[1])  # their time in finite differences
        return np.stack([np.ones_like(b), c / (b + c)], axis=1)

    lo, hi = math.log(b.min() * 1e-3), math.log(b.max() * 1e9)
    best = None
    for guess in (b.min(), math.sqrt(b.min() * b.max()), b.max()):  # a few starts: the fit is not convex
        p0 = np.array([ls.min(), math.log(guess)])
        r = optimize.least_squares(resid, p0, jac=jac, bounds=([-np.inf, lo], [np.inf, hi]))
        if best is None or r.cost < best.cost:
            best = r
    return float(math.exp(best.x[0])), float(math.exp(best.x[1]))


def percentile_interval(v: Sequence[float]) -> tuple[float, float]:
    """The 95% percentile interval of bootstrap draws."""
    return float(np.percentile(v, 2.5)), float(np.percentile(v, 97.5))


def bootstrap_draws(by_batch: dict[int, list[float]], draws: int = 1000, seed: int = 0
                    ) -> tuple[list[float], list[float]]:
    """(S_min, B_crit) fitted to ``draws`` resamples of the seeds (with replacement within each batch)."""
    got = joint_draws(by_batch, None, draws, seed)
    return [g[0] for g in got], [g[1] for g in got]


def joint_draws(by_batch: dict[int, list[float]], noise: dict[int, list[float | None]] | None,
                draws: int = 1000, seed: int = 0) -> list[tuple[float, float, float | None]]:
    """(S_min, B_crit, median B_simple) per resample of the runs (with replacement within each batch):
    ``noise`` gives each run's B_simple at the target in ``by_batch``'s order (None: not probed), so
    a resampled run brings its steps and its B_simple together and the ratio B_simple / B_crit gets
    one interval from the same draws (None as the third value without ``noise``)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(draws):
        xs, ys, ns = [], [], []
        for b in sorted(by_batch):
            v = by_batch[b]
            for i in rng.choice(len(v), size=len(v), replace=True):
                xs.append(b)
                ys.append(v[i])
                if noise and noise[b][i] is not None:
                    ns.append(noise[b][i])
        s_min, b_crit = fit_curve(xs, ys)
        out.append((s_min, b_crit, statistics.median(ns) if ns else None))
    return out


def lr_choice_span(means: dict[int, dict[float, float]], sd: float, df: int, n: int, grid_points: int = 2000
                   ) -> tuple[float, float, int] | None:
    """The least and greatest B_crit over every choice of one lr per batch among the lrs whose sweep
    the rows cannot tell from the chosen one (``fixed.tied_lrs`` on mean log steps over the ``n``
    sweep seeds, spread ``sd`` on ``df``), each choice fitted to its sweep seeds' mean log steps (the
    fit on the seeds, which are as many at every batch); and the number of choices. ``means``: per
    batch, lr -> mean log steps. None with fewer than three batches.

    The choices multiply (thousands), so a profile of the fit's cost over a log grid of B_crit (S_min
    is closed-form for a given B_crit) ranks them all at once, and the extreme ones are refitted by
    ``fit_curve``."""
    if len(means) < 3:
        return None
    bs = sorted(means)
    sets = [fixed.tied_lrs({lr: -m for lr, m in means[b].items()}, sd, df, n) for b in bs]
    picks = np.array(list(itertools.product(*[[means[b][lr] for lr in s] for b, s in zip(bs, sets)])))
    grid = np.exp(np.linspace(math.log(min(bs) / 64), math.log(max(bs) * 64), grid_points))
    f = np.log1p(grid[None, :] / np.asarray(bs, dtype=float)[:, None])  # (batches, grid)
    cost = np.zeros((len(picks), grid_points))
    for chunk in range(0, len(picks), 512):
        r = picks[chunk:chunk + 512, :, None] - f[None]  # (choices, batches, grid)
        cost[chunk:chunk + 512] = (r ** 2).sum(1) - r.sum(1) ** 2 / len(bs)
    on_grid = grid[cost.argmin(1)]
    order = np.argsort(on_grid)
    refit = [fit_curve(bs, [math.exp(m) for m in picks[i]])[1] for i in (*order[:8], *order[-8:])]
    return min(refit), max(refit), len(picks)


def doubling_gain(batch: float, b_crit: float) -> float:
    """How many times fewer steps twice the batch takes, in the fitted model."""
    return (1 + b_crit / batch) / (1 + b_crit / (2 * batch))


def region(batch: float, b_crit: float) -> str:
    r = doubling_gain(batch, b_crit)
    return "perfect scaling" if r >= PERFECT_RATIO else "maximal data parallelism" if r <= FLAT_RATIO \
        else "diminishing returns"


def resolvable_ratio(sd_log: float, n: int, alpha: float, power: float = 0.8) -> float:
    """The smallest ratio of mean steps between two batches (n seeds each, seed spread ``sd_log``
    of log steps) that a two-sided t test at ``alpha`` finds with probability ``power``."""
    return math.exp(fixed.mde(sd_log, n, alpha, power))


# ---------------------------------------------------------------------------------------------
# the target, chosen from a pilot's curves before the study runs


def crossing(curve: Sequence[Sequence[float]], target: float) -> int | None:
    """The first evaluated step whose val top-1 is at least ``target`` (None if none is)."""
    return next((int(step) for step, acc in curve if acc >= target), None)


def target_table(pilot: dict, targets: Sequence[float], n: int, alpha: float, resolve: float = SQRT2
                 ) -> list[dict[str, Any]]:
    """For each candidate target: the pilot's runs that never crossed it, the seed spread of log
    first-crossing steps (pooled over its (recipe, batch, lr) points with two or more seeds), that
    spread smoothed over the neighbouring candidates, the smallest ratio of steps ``n`` seeds per
    batch resolve at ``alpha`` (80% power) with the smoothed spread, and the seeds that would
    resolve ``resolve``.

    The pilot trained to a higher target, so every lower target's crossing is in its val curves: a
    run stopped at the candidate would have taken the same steps up to it (same seed, same data
    order). A point where some seed never crossed counts as a miss, not as a shorter spread.
    Smoothed: each level's spread is an estimate with few degrees of freedom, so picking the
    level with the least would pick the luckiest estimate; the variance averaged with the levels
    on either side (the pilot's 12 runs: 0.077 at 88%, 0.130 and 0.136 at 89 and 90%) damps that."""
    raw = []
    for t in targets:
        groups: dict[tuple, list[float]] = {}
        missed = 0
        for r in pilot.values():
            c = crossing(r["val_curve"], t)
            if c is None:
                missed += 1
            else:
                groups.setdefault((r["recipe"], r["batch"], float(r["lr"])), []).append(math.log(c))
        sd, df = fixed.pooled_sd(list(groups.values()))
        raw.append({"target": t, "sd": sd, "df": df, "missed": missed, "runs": len(pilot)})
    for i, row in enumerate(raw):
        near = [x["sd"] ** 2 for x in raw[max(0, i - 1): i + 2] if x["df"]]
        row["smoothed"] = math.sqrt(statistics.mean(near)) if row["df"] and near else math.nan
        ok = row["df"] and row["smoothed"] > 0
        row["ratio"] = resolvable_ratio(row["smoothed"], n, alpha) if ok else (1.0 if row["df"] else math.inf)
        if not row["df"]:
            row["seeds_needed"] = None
        elif not ok:  # no spread at all: the fewest seeds a spread can be read from
            row["seeds_needed"] = 3
        else:
            row["seeds_needed"] = seeds_for(row["smoothed"], resolve, alpha)
    return raw


def seeds_for(sd: float, resolve: float, alpha: float, most: int = 32) -> int | None:
    """The fewest seeds per batch (3 to ``most``) that resolve a ratio of ``resolve`` with seed
    spread ``sd``; None when even ``most`` do not."""
    for k in range(3, most + 1):
        if resolvable_ratio(sd, k, alpha) <= resolve:
            return k
    return None


def choose_target(table: Sequence[dict[str, Any]], resolve: float) -> float | None:
    """The highest candidate no pilot run missed whose resolvable ratio (smoothed spread) is at
    most ``resolve``: the highest target is the most demanding (McCandlish et al.'s B_crit grows as
    the target gets harder), but the study is only worth running where its seeds resolve less
    than a doubling's gain."""
    ok = [row["target"] for row in table if not row["missed"] and row["ratio"] <= resolve]
    return max(ok) if ok else None


def target_section(args: argparse.Namespace) -> list[str]:
    """The report's account of how the target was chosen, from the pilot rows file."""
    pilot = read_rows(args.pilot)
    if not pilot:
        return [f"No pilot rows in `{args.pilot.name}`: the target {args.target:g}% was set by hand.", ""]
    m, n = comparisons(args), len(args.seeds)
    table = target_table(pilot, args.candidate_targets, n, 0.05 / m, args.resolve)
    chosen = choose_target(table, args.resolve)
    lrs = sorted({float(r["lr"]) for r in pilot.values()})
    L = [f"From the pilot (`{args.pilot.name}`: {len(pilot)} runs at batch "
         f"{', '.join(str(b) for b in sorted({r['batch'] for r in pilot.values()}))}, lrs "
         f"{', '.join(f'{lr:.3g}' for lr in lrs)}, each trained until {max(r['setup']['target'] for r in pilot.values()):g}% "
         f"val), before any row of the study: the first crossing of each candidate target in the pilot's val curves, "
         f"the seed spread of its log steps, that spread smoothed over the neighbouring levels (its variance averaged "
         f"with theirs: one level's estimate has few degrees of freedom, and the least of 16 would be the luckiest), the "
         f"smallest ratio of steps {n} seeds per batch resolve with it ({m} neighbour comparisons, alpha 0.05/{m}, 80% "
         f"power) and the seeds that would resolve {args.resolve:.2f}x. The rule: the highest target no pilot run "
         f"missed that resolves {args.resolve:.2f}x or less.", "",
         "| target (% val) | pilot runs that never reached it | seed spread of log steps (df) | smoothed | "
         f"resolved ratio ({n} seeds) | seeds for {args.resolve:.2f}x |",
         "|---|---|---|---|---|---|"]
    for row in table:
        mark = " **(chosen)**" if row["target"] == chosen else ""
        sd = f"{row['sd']:.3f} ({row['df']})" if row["df"] else "-"
        smooth = f"{row['smoothed']:.3f}" if row["df"] else "-"
        ratio = "-" if math.isinf(row["ratio"]) else f"{row['ratio']:.2f}x"
        need = "-" if row["seeds_needed"] is None else str(row["seeds_needed"])
        L.append(f"| {row['target']:g}{mark} | {row['missed']}/{row['runs']} | {sd} | {smooth} | {ratio} | {need} |")
    L.append("")
    if chosen is None:
        L += ["No candidate meets the rule: the study's design cannot resolve a doubling with these seeds.", ""]
    elif chosen != args.target:
        L += [f"**The study runs at {args.target:g}%, not the rule's {chosen:g}%.**", ""]
    return L


# ---------------------------------------------------------------------------------------------
# the report


def chosen_rows(rows: dict, recipe: str, batch: int, args: argparse.Namespace) -> list[dict[str, Any]]:
    lr = chosen_lr(rows, recipe, batch, args)
    return [] if lr is None else [r for s in args.seeds if (r := rows.get((recipe, batch, lr, s)))]


def geo_interval(v: Sequence[float]) -> tuple[float, float, float]:
    """Geometric mean of ``v`` and its 95% t interval (both ends the mean for one value)."""
    m, lo, hi = fixed.mean_ci([math.log(x) for x in v])
    return (math.exp(m), math.exp(lo), math.exp(hi)) if len(v) > 1 else (math.exp(m),) * 3


def geo_ci(v: Sequence[float]) -> str:
    m, lo, hi = geo_interval(v)
    return f"{m:.0f} [{lo:.0f}, {hi:.0f}]" if len(v) > 1 else f"{v[0]:.0f}"


def comparisons(args: argparse.Namespace) -> int:
    """Tests the design makes: each batch against the next (per recipe): fixed before any row (at
    least 1, so that a one-batch run, the pilot, still reports at a level)."""
    return max(1, len(args.recipes) * (len(args.batches) - 1))


def reached_steps(rows: dict, recipe: str, args: argparse.Namespace) -> tuple[dict[int, list[float]], dict[int, str]]:
    """Per batch of ``recipe``, the chosen lr's steps where every one of its seeds reached the target;
    and the batches where some seed did not, as "reached/run" (they are neither fitted nor compared)."""
    by_batch: dict[int, list[float]] = {}
    missed: dict[int, str] = {}
    for b in args.batches:
        rs = chosen_rows(rows, recipe, b, args)
        got = [float(r["steps"]) for r in rs if r["reached"]]
        if rs and len(got) == len(rs):
            by_batch[b] = got
        elif len(got) < len(rs):
            missed[b] = f"{len(got)}/{len(rs)}"
    return by_batch, missed


def seed_spread(rows: dict, args: argparse.Namespace) -> tuple[float, int]:
    """The seed spread of log steps to the target, pooled over the cells whose chosen lr has all its
    seeds at the target, and its degrees of freedom (0 while none has)."""
    n = len(args.seeds)
    groups = [[math.log(r["steps"]) for r in chosen_rows(rows, rc, b, args) if r["reached"]] for rc, b in cells(args)]
    return fixed.pooled_sd([g for g in groups if len(g) == n])


def sweep_scores(rows: dict, recipe: str, args: argparse.Namespace) -> dict[int, dict[float, float]]:
    """Per batch whose lr is chosen: each lr of its grid with every sweep seed at the target -> their
    mean log steps (the score the lr was chosen by)."""
    out = {}
    for b in args.batches:
        if chosen_lr(rows, recipe, b, args) is None:
            continue
        got = {lr: s for lr in grid_of(rows, recipe, b, args) or []
               if (s := score(rows, recipe, b, lr, args.seeds[: args.sweep_seeds])) is not None and math.isfinite(s)}
        out[b] = got
    return out


def ema_lag(rows: list[dict[str, Any]], args: argparse.Namespace) -> tuple[float, float] | None:
    """How B_simple moved over the last epoch before the target and what the EMA reads for it, the
    medians over ``rows`` that have an epoch of noise curve before their target: (growth per epoch,
    read / true). Read / true is an EMA's (decay ``--noise-beta`` per probe, P probes an epoch) of a
    value growing by r an epoch at a steady rate: (1 - beta) / (1 - beta r^(-1/P))."""
    per, beta = args.evals_per_epoch, args.noise_beta
    growth, read = [], []
    for r in rows:
        c = r.get("noise_curve") or []  # the tests' rows carry none
        if r["reached"] and len(c) > per and c[-1][0] == r["steps"] and c[-1 - per][1] > 0:
            g = c[-1][1] / c[-1 - per][1]
            spe = r["steps_per_epoch"]
            probes = spe / eval_every(spe, args.probes_per_epoch)
            growth.append(g)
            read.append((1 - beta) / (1 - beta * g ** (-1 / probes)))
    return (statistics.median(growth), statistics.median(read)) if growth else None


def fit_recipe(rows: dict, recipe: str, args: argparse.Namespace) -> dict[str, Any] | None:
    """The fit S = S_min (1 + B_crit / B) over ``reached_steps``'s batches (None with fewer than
    three): the fitted values, their 95% bootstrap intervals over seeds, the bootstrap's B_crit draws
    and the B_simple each fitted run read at the target; the ratio median B_simple / B_crit with its
    interval from the same draws (``ratio``: value, lo, hi; None without B_simple), per probed batch
    its median B_simple / B_crit (``per_batch``), B_crit's span over the lrs the sweep seeds cannot
    tell apart (``lr_span``, ``lr_choice_span``) and the EMA's lag at the target (``lag``, ``ema_lag``)."""
    by_batch, _ = reached_steps(rows, recipe, args)
    if len(by_batch) < 3:
        return None
    s_min, b_crit = fit_curve([b for b in by_batch for _ in by_batch[b]], [s for b in by_batch for s in by_batch[b]])
    runs = {b: chosen_rows(rows, recipe, b, args) for b in by_batch}
    draws = joint_draws(by_batch, {b: [r["b_simple_at_target"] for r in rs] for b, rs in runs.items()})
    noise = [r["b_simple_at_target"] for b in by_batch for r in runs[b] if r["b_simple_at_target"] is not None]
    per_batch = {b: statistics.median(v) / b_crit for b, rs in runs.items()
                 if (v := [r["b_simple_at_target"] for r in rs if r["b_simple_at_target"] is not None])}
    ratio = None
    if noise:
        lo, hi = percentile_interval([d[2] / d[1] for d in draws])
        ratio = (statistics.median(noise) / b_crit, lo, hi)
    sd, df = seed_spread(rows, args)
    return {"s_min": s_min, "b_crit": b_crit, "s": percentile_interval([d[0] for d in draws]),
            "b": percentile_interval([d[1] for d in draws]), "draws": [d[1] for d in draws], "noise": noise,
            "batches": sorted(by_batch), "ratio": ratio, "per_batch": per_batch,
            "lr_span": lr_choice_span(sweep_scores(rows, recipe, args), sd, df, args.sweep_seeds) if df else None,
            "lag": ema_lag([r for rs in runs.values() for r in rs], args)}


def fit_recipes(args: argparse.Namespace, rows: dict) -> dict[str, dict[str, Any]]:
    """``fit_recipe`` for each recipe that has a fit."""
    return {recipe: f for recipe in args.recipes if (f := fit_recipe(rows, recipe, args))}


def results_section(args: argparse.Namespace, rows: dict, heading: str = "##",
                    fits: dict[str, dict[str, Any]] | None = None) -> list[str]:
    """The steps table (each batch's chosen lr, its seeds' steps to the target, B_simple there) and,
    per recipe with three batches at the target, the fit S = S_min (1 + B_crit / B), its bootstrap
    interval and B_simple against it: the report's results, and the scaling-rule page's. ``fits``:
    ``fit_recipes``'s, where the caller has them (the bootstrap is the costly part)."""
    L = [f"{heading} Steps to the target", "",
          "| recipe | batch | lr | steps (geometric mean, 95% interval) | examples (that mean x the batch) | reached | "
          "B_simple at target |",
          "|---|---|---|---|---|---|---|"]
    fits = fit_recipes(args, rows) if fits is None else fits
    doublings: dict[str, dict[int, list[float]]] = {}
    missed: dict[str, dict[int, str]] = {}  # batches where a seed of the chosen lr never reached the target
    for recipe in args.recipes:
        for b in args.batches:
            rs = chosen_rows(rows, recipe, b, args)
            lr = chosen_lr(rows, recipe, b, args)
            if not rs:
                L.append(f"| {recipe} | {b} | {'pending' if lr is None else f'{lr:g}'} | pending | | | |")
                continue
            got = [r["steps"] for r in rs if r["reached"]]
            noise = [r["b_simple_at_target"] for r in rs if r["b_simple_at_target"] is not None]
            L.append(f"| {recipe} | {b} | {lr:g} | {geo_ci(got) if got else 'not reached'} | "
                     f"{f'{geo_interval(got)[0] * b:,.0f}' if got else ''} | {len(got)}/{len(rs)} | "
                     f"{f'{statistics.median(noise):.0f} (n={len(noise)})' if noise else 'not probed'} |")
        doublings[recipe], missed_here = reached_steps(rows, recipe, args)
        if missed_here:
            missed[recipe] = missed_here
    L.append("")
    L += doubling_section(args, doublings, heading, missed)
    L += [f"{heading} The fit S = S_min (1 + B_crit / B) and the noise scale", ""]
    if not fits:
        L += ["No fit yet: it needs three batches with every seed at the target.", ""]
    for recipe, f in fits.items():
        top = f"{f['b'][1]:.0f}" if f["b"][1] <= 16 * max(f["batches"]) else "unbounded: no bend within these batches"
        L += [f"**{recipe}**: S_min {f['s_min']:.0f} steps [{f['s'][0]:.0f}, {f['s'][1]:.0f}], B_crit "
              f"**{f['b_crit']:.0f}** [{f['b'][0]:.0f}, {top}] images (95% bootstrap over seeds, "
              f"batches {f['batches']}). Regions: " +
              ", ".join(f"{b}: {region(b, f['b_crit'])}" for b in f["batches"]) + "."]
        if f["ratio"]:
            L += ["", *noise_lines(f).split("\n")]  # two paragraphs
        L.append("")
    L += recipes_compared(fits)
    L += [f"Regions as named above: perfect scaling where doubling the batch cuts the steps by {PERFECT_RATIO}x or "
          f"more in the fitted model (B <= B_crit/8), maximal data parallelism where by {FLAT_RATIO}x or less "
          "(B >= 4.5 B_crit), diminishing returns between.", ""]
    return L


def noise_verdict(ratio: tuple[float, float, float], span: tuple[float, float] | None, b_simple: float,
                  reach: tuple[float, float] | None = None) -> str:
    """What B_simple says about the bend, from the ratio B_simple / B_crit and its joint interval
    (``ratio``: value, lo, hi), B_crit's span over the lr choices the sweeps cannot tell apart
    (``span``) and B_simple's range over the batches it is read at, corrected for the EMA's lag
    (``reach``): a prediction where the interval holds 1; an under- or overestimate "consistent with
    'approximately'" where the span holds B_simple (the bend may be there for an lr the rows cannot
    rule out); not told apart from that where only ``reach`` meets the span; otherwise off by the
    factor, which none of these closes."""
    r, lo, hi = ratio
    if lo <= 1 <= hi:
        return "the ratio's interval holds 1: the noise scale predicts the bend here"
    factor, side = (1 / r, "under") if r < 1 else (r, "over")
    if span and span[0] <= b_simple <= span[1]:
        return (f"a {factor:.1f}x {side}estimate, consistent with \"approximately\": the bend of some lr choice "
                "the sweeps cannot rule out lies at B_simple")
    off = f"{factor:.1f}x {'below' if r < 1 else 'above'} the bend"
    if span and reach and reach[0] <= span[1] and span[0] <= reach[1]:
        return (f"{off} at the chosen lrs, but read at another batch and corrected for the EMA's lag B_simple "
                "reaches B_crit's span over the lr choices: not told apart from \"approximately\"")
    return (f"{off}, outside the ratio's interval, B_crit's span over the lr choices and B_simple's range over "
            "the batches it is read at (corrected for the EMA's lag)")


def noise_lines(f: dict[str, Any]) -> str:
    """B_simple against a fit (``fit_recipe``'s): the ratio with its joint interval, B_crit's span
    over the lr choices, how B_simple depends on the batch it is read at and on the EMA's lag, and
    the verdict (``noise_verdict``)."""
    med = statistics.median(f["noise"])
    r, lo, hi = f["ratio"]
    span, pb, lag = f["lr_span"], f["per_batch"], f["lag"]
    text = (f"B_simple at the target (median of {len(f['noise'])} runs): **{med:.0f}**, {r:.2f} x the fitted B_crit "
            f"[{lo:.2f}, {hi:.2f}] (95%, the same bootstrap: each resampled run brings its B_simple). ")
    if span:
        text += (f"B_crit's interval is for the chosen lrs: over every choice of one lr per batch among those the "
                 f"sweep seeds cannot tell apart ({span[2]:,} choices, each fitted to its sweep seeds) B_crit spans "
                 f"{span[0]:.0f}-{span[1]:.0f}, which {'holds' if span[0] <= med <= span[1] else 'does not hold'} "
                 "B_simple. ")
    reach = None
    text = text.rstrip() + "\n\n"
    if len(pb) > 1:
        text += (f"B_simple also depends on the batch it is read at: {min(pb.values()):.2f}-{max(pb.values()):.2f} "
                 f"x B_crit over batches {min(pb)}-{max(pb)} ({pb[min(pb)]:.2f} at {min(pb)}, {pb[max(pb)]:.2f} at "
                 f"{max(pb)})")
        text += (f"; over the last epoch before the target it grew {lag[0]:.2f}x (median), which the EMA "
                 f"reads {abs(1 - lag[1]) * 100:.0f}% {'low' if lag[1] < 1 else 'high'}. ") if lag else ". "
        fix = 1 / lag[1] if lag else 1.0
        reach = (min(pb.values()) * f["b_crit"] * fix, max(pb.values()) * f["b_crit"] * fix)
    return text + f"So: **{noise_verdict(f['ratio'], span[:2] if span else None, med, reach)}**."


def doubling_word(lo: float, hi: float) -> str:
    """The verdict on a doubling from the interval [lo, hi] of its ratio of steps (before / after)."""
    if hi < 1:
        return "more steps"
    if lo <= 1:
        return "not resolved"
    if hi < 2:
        return "fewer steps, less than halved"
    if lo > 2:
        return "more than halved"
    return "fewer steps; halving not excluded"


def recipes_compared(fits: dict[str, dict[str, Any]]) -> list[str]:
    """Each fitted recipe's B_crit against the first's: the ratio of the fits, its 95% interval
    from the two bootstraps' draws (independent runs, so the draws pair at random), and whether
    it tells the two apart; B_simple at the target beside it (medians)."""
    if len(fits) < 2:
        return []
    (first, f0), *others = fits.items()
    L = []
    for recipe, f in others:
        lo, hi = percentile_interval([a / b for a, b in zip(f["draws"], f0["draws"])])
        word = "larger" if lo > 1 else "smaller" if hi < 1 else "not told apart"
        noise = (f"; B_simple at the target {statistics.median(f['noise']) / statistics.median(f0['noise']):.2f}x"
                 f" {first}'s") if f["noise"] and f0["noise"] else ""
        L.append(f"**{recipe} against {first}**: B_crit {f['b_crit'] / f0['b_crit']:.2f}x {first}'s [{lo:.2f}, "
                 f"{hi:.2f}] (95%, the two bootstraps' draws): {word}{noise}.")
    return L + [""]


HALVING = ("fewer steps; halving not excluded", "more than halved")  # the words perfect scaling allows


def doubling_summary(recipe: str, words: Sequence[tuple[int, int, str | None]], pending: int = 0) -> str:
    """One line per recipe answering the study's question from its doublings' words, in batch
    order ((b, 2b, word), None where pending), and the count of the doublings after them
    still pending: up to which batch the rows cannot exclude that doubling halves the steps, then
    each later stretch of doublings with the same word."""
    if not words or words[0][2] is None:
        return f"**{recipe}**: pending."
    i = 0
    while i < len(words) and words[i][2] in HALVING:
        i += 1
    parts = [f"halving not excluded at every doubling up to batch {words[i - 1][1]} (from {words[0][0]})"
             if i else f"halving excluded from the first doubling ({words[0][0]} -> {words[0][1]})"]
    while i < len(words):
        j = i
        while j + 1 < len(words) and words[j + 1][2] == words[i][2]:
            j += 1
        span = f"{words[i][0]} -> {words[j][1]}" + (f" ({j - i + 1} doublings)" if j > i else "")
        parts.append(f"{words[i][2] or 'pending'}: {span}")
        i = j + 1
    if pending:
        parts.append(f"{pending} more doubling{'s' if pending > 1 else ''} pending")
    return f"**{recipe}**: " + "; ".join(parts) + "."


def doubling_section(args: argparse.Namespace, by_recipe: dict[str, dict[int, list[float]]],
                     heading: str = "##", missed: dict[str, dict[int, str]] | None = None) -> list[str]:
    """Each batch against the next, per recipe: the ratio of geometric-mean steps (before / after),
    its interval at the design's Bonferroni level (Welch's t on log steps) and what it shows:
    perfect scaling halves the steps; an interval holding 1 is "not resolved", and the study says
    so rather than sweeping further. A batch where a seed of the chosen lr never reached the target
    (``missed``: its reached count) has no geometric mean: its doublings say so. Then one line per
    recipe: up to which batch doubling may halve the steps (``doubling_summary``)."""
    m = comparisons(args)
    L = [f"{heading} Doubling the batch", "",
         f"Each batch against the next: how many times fewer steps the larger one took (geometric means), "
         f"with its interval at alpha 0.05/{m} ({m} comparisons, Welch's t on log steps). Perfect scaling is 2x.", "",
         "| recipe | batches | fewer steps (x) | interval | shows |", "|---|---|---|---|---|"]
    summary = []
    for recipe, by_batch in by_recipe.items():
        words: list[tuple[int, int, str | None]] = []
        for b, b2 in zip(args.batches, args.batches[1:]):
            if b not in by_batch or b2 not in by_batch:
                short = [f"{x}: {got} seeds reached" for x in (b, b2)
                         if (got := (missed or {}).get(recipe, {}).get(x))]
                shows = f"not compared ({'; '.join(short)})" if short else "pending"
                L.append(f"| {recipe} | {b} -> {b2} | {shows} | | |")
                words.append((b, b2, "not compared" if short else None))
                continue
            v = fixed.verdict([math.log(x) for x in by_batch[b]], [math.log(x) for x in by_batch[b2]],
                              margin=0.0, alpha=0.05 / m)  # its two-sided interval; no equivalence asked
            lo, hi = math.exp(v["lo"]), math.exp(v["hi"])
            L.append(f"| {recipe} | {b} -> {b2} | {math.exp(v['diff']):.2f} | [{lo:.2f}, {hi:.2f}] | "
                     f"{doubling_word(lo, hi)} |")
            words.append((b, b2, doubling_word(lo, hi)))
        while words and words[-1][2] is None:  # the pending tail: said once
            words.pop()
        summary.append(doubling_summary(recipe, words, len(args.batches) - 1 - len(words)))
    return L + ["", "In short, up to which batch doubling may halve the steps:", ""] + \
        [f"- {line}" for line in summary] + [""]


def write_report(args: argparse.Namespace, rows: dict) -> str:
    todo, blocked = plan(rows, args)
    n = len(args.seeds)
    m = comparisons(args)
    alpha = 0.05 / m
    n_train = args.classes * args.train_per_class
    L = ["# The scaling study, version 4: steps to a target", "",
         f"Rows: `{args.out.with_suffix('.jsonl').name}`; written by `benchmarks/steps_to_target.py --render` (the "
         "design is in that module's docstring).", "",
         f"{n_train} training images ({args.classes} classes of the embedded generator), conv net width {args.width}, "
         f"BN over groups of {args.bn_group}; target **{args.target:g}% val top-1**, checked {args.evals_per_epoch} "
         f"times per epoch, at most {args.max_epochs} epochs; constant lr after a {args.warmup_epochs:g}-epoch "
         f"warmup; lr tuned per batch on a sqrt(2) grid; seeds {args.seeds} ({args.sweep_seeds} over each sweep).", ""]
    if todo or blocked:
        L += [f"**Pending: {len(todo)} trainings runnable now, {blocked} cell(s) waiting on others' rows.**", ""]
    if rows:
        L += [f"Spent: {spent(rows)}.", ""]
    groups = [[math.log(r["steps"]) for r in chosen_rows(rows, rc, b, args) if r["reached"]] for rc, b in cells(args)]
    sd, df = fixed.pooled_sd([g for g in groups if len(g) == n])
    L += ["## The target", ""] + target_section(args)
    L += ["## What the rows can resolve", ""]
    if df:
        L += [f"Seed spread of log steps-to-target (pooled over the cells with all {n} seeds): {sd:.3f}. With {n} "
              f"seeds per batch, comparing neighbouring batches ({m} tests, alpha 0.05/{m}, 80% power): a ratio of "
              f"mean steps under **{resolvable_ratio(sd, n, alpha):.2f}x** is more likely missed than found.", ""]
    else:
        L += ["Seed spread: pending (no cell has all its seeds yet).", ""]
    L += results_section(args, rows)
    return "\n".join(L)


def spent(rows: dict) -> str:
    """What the rows cost: trainings, their core-minutes summed (each row's CPU seconds; a row from
    before those were recorded counts its wall seconds, one thread, which include any pause of its
    worker), and the share of the runs that stopped short of the target (sweep misses and caps)."""
    cost = [(r.get("cpu_seconds", r["seconds"]) / 60, r["reached"]) for r in rows.values()]
    wall = sum("cpu_seconds" not in r for r in rows.values())
    missed = [m for m, reached in cost if not reached]
    timed = "CPU time" + (f"; wall clock, one thread, for the {wall} rows from before CPU time was recorded, "
                          "which count their workers' pauses" if wall else "")
    return (f"{len(rows)} trainings, {sum(m for m, _ in cost):.0f} core-minutes ({timed}); {len(missed)} of them "
            f"stopped short of the target and took {sum(missed):.0f} of those minutes")


def plot(args: argparse.Namespace, rows: dict) -> None:
    plt = fixed.pyplot()
    if plt is None:
        return
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for recipe in args.recipes:
        pts = {b: [r["steps"] for r in chosen_rows(rows, recipe, b, args) if r["reached"]] for b in args.batches}
        pts = {b: v for b, v in pts.items() if v}
        if not pts:
            continue
        bs = sorted(pts)
        gm, lo, hi = zip(*(geo_interval(pts[b]) for b in bs))
        err = [[g - x for g, x in zip(gm, lo)], [x - g for g, x in zip(gm, hi)]]
        line = ax.errorbar(bs, gm, yerr=err, marker="o", capsize=3, label=recipe)[0]
        if len(bs) >= 3:
            s_min, b_crit = fit_curve([b for b in bs for _ in pts[b]], [s for b in bs for s in pts[b]])
            xs = np.geomspace(bs[0], bs[-1], 50)
            ax.plot(xs, s_min * (1 + b_crit / xs), ls="--", color=line.get_color(), alpha=0.7,
                    label=f"{recipe} fit, B_crit {b_crit:.0f}")
        ax.plot(bs, [gm[0] * bs[0] / b for b in bs], ls=":", color="grey", alpha=0.6)
    ax.set_xscale("log", base=2)
    ax.set_xticks(args.batches, [str(b) for b in args.batches])
    ax.set_xlim(args.batches[0] / 1.3, args.batches[-1] * 1.3)
    if ax.get_lines():
        ax.set_yscale("log")
    ax.set_xlabel("global batch size")
    ax.set_ylabel(f"steps to {args.target:g}% val top-1")
    ax.set_title("steps to target: geometric mean, 95% interval over seeds (dotted: perfect scaling)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(args.out.with_suffix(".png"), dpi=80)
    plt.close(fig)


def cost_estimate(args: argparse.Namespace) -> dict[str, Any] | None:
    """The cost and resolution before running, from the pilot's rows at the study's target: cells,
    trainings per cell and in all, epochs to the target at the base batch and at most per cell,
    seconds an epoch, core-minutes; the smoothed seed spread of log steps there (its df) and the
    ratio of steps the seeds resolve. ``None`` where no pilot run reaches the target."""
    pilot = read_rows(args.pilot)
    hits = [(c, r) for r in pilot.values() if (c := crossing(r["val_curve"], args.target))]
    if not hits:
        return None
    epoch_s = statistics.median(r["seconds"] / r["steps"] * r["steps_per_epoch"] for _, r in hits)
    epochs = statistics.median(c / r["steps_per_epoch"] for c, r in hits)
    # Beyond the base batch the epochs to a target grow with the batch; with no rows yet the guess is
    # the model's examples-to-target E = S_min (B + B_crit), B_crit guessed at the batches' geometric
    # middle, capped at --max-epochs: a guess, which the rows replace.
    guess = math.sqrt(min(args.batches) * max(args.batches))
    per_cell = 3 * args.sweep_seeds + (len(args.seeds) - args.sweep_seeds)  # a settled 3-point grid
    cell_epochs = [min(args.max_epochs, epochs * (b + guess) / (args.base_batch + guess)) for _, b in cells(args)]
    m = comparisons(args)
    t = args.target
    at = target_table(pilot, [t - 1, t, t + 1], len(args.seeds), 0.05 / m, args.resolve)[1]
    return {"cells": len(cells(args)), "per_cell": per_cell, "runs": len(cells(args)) * per_cell,
            "epochs": epochs, "max_cell_epochs": max(cell_epochs), "guess": guess, "epoch_s": epoch_s,
            "minutes": per_cell * sum(cell_epochs) * epoch_s / 60, "m": m, "sd": at["smoothed"], "df": at["df"],
            "ratio": resolvable_ratio(at["smoothed"], len(args.seeds), 0.05 / m)}


def estimate(args: argparse.Namespace) -> str:
    """``cost_estimate`` in words (``--plan``)."""
    e = cost_estimate(args)
    if e is None:
        return f"no pilot rows in {args.pilot} reach {args.target:g}%: no estimate"
    t, m = args.target, e["m"]
    return (f"cost: {e['cells']} cells x ~{e['per_cell']} trainings (3-point grids; each grown edge adds "
            f"{args.sweep_seeds}) = ~{e['runs']} trainings; {e['epochs']:.1f} epochs to {t:g}% at batch "
            f"{args.base_batch} (pilot median), up to {e['max_cell_epochs']:.0f} at {max(args.batches)} (B_crit guessed "
            f"{e['guess']:.0f}), {e['epoch_s']:.1f} s an epoch = ~{e['minutes']:.0f} core-minutes "
            f"({e['minutes'] / 60:.1f} h of one core)\n"
            f"resolution (pilot, first crossing of {t:g}%): seed spread of log steps {e['sd']:.3f} (smoothed over "
            f"{t - 1:g}-{t + 1:g}%; {e['df']} df a level); with "
            f"{len(args.seeds)} seeds per batch and {m} neighbour comparisons (alpha 0.05/{m}, 80% power) a ratio "
            f"of steps under {e['ratio']:.2f}x is not resolved.")


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=1, help="parallel training processes, one thread each")
    p.add_argument("--render", action="store_true", help="no training: the report from the rows file")
    p.add_argument("--plan", action="store_true", help="no training: cost and resolution estimates")
    p.add_argument("--quick", action="store_true", help="smoke test: tiny data, temp folder")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--batches", type=int, nargs="+", default=[32, 64, 128, 256, 512, 1024],
                   help="global batches (powers of two); the smallest is the base")
    p.add_argument("--recipes", nargs="+", choices=list(RECIPES), default=list(RECIPES),
                   help="the recipes studied (a pilot may run one)")
    p.add_argument("--target", type=float, default=89.0,
                   help="val top-1 (%%) every run trains to (the pilot's rule's choice: see --plan)")
    p.add_argument("--pilot", type=Path, default=Path(__file__).parent / "results" / "steps_to_target_pilot.jsonl",
                   help="rows of runs trained past every candidate target: the target's choice (--plan, the report)")
    p.add_argument("--candidate-targets", type=float, nargs="+", default=[float(t) for t in range(80, 96)],
                   help="val top-1 (%%) levels the pilot's curves are read at")
    p.add_argument("--resolve", type=float, default=round(SQRT2, 2),
                   help="the largest ratio of steps the chosen target may leave unresolved (default sqrt(2): half a "
                        "doubling's gain under perfect scaling, on the log scale)")
    p.add_argument("--max-epochs", type=int, default=64, help="a run that has not reached the target stops here")
    p.add_argument("--evals-per-epoch", type=int, default=2)
    p.add_argument("--cap-factor", type=float, default=4.0,
                   help="a sweep run stops after this many times its cell's fewest steps to the target")
    p.add_argument("--probes-per-epoch", type=int, default=8, help="noise-scale probes (two half-batch backwards)")
    p.add_argument("--noise-beta", type=float, default=0.9, help="EMA decay per probe of the noise scale's terms")
    p.add_argument("--warmup-epochs", type=float, default=1.0)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4, 5, 6, 7])
    p.add_argument("--sweep-seeds", type=int, default=2)
    p.add_argument("--sgd-lr", type=float, default=0.1, help="centre of the base batch's SGD grid")
    p.add_argument("--lars-lr", type=float, default=8.0, help="centre of LARS's grid at every batch")
    p.add_argument("--max-grow", type=int, default=6, help="how many times a sweep may grow an edge")
    fixed.add_data_model_args(p)
    p.add_argument("--out", type=Path, default=None,
                   help="rows/report/plot path without suffix (default benchmarks/results/steps_to_target)")
    args = p.parse_args(argv)
    quick = {"train_per_class": 32, "val_per_class": 16, "test_per_class": 8, "batches": [16, 32, 64], "bn_group": 8,
             "warmup_epochs": 0.5, "max_epochs": 6, "target": 30.0, "seeds": [0, 1, 2], "max_grow": 1,
             "probes_per_epoch": 4}
    for name, value in quick.items():  # --quick shrinks what the command line leaves at its default
        if args.quick and getattr(args, name) == p.get_default(name):
            setattr(args, name, value)
    if args.out is None:
        args.out = (Path(tempfile.gettempdir()) / "steps_to_target_quick" if args.quick
                    else Path(__file__).parent / "results" / "steps_to_target")
    if args.quick and args.pilot == p.get_default("pilot"):  # the study's pilot is not the smoke test's
        args.pilot = args.out.parent / (args.out.name + "_pilot.jsonl")
    args.base_batch = min(args.batches)
    if not 1 <= args.sweep_seeds <= len(args.seeds):
        p.error("--sweep-seeds must be between 1 and the number of --seeds")
    n = args.classes * args.train_per_class
    bad = [b for b in args.batches if n % b or b % args.bn_group or b & (b - 1)]
    if bad:
        p.error(f"batches {bad}: each must be a power of two dividing the {n} training images and a multiple of "
                f"--bn-group {args.bn_group}")
    args.setup = {k: getattr(args, k) for k in SETUP}
    args.setup["base_batch"] = args.base_batch
    fixed.refuse_other_setup(p, args.out.with_suffix(".jsonl"), args.setup)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    if args.worker:
        return worker(args)
    if args.plan:
        print("\n".join(target_section(args)) + estimate(args), flush=True)
        return 0
    if not args.render:
        code = fixed.run_workers(__file__, argv, args.workers)
        if code:
            return code
    print(render(args), flush=True)
    return 0


def render(args: argparse.Namespace) -> str:
    """The report (``.md``) and plot (``.png``) beside the rows, from them; the report's text."""
    rows = read_rows(args.out.with_suffix(".jsonl"))
    report = write_report(args, rows)
    args.out.with_suffix(".md").write_text(report + "\n", encoding="utf-8")
    plot(args, rows)
    return report


if __name__ == "__main__":
    sys.exit(main())
