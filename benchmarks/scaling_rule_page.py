"""The study's page, ``docs/scaling-rule.md``, rendered from the rows: every number on it is computed
here from ``results/scaling_rule.jsonl`` (and the first setup's and the steps-to-target study's rows
files) by the functions the reports use, and put into the prose of ``scaling_rule_page.md``.

The prose stays editable in that template: Markdown with named ``{placeholders}`` (``str.format_map``),
and no number typed into it (``LITERALS`` lists the tokens with digits it may carry: citations,
formulas, example commands; ``tests/test_scaling_rule_page.py`` holds it). A table or a sentence
whose wording follows a verdict is generated from the verdict. Where the prose around it was
written for the verdicts the rows gave (``PROSE_PREMISES``: "worse", "loss < x", "the same lr", a
range that holds a value), the page renders with a warning naming each premise the rows no longer
give, so a re-render with new rows cannot leave a false sentence unmarked.

``benchmarks/scaling_rule.py --render`` (its default ``--out``, the committed study) writes the page
beside the report. The page is committed with the rows it was rendered from: whenever rows are
committed, the page is re-rendered and committed with them (the test renders the page from the
rows files in the checkout and requires the committed page to be that render).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the study's script, a sibling
import scaling_rule_study as study  # noqa: E402
import steps_to_target as stt  # noqa: E402

TEMPLATE = Path(__file__).resolve().with_name("scaling_rule_page.md")
PAGE = Path(__file__).resolve().parents[1] / "docs" / "scaling-rule.md"
# the first setup studied: its report's command (``scaling_rule.py``'s docstring)
FIRST_SETUP = ["--width", "16", "--epochs", "24", "--doublings", "2", "--batches", "32", "128", "512"]
IMAGENET_TRAIN = 1_281_167  # ImageNet-1k's training images: a batch's ImageNet size at the same share
GOYAL_LARGEST = 8192  # Goyal et al.'s largest batch
# the references' LARS lr per batch (tensorflow/tpu lars_util.py at b13e6b6), batch in K -> lr
REFERENCE_LARS_LRS = {16: 25.0, 32: 34.0, 64: 35.0}
# Tokens with digits the template may carry as text: citations, formulas, example commands, and the
# statistical conventions the module fixes (95% intervals, 80% power, alpha 0.05 over the family).
LITERALS = ("arXiv 1811.03600", "arXiv 1812.06162", "arXiv 1907.04164", "et al. 2018", "et al. 2019", "§2.3", "`b13e6b6`", "25 / 34 / 35 at 16K / 32K / 64K",
            "256 -> 8K", "Goyal et al.'s 8K", "ResNet-50", "fp32", "3-layer", "2-core", "top-1",
            "exclude 0", "excludes 0", "from 0**", "of 0 within", "(1 + B_crit / B)", "sqrt(2)",
            "--epochs 12", "scaling_rule_width32", "95%", "80% power", "0.05", "claim 1", "claim 2", "claim 3")
RECIPE_NAMES = {"sgd": "SGD", "sgd+warmup": "SGD+warmup", "lars": "LARS"}
SLUG = {"sgd": "sgd", "sgd+warmup": "warm", "lars": "lars"}
# Premises of the prose (beyond the generated words): comparison id -> the verdict the sentences
# around it were written for; "same" where the two arms are one point.
PROSE_PREMISES = {
    "sgd_tuned_k2": "no loss", "sgd_none_k2": "no loss", "warm_linear_k2": "no loss", "lars_tuned_k2": "inconclusive",
    "sgd_none_k4": "worse", "warm_linear_k4": "no loss", "warm_tuned_k4": "no loss", "lars_tuned_k4": "no loss",
    "sgd_tuned_k8": "worse", "sgd_none_k8": "inconclusive", "sgd_linear_k8": "inconclusive",
    "warm_linear_k8": "no loss", "lars_tuned_k8": "no loss", "sgd_none_k16": "worse",
    "warm_linear_k16": "inconclusive", "warm_tuned_k16": "worse", "lars_tuned_k16": "worse",
    "lin_tuned_k2": "same", "lin_tuned_k4": "no loss", "lin_tuned_k8": "same", "lin_tuned_k16": "inconclusive",
    "warmup_gain_k2": "no loss", "warmup_gain_k4": "inconclusive", "warmup_gain_k8": "inconclusive",
    "warmup_gain_k16": "inconclusive", "lars_warm_top": "no loss",
}


def f2(x: float) -> str:
    return f"{x:.2f}"


def signed(v: dict[str, Any]) -> str:
    return f"{v['diff']:+.2f} [{v['lo']:+.2f}, {v['hi']:+.2f}]"


def comparison_id(arms: tuple[tuple[str, int, str], tuple[str, int, str]], base: int) -> str:
    """A comparison's placeholder name: ``<recipe>_<choice>_k<k>`` against the base batch, ``lin_tuned_k<k>``,
    ``warmup_gain_k<k>`` (with warmup against without, at the linear lr), ``lars_warm_top``."""
    (ra, ba, ca), (rb, bb, cb) = arms
    k = ba // base
    if (rb, bb) == ("sgd", base):
        return f"{SLUG[ra]}_{ca}_k{k}"
    if ra == rb == "sgd+warmup":
        return f"lin_tuned_k{k}"
    if ra == "lars":
        return "lars_warm_top"
    return f"warmup_gain_k{k}"


def judged(rows: dict, args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """Every comparison by id: its arms' top-1s and, where both arms have seeds, its verdict at the
    family's corrected level ("same": one point; "pending")."""
    family = study.comparisons(rows, args)
    alpha = 0.05 / len(family)
    out = {}
    for c in family:
        c = dict(c)
        if c["same"]:
            c["verdict"] = {"verdict": "same"}
        elif len(c["a"]) < 2 or len(c["b"]) < 2:
            c["verdict"] = {"verdict": "pending"}
        else:
            c["verdict"] = study.verdict(c["a"], c["b"], args.margin, alpha)
        out[comparison_id(c["arms"], args.base_batch)] = c
    return out


def verdict_words(v: dict[str, Any]) -> str:
    """A verdict as the page's table and prose say it: "loss < x" (TOST's bound), "worse", ..."""
    word = v["verdict"]
    return f"loss < {max(0.0, -v['tost_lo']):.2f}" if word == "no loss" else word


def comparison_values(cs: dict[str, dict[str, Any]]) -> dict[str, str]:
    out = {}
    for cid, c in cs.items():
        v = c["verdict"]
        out[f"{cid}_verdict"] = verdict_words(v)
        if "diff" in v:
            out[cid] = signed(v)
            out[f"{cid}_tost"] = f"[{v['tost_lo']:+.2f}, {v['tost_hi']:+.2f}]"
            out[f"{cid}_under"] = f2(max(0.0, -v["tost_lo"]))
            out[f"{cid}_within"] = f2(max(abs(v["tost_lo"]), abs(v["tost_hi"])))
    return out


def arm_values(rows: dict, args: argparse.Namespace) -> dict[str, str]:
    """Per large-batch point (recipe, lr choice, k): mean test top-1, interval, lr, seeds' range."""
    out = {}
    for b in args.batches:
        k = b // args.base_batch
        for recipe, choices in study.CHOICES.items():
            for choice in choices:
                cr = study.cell_recipe(recipe, b, args.base_batch)
                lr = study.lr_of(rows, cr, b, choice, args)
                v = [r["test"] for r in study.points(rows, cr, b, lr, args)]
                name = f"{SLUG[recipe]}_{choice}_k{k}"
                if lr is not None:
                    out[f"lr_{name}"] = f"{lr:g}"
                if len(v) > 1:
                    m, lo, hi = study.mean_ci(v)
                    out[f"m_{name}"], out[f"ci_{name}"] = f"{m:.1f}", f"{m:.1f} [{lo:.1f}, {hi:.1f}]"
                    out[f"seeds_{name}"] = f"{min(v):.1f} to {max(v):.1f}"
    return out


def under_range(cs: dict[str, dict[str, Any]], ids: list[str]) -> str:
    bounds = [max(0.0, -cs[i]["verdict"]["tost_lo"]) for i in ids if cs[i]["verdict"]["verdict"] == "no loss"]
    return f"{min(bounds):.2f}-{max(bounds):.2f}" if bounds else "pending"


def results_table(rows: dict, args: argparse.Namespace, cs: dict[str, dict[str, Any]]) -> str:
    """Test top-1 per batch and recipe/lr choice, the difference against the base batch and its verdict."""
    base, n_train = args.base_batch, args.classes * args.train_per_class
    cols = [("sgd", "tuned"), ("sgd", "none"), ("sgd", "linear"), ("sgd+warmup", "linear"), ("sgd+warmup", "tuned"),
            ("lars", "tuned")]
    L = ["| batch (k) | steps | SGD, tuned lr | SGD, base lr (none) | SGD, linear lr | SGD+warmup, linear lr | "
         "SGD+warmup, tuned lr | LARS, tuned lr |", "|---:|---:|---|---|---|---|---|---|"]
    for b in args.batches:
        k = b // base
        cells = []
        for recipe, choice in cols:
            cr = study.cell_recipe(recipe, b, base)
            lr = study.lr_of(rows, cr, b, choice, args)
            if b == base:
                cells.append(base_cell(rows, args, cr, lr) if choice == "tuned" and cr == recipe
                             else "= tuned" if recipe == "sgd" else "= SGD")
                continue
            same = [c for c in cols[: cols.index((recipe, choice))] if c[0] == recipe and lr is not None
                    and study.lr_of(rows, cr, b, c[1], args) == lr]
            if same:
                cells.append(f"= {same[0][1]}")
                continue
            c = cs[f"{SLUG[recipe]}_{choice}_k{k}"]
            v = c["verdict"]
            if "diff" not in v:
                cells.append("pending")
                continue
            head = f"{statistics.mean(c['a']):.1f}" + ("" if choice == "none" else f", lr {lr:g}")
            diff = signed(v)
            word = verdict_words(v)
            cells.append(f"{head}: **{diff} worse**" if word == "worse" else
                         f"{head}: {diff}" + ("" if word == "inconclusive" else f" **{word}**"))
        L.append(f"| {b} ({k}) | {n_train // b * args.epochs:,} | " + " | ".join(cells) + " |")
    return "\n".join(L)


def base_cell(rows: dict, args: argparse.Namespace, recipe: str, lr: float | None) -> str:
    v = [r["test"] for r in study.points(rows, recipe, args.base_batch, lr, args)]
    if len(v) < 2:
        return "pending"
    m, lo, hi = study.mean_ci(v)
    return f"{m:.1f} [{lo:.1f}, {hi:.1f}], lr {lr:g}"


def lr_table(args: argparse.Namespace, fits: dict[str, dict[str, Any]]) -> str:
    L = ["| recipe | " + " | ".join(str(b) for b in args.batches)
         + " | a of the chosen lrs | a of the lrs the rows cannot tell apart |",
         "|---|" + "---:|" * len(args.batches) + "---:|---|"]
    for recipe, f in fits.items():
        rng = f["range"]
        L.append(f"| {RECIPE_NAMES[recipe]} | " + " | ".join(f"{lr:g}" if lr else "pending" for lr in f["lrs"])
                 + f" | {'pending' if f['a'] is None else f2(f['a'])} | "
                 + (f"{rng[0]:.2f} to {rng[1]:.2f}" if rng else "pending") + " |")
    return "\n".join(L)


def sweep_gaps(rows: dict, args: argparse.Namespace) -> list[float]:
    """Per cell whose sweep is done: how much the chosen lr's val mean beats the next lr's."""
    gaps = []
    for recipe, batch in study.cells(args):
        grid = study.grid_of(rows, recipe, batch, args)
        means = study.sweep_means(rows, recipe, batch, grid, args) if grid else None
        if means and len(means) > 1:
            top = sorted(means.values(), reverse=True)
            gaps.append(top[0] - top[1])
    return gaps


def imagenet(batch: int, n_train: int) -> str:
    return f"{batch / n_train * IMAGENET_TRAIN / 1000:.0f}K"


def tied_a_clause(fits: dict[str, dict[str, Any]], slow: float = 0.25) -> str:
    """The exponents the lrs the rows cannot tell apart fit, per recipe, and which of them also
    hold a much slower growth (a = ``slow``): the words after "fit"."""
    named = {RECIPE_NAMES[r]: f["range"] for r, f in fits.items() if f["range"]}
    if not named:
        return "a = pending"
    spans = and_list([f"{lo:.2f} to {hi:.2f} ({name})" for name, (lo, hi) in named.items()])
    also = [name for name, (lo, hi) in named.items() if lo <= slow <= hi]
    if not also:
        slower = f"no range holds a = {slow:g}"
    elif len(also) == len(named):
        slower = f"every range holds a = {slow:g} too"
    else:
        slower = (f"the range of {also[0]} also holds a = {slow:g}" if len(also) == 1 else
                  f"the ranges of {and_list(also)} also hold a = {slow:g}")
    return f"a = {spans}: linear growth (a = 1) is not excluded for any, and {slower}"


def and_list(xs: list[Any]) -> str:
    xs = [str(x) for x in xs]
    return xs[0] if len(xs) == 1 else ", ".join(xs[:-1]) + " and " + xs[-1]


def setup_values(rows: dict, args: argparse.Namespace) -> dict[str, str]:
    base, n_train = args.base_batch, args.classes * args.train_per_class
    ks = [b // base for b in args.batches]
    steps = [n_train // b * args.epochs for b in args.batches]
    out = {"classes": str(args.classes), "n_train": f"{n_train:,}", "n_val": f"{args.classes * args.val_per_class:,}",
           "n_test": f"{args.classes * args.test_per_class:,}", "side": str(args.side), "crop": str(args.crop),
           "width": str(args.width), "epochs": str(args.epochs), "batches": and_list(args.batches),
           "base": str(base), "top": str(max(args.batches)), "k_top": str(ks[-1]), "k_range": f"{ks[0]} to {ks[-1]}",
           "steps_range": f"{steps[0]:,} to {steps[-1]:,}", "steps_span": f"{steps[-1]:,}-{steps[0]:,}",
           "warmup_epochs": f"{args.warmup_epochs:g}", "weight_decay": f"{study.WEIGHT_DECAY:.0e}".replace("e-0", "e-"),
           "momentum": f"{study.MOMENTUM:g}", "poly_power": f"{study.POLY_POWER:g}", "trust": f"{study.LARS_TRUST:g}",
           "bn_group": str(args.bn_group), "sweep_seeds": str(args.sweep_seeds), "n_seeds": str(len(args.seeds)),
           "margin": f"{args.margin:g}", "workers": str(args.workers),
           "top_share": f"{100 * max(args.batches) / n_train:.0f}%", "past_goyal": "",
           "imnet_top": imagenet(max(args.batches), n_train), "imnet_base": imagenet(base, n_train)}
    for i, (b, k) in enumerate(zip(args.batches, ks)):
        out[f"k{i}"], out[f"imnet_k{i}"] = str(k), imagenet(b, n_train)
    out["past_goyal"] = f"{max(args.batches) / n_train * IMAGENET_TRAIN / GOYAL_LARGEST:.0f}x"
    trained = list(rows.values())
    todo, _ = study.plan(rows, args)
    out["trainings"] = str(len(trained))
    out["pending_note"] = f" and {len(todo)} pending" if todo else ""
    out["core_minutes"] = f"{sum(r['seconds'] for r in trained) / 60:.0f}"
    return out


def gain_against_deficits(gain: float, cs: dict[str, dict[str, Any]], k: int) -> str:
    """The base batch's gain from longer training against the mean losses of the k-fold batch's
    points (every recipe and lr choice against the base batch): as large as them, or smaller or
    larger than all of them, with their range."""
    against_base = [c["verdict"] for cid, c in cs.items()
                    if cid.endswith(f"_k{k}") and not cid.startswith(("lin_", "warmup_gain_"))]
    losses = sorted(-v["diff"] for v in against_base if "diff" in v and v["diff"] < 0)
    if not losses:
        return f"the {k}x deficits below are pending"
    span = f"the {k}x deficits below ({losses[0]:.2f} to {losses[-1]:.2f})"
    if gain < losses[0]:
        return f"smaller than {span}, though {gain / losses[0]:.0%} of the smallest"
    if gain > losses[-1]:
        return f"larger than {span}"
    return f"as large as {span}"


def losses_against_margin(cs: dict[str, dict[str, Any]], ids: list[str], margin: float) -> str:
    """Where the mean losses of ``ids`` and their corrected intervals lie against the TOST margin."""
    means = [-cs[i]["verdict"]["diff"] for i in ids]
    reach = [-cs[i]["verdict"]["lo"] for i in ids]
    text = (f"the mean losses ({and_list([f2(x) for x in means])}) are "
            + ("under" if max(means) < margin else "not all under") + f" the {margin:g}-point margin")
    past = max(reach) > margin
    text += (f", {'but' if past else 'and'} their corrected intervals reach {and_list([f2(x) for x in reach])}, "
             + ("past it, so TOST cannot put them within it" if past else "inside it"))
    return text


def convergence_values(rows: dict, args: argparse.Namespace,
                       cs: dict[str, dict[str, Any]]) -> tuple[dict[str, str], dict[str, bool]]:
    checks = study.base_convergence(rows, args)
    epochs, check = checks[0]
    if check is None:
        return {"conv_epochs": str(epochs)}, {}
    (tb, ta, tv), vv = check["test"], check["val"][2]
    k_top = args.batches[-1] // args.base_batch
    out = {"conv_epochs": str(epochs), "conv_test": signed(tv), "conv_test_tost": f"[{tv['tost_lo']:+.2f}, "
           f"{tv['tost_hi']:+.2f}]", "conv_from": f"{statistics.mean(tb):.1f}", "conv_to": f"{statistics.mean(ta):.1f}",
           "conv_val": signed(vv), "conv_against_deficits": gain_against_deficits(tv["diff"], cs, k_top),
           "conv_verdict": "not converged" if vv["verdict"] == "better" else study.converged_word(vv, args.margin)}
    premises = {"the base batch's test gain is within the margin by TOST and significant":
                tv["verdict"] == "no loss" and tv["lo"] > 0,
                "on val TOST cannot put the base batch's gain within the margin": vv["verdict"] == "better"
                and vv["lo"] <= args.margin}
    return out, premises


def first_setup_values() -> tuple[dict[str, str], dict[str, bool], list[float | None]]:
    """The first setup's numbers, from its rows file."""
    out_path = Path(__file__).resolve().parent / "results" / "scaling_rule_width16_24ep"
    args = study.parse(["--render", *FIRST_SETUP, "--out", str(out_path)])
    rows = study.read_rows(out_path.with_suffix(".jsonl"))
    gains = [signed(c["test"][2]).split(" ")[0] for _, c in study.base_convergence(rows, args) if c]
    lrs = [study.chosen_lr(rows, "sgd", b, args) for b in args.batches]
    family = study.comparisons(rows, args)
    shown = sum(len(c["a"]) > 1 and len(c["b"]) > 1 and not c["same"]
                and study.verdict(c["a"], c["b"], args.margin, 0.05 / len(family))["verdict"] == "no loss"
                for c in family)
    out = {"first_width": str(args.width), "first_epochs": str(args.epochs), "first_report": out_path.name + ".md",
           "first_gain_2x": gains[0], "first_gain_4x": gains[1], "first_2x": str(2 * args.epochs),
           "first_4x": str(4 * args.epochs), "first_lrs": ", ".join(f"{lr:g}" for lr in lrs if lr),
           "first_tost": "no point was" if not shown else f"{shown} point{'s were' if shown > 1 else ' was'}"}
    seconds = [r["seconds"] for r in rows.values() if r["epochs"] == args.epochs]
    out["first_seconds"] = str(statistics.mean(seconds)) if seconds else "nan"
    return out, {"the first setup's gains are positive": all(g.startswith("+") for g in gains)}, lrs


def resolution_values(rows: dict, args: argparse.Namespace) -> dict[str, str]:
    res = study.resolution(rows, args, study.comparisons(rows, args))
    if res is None:
        return {}
    s_val, df_val = study.pooled_sd(study.seed_groups(rows, args, "val"))
    gaps = sweep_gaps(rows, args)
    out = {"m": str(res["m"]), "sd_test": f2(res["sd_test"]), "spread_points": str(res["points"]),
           "df": str(res["df"]), "mde": f2(res["mde"]), "base_err": f"{res['base_err']:.2f}%",
           "margin_share": f"{res['margin_share']:.0f}%", "tost_power": f"{100 * res['tost_power']:.0f}%",
           "gap_range": f"{min(gaps):.2f}-{max(gaps):.2f}" if gaps else "pending",
           "id_se": f2(se := s_val * math.sqrt(2 / args.sweep_seeds)),
           "id_half": f2(study.stats_t(0.975, df_val) * se) if df_val else "pending"}
    if res["welch_df"]:
        out.update(welch_lo=f"{res['welch_df'][0]:.1f}", welch_hi=f"{res['welch_df'][1]:.1f}",
                   mde_lo=f2(res["mde_welch"][0]), mde_hi=f2(res["mde_welch"][1]))
    return out


def lr_values(rows: dict, args: argparse.Namespace) -> tuple[dict[str, str], dict[str, bool]]:
    """The lr table, whether any cell's best lr is identified, and LARS's exponent against its references'."""
    s_val, df_val = study.pooled_sd(study.seed_groups(rows, args, "val"))
    tied = study.identified(rows, args, s_val, df_val)
    fits = study.exponent_fits(rows, args, tied)
    found = [cell for cell, t in tied.items() if t == [study.chosen_lr(rows, *cell, args)]]
    ref_ks = sorted(REFERENCE_LARS_LRS)
    ref_a = float(np.polyfit([math.log2(k) for k in ref_ks], [math.log2(REFERENCE_LARS_LRS[k]) for k in ref_ks], 1)[0])
    lars = fits["lars"]
    out = {"lr_table": lr_table(args, fits),
           "identified": "the best lr is not identified at any batch" if not found else
           f"the best lr is identified at {len(found)} of the {len(tied)} cells",
           "ref_a": f2(ref_a), "ref_span": f"{ref_ks[-1] // ref_ks[0]}x",
           "lars_lrs": " / ".join(f"{lr:g}" for lr in lars["lrs"] if lr),
           "lars_a": f2(lars["a"]) if lars["a"] is not None else "pending",
           "lars_range": f"{lars['range'][0]:.2f} to {lars['range'][1]:.2f}" if lars["range"] else "pending"}
    ranges = [f["range"] for f in fits.values()]
    out["tied_a_clause"] = tied_a_clause(fits)
    premises = {"no cell's best lr is identified": not found and bool(tied),
                "every recipe's tied lrs fit a = 1": all(r and r[0] <= 1 <= r[1] for r in ranges),
                "LARS's tied lrs fit its references' exponent": bool(lars["range"]) and
                lars["range"][0] <= ref_a <= lars["range"][1]}
    return out, premises


def target_values(rows: dict, args: argparse.Namespace) -> dict[str, str]:
    """The fixed-budget study's steps to target at the largest batch (LARS and SGD+warmup, tuned)."""
    eta = study.chosen_lr(rows, "sgd", args.base_batch, args)
    ref = study.points(rows, "sgd", args.base_batch, eta, args)
    if not ref:
        return {}
    target = statistics.mean(r["test"] for r in ref) - args.margin
    top = max(args.batches)
    out = {"target": f"{target:.1f}%", "top_steps_per_epoch": str(args.classes * args.train_per_class // top)}
    for recipe in ("lars", "sgd+warmup"):
        pts = study.points(rows, recipe, top, study.chosen_lr(rows, recipe, top, args), args)
        st = study.steps_reached(pts, target)
        out[f"reach_{SLUG[recipe]}"] = f"{len(st)} of {len(pts)}"
        out[f"reach_{SLUG[recipe]}_n"] = str(len(st))
        out[f"reach_{SLUG[recipe]}_steps"] = f"{statistics.mean(st):.0f}" if st else "never"
    return out


def cost_ratio(rows: dict, args: argparse.Namespace, first: dict[str, str]) -> dict[str, str]:
    seconds = [r["seconds"] for r in rows.values() if r["epochs"] == args.epochs]
    return {"cost_ratio": f"{statistics.mean(seconds) / float(first['first_seconds']):.1f}x" if seconds else "pending",
            "width_ratio": f"{args.width / int(first['first_width']):g}x",
            "epoch_ratio": f"{args.epochs / int(first['first_epochs']):g}x"}


# McCandlish et al. 2018's abstract: ImageNet's limit of useful batches, "tens of thousands"
IMAGENET_USEFUL = (10_000, 100_000)


def bend_on_imagenet(fit: dict[str, Any] | None, args: argparse.Namespace, recipe: str = "sgd+warmup"
                     ) -> tuple[str, dict[str, bool]]:
    """The fixed-epoch study's ImageNet mapping checked against the bend the steps-to-target study
    measures: ``recipe``'s fit (``steps_to_target.fit_recipe``; None while pending), its B_crit and
    interval at ImageNet's scale by the same share of the training set, against the limit McCandlish
    et al. report for ImageNet (``IMAGENET_USEFUL``); and the premise of the words around it (the
    mapped B_crit in that range), absent while pending."""
    if fit is None:
        return ("The steps-to-target study below fits where that bend lies on this setup (pending), which "
                "tests this mapping against McCandlish et al.'s view of ImageNet."), {}
    n_train = args.classes * args.train_per_class
    lo, hi = fit["b"]
    band = [x / IMAGENET_TRAIN * n_train for x in IMAGENET_USEFUL]  # this setup's batches that map into it
    inside = band[0] <= fit["b_crit"] < band[1]
    b_lo, b_hi = min(args.batches), max(args.batches)
    covered = math.log(min(band[1], b_hi) / max(band[0], b_lo)) / math.log(b_hi / b_lo) if band[1] > b_lo else 0.0
    text = (f"The steps-to-target study below fits this setup's bend: {RECIPE_NAMES[recipe]}'s critical batch, "
            f"{fit['b_crit']:.0f} [{lo:.0f}, {hi:.0f}], is ImageNet's {imagenet(round(fit['b_crit']), n_train)} "
            f"[{imagenet(round(lo), n_train)}, {imagenet(round(hi), n_train)}] at the same share, "
            + ("inside" if inside else "outside") + " the \"batches of tens of thousands\" where McCandlish et al. "
            "place the limits of data parallelism on ImageNet.\n\nThat says nothing about the mapping, which stays an "
            f"assumption this comparison cannot test: any B_crit from {band[0]:.0f} to {band[1]:.0f} here maps into tens of "
            f"thousands, {100 * covered:.0f}% of the batches {b_lo}-{b_hi} on a log scale; their phrase describes the "
            "batches earlier ImageNet work reached, not a measured critical batch; in their model the noise scale "
            "does not depend on the training set's size, so nothing in it carries a critical batch across data sets "
            f"by share; and the target here ({args.target:g}% val top-1) comes early in training, where they find the "
            "noise scale smaller than later.")
    return text, {"the tens-of-thousands band holds most of the bends the batches can show, so the comparison cannot "
                  "test the mapping": covered >= 0.5}


def lars_against_sgd(rows: dict, args: argparse.Namespace) -> tuple[str, dict[str, bool]]:
    """LARS's steps over SGD+warmup's per batch (ratio of geometric means, 95% Welch interval on log
    steps): where its larger B_crit comes from, in words the rows give, and the premises of the
    prose around them (LARS slower at the smallest batch, not shown faster at the upper half's)."""

    ratios = {}
    for b in args.batches:
        a = [math.log(r["steps"]) for r in stt.chosen_rows(rows, "lars", b, args) if r["reached"]]
        c = [math.log(r["steps"]) for r in stt.chosen_rows(rows, "sgd+warmup", b, args) if r["reached"]]
        if len(a) > 1 and len(c) > 1:
            v = study.verdict(a, c, margin=0.0, alpha=0.05)
            ratios[b] = (math.exp(v["diff"]), math.exp(v["lo"]), math.exp(v["hi"]))
    if len(ratios) < len(args.batches):
        return "LARS's steps against SGD+warmup's per batch: pending.", {}
    small, upper = args.batches[0], args.batches[len(args.batches) // 2:]
    slower = ratios[small][1] > 1
    no_faster = all(ratios[b][2] > 1 for b in upper)

    def fmt(b: int) -> str:
        return f"{ratios[b][0]:.2f} [{ratios[b][1]:.2f}, {ratios[b][2]:.2f}]"

    text = (f"LARS took {fmt(small)} x SGD+warmup's steps at batch {small} and {fmt(args.batches[-1])} at "
            f"{args.batches[-1]} (ratios of geometric means, 95% Welch intervals on log steps; "
            + ", ".join(f"{b}: {ratios[b][0]:.2f}" for b in args.batches[1:-1]) + "). ")
    if slower and no_faster:
        text += (f"So LARS's bend is further out because it is slower at small batches, and it is not shown faster "
                 f"than SGD+warmup at {upper[0]}-{upper[-1]} (each interval reaches above 1): not the way Zhang "
                 "et al. find preconditioning moves the bend.")
    else:
        text += ("LARS " + ("is" if slower else "is not shown to be") + f" slower at {small} and "
                 + ("not shown faster" if no_faster else "faster at some batch") + f" at {upper[0]}-{upper[-1]}.")
    return text, {"LARS is slower than SGD+warmup at the smallest batch": slower,
                  "LARS is not shown faster than SGD+warmup at the upper half's batches": no_faster}


def steps_to_target_values() -> tuple[dict[str, str], dict[str, bool]]:
    """The steps-to-target study: its design's numbers, the target's choice (the pilot's table), the
    plan's resolution and cost, its results (pending until rows exist), and its bend on ImageNet's
    scale (``bend_on_imagenet``) with that sentence's premise."""

    args = stt.parse(["--render"])
    rows = stt.read_rows(args.out.with_suffix(".jsonl"))
    e = stt.cost_estimate(args)
    todo, blocked = stt.plan(rows, args)
    base = args.base_batch
    out = {"stt_batches": f"{base}-{max(args.batches)}", "stt_kmax": f"{max(args.batches) // base}",
           "stt_recipes": and_list([RECIPE_NAMES[r] for r in args.recipes]), "stt_seeds": str(len(args.seeds)),
           "stt_sweep_seeds": str(args.sweep_seeds), "stt_warmup": f"{args.warmup_epochs:g}",
           "stt_evals": str(args.evals_per_epoch), "stt_max_epochs": str(args.max_epochs),
           "stt_probes": probes_words(args, stt), "stt_target": f"{args.target:g}%",
           "stt_m": str(stt.comparisons(args)), "stt_resolve": f"{args.resolve:.2f}x",
           "stt_target_table": "\n".join(stt.target_section(args)).strip(),
           "stt_done": str(len(rows)), "stt_spent": stt.spent(rows) if rows else "nothing yet"}
    if e:
        out.update(stt_sd=f"{e['sd']:.3f}", stt_ratio=f"{e['ratio']:.2f}x", stt_cells=str(e["cells"]),
                   stt_per_cell=str(e["per_cell"]), stt_runs=str(e["runs"]), stt_hours=f"{e['minutes'] / 60:.1f}",
                   stt_epochs=f"{e['epochs']:.1f}", stt_epoch_s=f"{e['epoch_s']:.1f}", stt_guess=f"{e['guess']:.0f}",
                   stt_max_cell_epochs=f"{e['max_cell_epochs']:.0f}")
    results = []
    if todo or blocked:
        results.append(f"**Pending: {len(rows)} of ~{e['runs'] if e else '?'} trainings done** (the estimate's "
                       f"count; grown grids add more).")
    fits = stt.fit_recipes(args, rows)
    if rows:
        results += [""] + stt.results_section(args, rows, heading="###", fits=fits)
    out["stt_results"] = "\n".join(results).strip()
    sd, df = stt.seed_spread(rows, args)
    out["stt_own_spread"] = (f"The study's own rows spread {sd:.3f} in log steps (pooled over its cells, {df} degrees "
                             f"of freedom), which {len(args.seeds)} seeds per batch resolve to "
                             f"{stt.resolvable_ratio(sd, len(args.seeds), 0.05 / stt.comparisons(args)):.2f}x."
                             if df else "The study's own spread: pending.")
    out["stt_imagenet"], premises = bend_on_imagenet(fits.get("sgd+warmup"), args)
    out["stt_lars_sgd"], lars_premises = lars_against_sgd(rows, args)
    return out, premises | lars_premises


def probes_words(args: argparse.Namespace, stt: Any) -> str:
    """Probes an epoch: a probe every round(steps an epoch / --probes-per-epoch) steps, so batches whose
    epoch is short take more than asked."""
    n_train = args.classes * args.train_per_class
    got = {b: (n_train // b) / stt.eval_every(n_train // b, args.probes_per_epoch)
           for b in args.batches if stt.probed(b, args.bn_group)}
    other = {b: p for b, p in got.items() if p != args.probes_per_epoch}
    words = f"{args.probes_per_epoch} probes an epoch"
    if other:
        words += ", " + "; ".join(f"{p:g} at batch{'es' if len(bs) > 1 else ''} {and_list(bs)}" for p, bs in
                                  {p: [b for b in other if other[b] == p] for p in other.values()}.items())
    return words


def values(args: argparse.Namespace, rows: dict) -> tuple[dict[str, str], list[str]]:
    """Every placeholder's text, and the premises of the prose the rows no longer give."""
    cs = judged(rows, args)
    first, first_premises, first_lrs = first_setup_values()
    conv, conv_premises = convergence_values(rows, args, cs)
    lrs, lr_premises = lr_values(rows, args)
    out = {**setup_values(rows, args), **comparison_values(cs), **arm_values(rows, args), **conv,
           **resolution_values(rows, args), **lrs, **target_values(rows, args), **first,
           **cost_ratio(rows, args, first)}
    stt_values, stt_premises = steps_to_target_values()
    out |= stt_values
    out["results_table"] = results_table(rows, args, cs)
    out["largest_check"] = "\n".join(study.largest_check_section(rows, args)).strip()
    out["warm_k4_k8_under"] = under_range(cs, ["warm_linear_k4", "warm_tuned_k4", "warm_linear_k8"])
    out["k2_under"] = under_range(cs, ["warm_linear_k2", "sgd_tuned_k2", "sgd_none_k2"])
    k_top = args.batches[-1] // args.base_batch
    out["top_losses_against_margin"] = losses_against_margin(
        cs, [f"warm_tuned_k{k_top}", f"lars_tuned_k{k_top}"], args.margin)
    lrs_here = {b: study.chosen_lr(rows, "sgd", b, args) for b in args.batches}
    first_batches = [int(b) for b in FIRST_SETUP[FIRST_SETUP.index("--batches") + 1:]]
    premises = {f"{cid}: {want}": cs[cid]["verdict"]["verdict"] == want for cid, want in PROSE_PREMISES.items()}
    premises |= conv_premises | lr_premises | first_premises | stt_premises
    premises["no point of the first setup was put within the margin"] = first["first_tost"] == "no point was"
    premises["the two setups' chosen SGD lrs differ"] = [lrs_here.get(b) for b in first_batches] != first_lrs
    return out, [name for name, held in premises.items() if not held]


def render(args: argparse.Namespace, rows: dict) -> str:
    """The page: the template filled from the rows, with a warning naming each premise of its prose
    that the rows no longer give."""
    text, broken = values(args, rows)
    page = TEMPLATE.read_text(encoding="utf-8").format_map(text)
    if broken:
        head, _, body = page.partition("\n# ")
        warning = ("!!! warning \"The rows no longer give what the prose below was written for\"\n"
                   + "".join(f"    - {name}\n" for name in broken)
                   + "\n    The numbers are the rows'; the sentences around these need rewriting "
                   "(`benchmarks/scaling_rule_page.md`).\n")
        page = head + "\n# " + body.replace("\n\n", "\n\n" + warning + "\n", 1)
    return page


def write_page(args: argparse.Namespace, rows: dict, path: Path | None = None) -> str:
    """Render the page and write it (``PAGE`` unless ``path``); with ``PAGE``, the steps-to-target
    study's report and plot too (the page shows the plot, ``img/steps_to_target.png``)."""
    page = render(args, rows)
    (path or PAGE).write_text(page, encoding="utf-8")
    if path is None:
        stt.render(stt.parse(["--render"]))
    return page


__all__ = ["render", "write_page", "values", "LITERALS", "TEMPLATE", "PAGE", "PROSE_PREMISES"]
