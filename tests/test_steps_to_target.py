"""benchmarks/steps_to_target.py (the scaling study's steps-to-target experiment): its probe takes
each half's own gradient without changing the step, its fit recovers S_min and B_crit from noisy
points, its lr grid grows where the best point sits on an edge, and a tiny study runs end to end,
resumes without retraining and writes its report and plot."""

from __future__ import annotations

import functools
import importlib.util
import json
import math
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import torch

pytest.importorskip("scipy", reason="the study's statistics use scipy (the [dev] and [report] extras)")

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "steps_to_target.py"


@pytest.fixture(scope="module")
def study() -> ModuleType:
    spec = importlib.util.spec_from_file_location("steps_to_target", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["steps_to_target"] = module
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    yield module
    sys.modules.pop("steps_to_target", None)


def _grads(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.grad.clone() for p in model.parameters()]


def test_a_probed_step_has_the_full_batch_gradient_and_each_half_its_own(study: ModuleType) -> None:
    torch.manual_seed(0)
    model = study.fixed.small_net(10, 8, 4)
    x, y = torch.randn(16, 3, 8, 8), torch.randint(0, 10, (16,))
    _, none = study.step_grads(model, x, y, probe=False)
    full = _grads(model)
    model.zero_grad(set_to_none=True)
    _, norms = study.step_grads(model, x, y, probe=True)
    assert none is None and norms is not None
    for a, b in zip(_grads(model), full):  # the step a probe leaves is the step without it
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    halves = []
    for part in (slice(0, 8), slice(8, 16)):  # whole BN groups: a half's gradient is its own batch's
        model.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x[part]), y[part]).backward()
        halves.append(_grads(model))
    small = sum(sum(g.square().sum() for g in h) for h in halves) / 2
    big = sum(((a + b) / 2).square().sum() for a, b in zip(*halves))
    torch.testing.assert_close(norms[0], small, rtol=1e-5, atol=0)
    torch.testing.assert_close(norms[1], big, rtol=1e-5, atol=0)


def test_only_batches_of_whole_bn_groups_per_half_are_probed(study: ModuleType) -> None:
    assert [b for b in (16, 32, 64, 96, 128) if study.probed(b, 32)] == [64, 128]


def test_the_fit_recovers_s_min_and_b_crit_and_its_interval_holds_them(study: ModuleType) -> None:
    rng = np.random.default_rng(1)
    s_min, b_crit = 400.0, 300.0
    by = {b: list(s_min * (1 + b_crit / b) * np.exp(rng.normal(0, 0.08, 5))) for b in (32, 64, 128, 256, 512, 1024, 2048)}
    got_s, got_b = study.fit_curve([b for b in by for _ in by[b]], [s for b in by for s in by[b]])
    assert abs(got_s / s_min - 1) < 0.1 and abs(got_b / b_crit - 1) < 0.2
    smins, bcrits = study.bootstrap_draws(by, draws=200)
    (s_lo, s_hi), (b_lo, b_hi) = study.percentile_interval(smins), study.percentile_interval(bcrits)
    assert s_lo < s_min < s_hi and b_lo < b_crit < b_hi
    # regions by the fitted model's gain per doubling
    assert study.region(32, 300) == "perfect scaling" and study.region(2048, 300) == "maximal data parallelism"
    assert study.region(256, 300) == "diminishing returns"
    assert study.doubling_gain(1e-6, 300) == pytest.approx(2.0) and study.doubling_gain(1e9, 300) == pytest.approx(1.0)


def _args(study: ModuleType, tmp_path: Path, *extra: str):
    return study.parse(["--quick", "--out", str(tmp_path / "s"), *extra])


def _row(batch: int, lr: float, seed: int, steps: int, reached: bool = True, recipe: str = "sgd+warmup") -> dict:
    return {"recipe": recipe, "batch": batch, "lr": lr, "seed": seed, "steps": steps, "reached": reached}


def test_the_lr_grid_grows_the_edge_its_best_point_sits_on_and_settles(study: ModuleType, tmp_path: Path) -> None:
    args = _args(study, tmp_path, "--max-grow", "4")
    base, c = args.base_batch, args.sgd_lr
    grid = study.grid_of({}, "sgd+warmup", base, args)
    assert grid == [study.on_grid(c, j) for j in (-1, 0, 1)]
    assert study.grid_of({}, "sgd+warmup", 2 * base, args) is None  # waits on the base's choice
    rows = {}
    for seed in args.seeds[: args.sweep_seeds]:  # fewer steps the larger the lr: the top edge grows
        for j, steps in zip((-1, 0, 1, 2, 3), (90, 70, 50, 40, 60)):
            r = _row(base, study.on_grid(c, j), seed, steps)
            rows[study.key(r)] = r
    assert study.grid_of(rows, "sgd+warmup", base, args) == [study.on_grid(c, j) for j in (-1, 0, 1, 2, 3)]
    assert study.chosen_lr(rows, "sgd+warmup", base, args) == study.on_grid(c, 2)
    # the next batch's grid is centred on k x the chosen lr (the linear rule), its cell now runnable
    assert study.grid_of(rows, "sgd+warmup", 2 * base, args)[1] == pytest.approx(2 * study.on_grid(c, 2), rel=1e-5)
    todo, _ = study.plan(rows, args)
    assert {(j["lr"], j["seed"]) for j in todo if (j["recipe"], j["batch"]) == ("sgd+warmup", base)} == \
        {(study.on_grid(c, 2), s) for s in args.seeds[args.sweep_seeds:]}


def test_a_grid_where_no_lr_reaches_the_target_grows_downward(study: ModuleType, tmp_path: Path) -> None:
    args = _args(study, tmp_path, "--max-grow", "2")
    base, c = args.base_batch, args.sgd_lr
    rows = {}
    for seed in args.seeds[: args.sweep_seeds]:
        for j in (-2, -1, 0, 1):
            r = _row(base, study.on_grid(c, j), seed, 999, reached=False)
            rows[study.key(r)] = r
    assert study.grid_of(rows, "sgd+warmup", base, args)[0] == study.on_grid(c, -3)
    assert study.chosen_lr(rows, "sgd+warmup", base, args) is None


def test_a_tiny_study_runs_resumes_and_reports(study: ModuleType, tmp_path: Path) -> None:
    argv = ["--quick", "--out", str(tmp_path / "s"), "--batches", "16", "32", "--seeds", "0", "1", "--sweep-seeds", "1",
            "--workers", "2"]
    assert study.main(argv) == 0
    rows = [json.loads(line) for line in (tmp_path / "s.jsonl").read_text().splitlines()]
    args = study.parse(argv)
    assert not study.plan(study.read_rows(tmp_path / "s.jsonl"), args)[0]  # nothing left to train
    assert {(r["recipe"], r["batch"]) for r in rows} == set(study.cells(args))
    probed = [r for r in rows if study.probed(r["batch"], args.bn_group) and r["reached"]]
    assert probed and all(r["b_simple_at_target"] is not None and r["noise_curve"] for r in probed)
    assert all(r["steps"] == r["val_curve"][-1][0] for r in rows if r["reached"])
    assert all(r["val_curve"][-1][1] >= args.target for r in rows if r["reached"])
    assert study.main(argv) == 0  # resumed: no point trained twice
    assert len((tmp_path / "s.jsonl").read_text().splitlines()) == len(rows)
    report = (tmp_path / "s.md").read_text()
    assert "Pending" not in report and "| sgd+warmup | 16 |" in report and "| lars | 32 |" in report, report
    assert (tmp_path / "s.png").stat().st_size > 0
    # a rows file of another setup is refused (argparse's one line, exit 2)
    with pytest.raises(SystemExit) as refused:
        study.main([*argv, "--target", "31"])
    assert refused.value.code == 2


def test_a_sweep_run_is_capped_at_a_multiple_of_its_cells_fewest_steps(study: ModuleType, tmp_path: Path) -> None:
    args = _args(study, tmp_path)
    base = args.base_batch
    job = {"recipe": "sgd+warmup", "batch": base, "lr": 0.05, "seed": args.seeds[0]}
    assert study.cap_of({}, job, args) is None  # no run of the cell has reached the target yet
    rows = {}
    for r in (_row(base, 0.1, 0, 30), _row(base, 0.2, 0, 20), _row(base, 0.4, 0, 5, reached=False),
              _row(2 * base, 0.2, 0, 3), _row(base, 0.1, 0, 2, recipe="lars")):
        rows[study.key(r)] = r
    assert study.cap_of(rows, job, args) == 4 * 20  # its own cell's reached runs only
    assert study.cap_of(rows, {**job, "seed": args.seeds[-1]}, args) is None  # the chosen lr's other seeds: uncapped
    data = study.fixed.load_data(args)
    row = study.train_one({**job, "lr": 1e-6, "cap": 7}, data, args)  # an lr far too small: stopped at its cap
    assert (row["steps"], row["reached"], row["cap"]) == (7, False, 7)
    assert row["val_curve"][-1][0] == 7


def _pilot_row(seed: int, curve: list[tuple[int, float]], lr: float = 0.1) -> dict:
    return {"recipe": "sgd+warmup", "batch": 32, "lr": lr, "seed": seed, "val_curve": [list(p) for p in curve],
            "setup": {"target": 95.0}}


def test_the_target_is_the_highest_level_the_pilots_seeds_resolve(study: ModuleType, tmp_path: Path) -> None:
    # four seeds: 79-81% are crossed at nearly the same step by all, 88-90% at steps spread 1.6x, 95% by one only
    pilot = {}
    for seed, (c80, c90, c95) in enumerate([(100, 200, 400), (105, 320, None), (110, 250, None), (100, 210, None)]):
        curve = [(50, 70.0), (c80, 81.0), (c90 - 5, 85.0), (c90, 90.0), (c95 or 500, 95.0 if c95 else 92.0)]
        r = _pilot_row(seed, curve)
        pilot[study.key(r)] = r
    assert study.crossing(pilot[("sgd+warmup", 32, 0.1, 0)]["val_curve"], 89) == 200
    assert study.crossing(pilot[("sgd+warmup", 32, 0.1, 1)]["val_curve"], 95) is None
    levels = [79.0, 80.0, 81.0, 88.0, 89.0, 90.0, 95.0]
    table = {row["target"]: row for row in study.target_table(pilot, levels, n=5, alpha=0.05 / 12)}
    assert table[80.0]["missed"] == 0 and table[80.0]["df"] == 3 and table[80.0]["sd"] < 0.05
    assert table[89.0]["sd"] > 0.15 and table[89.0]["ratio"] > table[80.0]["ratio"]
    assert table[95.0]["missed"] == 3 and table[95.0]["df"] == 0 and table[95.0]["ratio"] == float("inf")
    # smoothed: a level's variance averaged with its neighbours' (81% sits beside 88%'s wide spread)
    assert table[80.0]["smoothed"] == pytest.approx(table[80.0]["sd"])
    assert table[81.0]["smoothed"] == pytest.approx(((2 * table[81.0]["sd"] ** 2 + table[88.0]["sd"] ** 2) / 3) ** 0.5)
    assert table[80.0]["seeds_needed"] == 3 and table[89.0]["seeds_needed"] > 5
    rows = list(table.values())
    assert study.choose_target(rows, resolve=1.41) == 80.0  # 88-90% spread too much, 95% is missed
    assert study.choose_target(rows, resolve=table[89.0]["ratio"] + 0.01) == 90.0  # the highest that does
    assert study.choose_target(rows, resolve=1.0) is None
    # the report's section reads the same table from the pilot rows file and marks the choice
    path = tmp_path / "pilot.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in pilot.values()))
    cands = ["--candidate-targets", *[f"{t:g}" for t in levels]]
    args = _args(study, tmp_path, "--pilot", str(path), *cands, "--target", "80")
    text = "\n".join(study.target_section(args))
    assert "| 80 **(chosen)** | 0/4 |" in text and "| 95 | 3/4 | - | - | - | - |" in text and "not the rule" not in text
    args = _args(study, tmp_path, "--pilot", str(path), *cands, "--target", "88")
    assert "**The study runs at 88%, not the rule's 80%.**" in "\n".join(study.target_section(args))


def test_a_doubling_is_read_from_its_interval(study: ModuleType) -> None:
    assert study.doubling_word(0.7, 0.95) == "more steps"
    assert study.doubling_word(0.9, 1.6) == "not resolved"
    assert study.doubling_word(1.2, 1.8) == "fewer steps, less than halved"
    assert study.doubling_word(1.6, 2.4) == "fewer steps; halving not excluded"
    assert study.doubling_word(2.1, 2.9) == "more than halved"


def test_the_results_compare_each_doubling_and_the_noise_scale_with_the_fit(study: ModuleType, tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows of a known curve S = 400 (1 + 128 / B), 6 seeds a batch at a settled grid's centre (the
    largest batch's seeds spread wider): each
    doubling's ratio and verdict, the fit, and B_simple read against B_crit's interval."""
    # the words read the fit and its intervals, whatever the bootstrap's size: 200 draws instead of the
    # study's 1000 (as the bootstrap's own tests here) make each of the two fits 5x cheaper
    monkeypatch.setattr(study, "joint_draws", functools.partial(study.joint_draws, draws=200))
    batches = [64, 128, 256, 512, 1024]
    args = study.parse(["--out", str(tmp_path / "s"), "--recipes", "lars", "--batches", *map(str, batches),
                        "--seeds", *map(str, range(6)), "--sweep-seeds", "2"])
    rng = np.random.default_rng(3)
    rows, c = {}, args.lars_lr
    for b in batches:
        for seed in range(6):
            steps = round(400 * (1 + 128 / b) * float(np.exp(rng.normal(0, 0.15 if b == 1024 else 0.04))))
            r = {**_row(b, study.on_grid(c, 0), seed, steps, recipe="lars"), "b_simple_at_target": 128.0}
            rows[study.key(r)] = r
            for j in ((-1, 1) if seed < 2 else ()):  # the sweep's edges: slower, so the centre is chosen
                r = {**_row(b, study.on_grid(c, j), seed, 3 * steps, recipe="lars"), "b_simple_at_target": None}
                rows[study.key(r)] = r
    text = "\n".join(study.results_section(args, rows))
    lines = {line.split("|")[2].strip(): line for line in text.splitlines() if line.startswith("| lars |") and "->" in line}
    # 64 -> 128 takes 3/2 = 1.5x fewer steps (resolved, short of halving); 512 -> 1024 takes 1.11x,
    # which its wider spread leaves unresolved
    ratio = {pair: float(line.split("|")[3]) for pair, line in lines.items()}
    assert ratio["64 -> 128"] == pytest.approx(1.5, abs=0.1) and ratio["512 -> 1024"] == pytest.approx(1.11, abs=0.1)
    assert lines["64 -> 128"].endswith("fewer steps, less than halved |"), text
    assert lines["512 -> 1024"].endswith("not resolved |"), text
    assert "B_crit **1" in text and "the ratio's interval holds 1: the noise scale predicts the bend" in text, text
    summary = next(line for line in text.splitlines() if line.startswith("- **lars**"))
    assert summary.startswith("- **lars**: halving excluded from the first doubling (64 -> 128); "
                              "fewer steps, less than halved: 64 -> "), summary
    assert summary.endswith("not resolved: 512 -> 1024."), summary
    # a batch where a seed of the chosen lr missed the target has no geometric mean: its doubling
    # says so (not "pending"), and so does the summary
    miss = dict(rows[("lars", 1024, study.on_grid(c, 0), 5)], reached=False)
    rows[study.key(miss)] = miss
    text = "\n".join(study.results_section(args, rows))
    assert "| lars | 512 -> 1024 | not compared (1024: 5/6 seeds reached) |" in text and "1024 -> " not in text, text
    assert "not compared: 512 -> 1024." in text, text


def test_the_summary_says_up_to_which_batch_doubling_may_halve_the_steps(study: ModuleType) -> None:
    half, short, unres = "fewer steps; halving not excluded", "fewer steps, less than halved", "not resolved"
    words = [(32, 64, half), (64, 128, "more than halved"), (128, 256, short), (256, 512, short),
             (512, 1024, unres)]
    assert study.doubling_summary("sgd", words) == (
        "**sgd**: halving not excluded at every doubling up to batch 128 (from 32); "
        "fewer steps, less than halved: 128 -> 512 (2 doublings); not resolved: 512 -> 1024.")
    assert study.doubling_summary("sgd", words[:2], pending=3) == (
        "**sgd**: halving not excluded at every doubling up to batch 128 (from 32); 3 more doublings pending.")
    assert study.doubling_summary("sgd", [(32, 64, half), (64, 128, None), (128, 256, half)]) == (
        "**sgd**: halving not excluded at every doubling up to batch 64 (from 32); pending: 64 -> 128; "
        "fewer steps; halving not excluded: 128 -> 256.")
    assert study.doubling_summary("sgd", [], pending=4) == "**sgd**: pending."


def test_a_sweep_seed_that_misses_spares_the_other_sweep_seeds_at_its_lr(study: ModuleType, tmp_path: Path) -> None:
    """A miss scores the lr infinity whatever the other sweep seeds do, so they are not run there;
    a grid all of whose points have missed grows downward at once."""
    args = _args(study, tmp_path, "--recipes", "lars", "--sweep-seeds", "2", "--max-grow", "2")
    base, c, (s0, s1) = args.base_batch, args.lars_lr, args.seeds[:2]

    def base_jobs(rows: dict) -> set:
        return {(j["lr"], j["seed"]) for j in study.plan(rows, args)[0] if j["batch"] == base}

    rows = {}
    for j in (1, 0, -1):
        r = _row(base, study.on_grid(c, j), s0, 999, reached=False, recipe="lars")
        rows[study.key(r)] = r
        assert study.score(rows, "lars", base, study.on_grid(c, j), [s0, s1]) == float("inf")
        assert (study.on_grid(c, j), s1) not in base_jobs(rows)
        if j > -1:  # some point not yet scored: the grid waits
            assert study.grid_of(rows, "lars", base, args) == [study.on_grid(c, k) for k in (-1, 0, 1)]
    assert study.grid_of(rows, "lars", base, args)[0] == study.on_grid(c, -2)
    assert base_jobs(rows) == {(study.on_grid(c, -2), s0), (study.on_grid(c, -2), s1)}
    assert study.chosen_lr(rows, "lars", base, args) is None


def test_the_cost_spent_sums_every_row_and_the_misses_share(study: ModuleType) -> None:
    rows = {}
    for seed, (secs, reached) in enumerate([(120.0, True), (300.0, False), (180.0, True)]):
        r = {**_row(64, 0.1, seed, 500, reached=reached), "seconds": secs}
        rows[study.key(r)] = r
    assert study.spent(rows) == ("3 trainings, 10 core-minutes (CPU time; wall clock, one thread, for the 3 rows "
                                 "from before CPU time was recorded, which count their workers' pauses); 1 of them "
                                 "stopped short of the target and took 5 of those minutes")
    for r in rows.values():  # CPU time, where recorded, is the cost: a paused worker's wall time is not
        r["cpu_seconds"] = r["seconds"] / 2
    assert study.spent(rows) == "3 trainings, 5 core-minutes (CPU time); 1 of them stopped short of the target " \
        "and took 2 of those minutes"


def test_two_recipes_bends_are_compared_through_their_bootstraps(study: ModuleType) -> None:
    """Each recipe's B_crit against the first recipe's: the ratio of the fits and its interval from
    the ratio of the two bootstraps' draws; an interval holding 1 does not tell them apart."""
    rng = np.random.default_rng(0)
    curves = {"a": (300, 100), "b": (200, 400), "c": (300, 110)}
    fits = {}
    for name, (s_min, b_crit) in curves.items():
        by = {b: [s_min * (1 + b_crit / b) * float(np.exp(rng.normal(0, 0.05))) for _ in range(6)]
              for b in (32, 64, 128, 256, 512)}
        smins, bcrits = study.bootstrap_draws(by, draws=200)
        fits[name] = {"b_crit": study.fit_curve([b for b in by for _ in by[b]], [s for b in by for s in by[b]])[1],
                      "draws": bcrits, "noise": [120.0, 140.0] if name != "c" else []}
    lines = study.recipes_compared(fits)
    b_line, c_line = lines[0], lines[1]
    ratio = float(b_line.split("B_crit ")[1].split("x")[0])
    assert ratio == pytest.approx(4.0, rel=0.25), b_line
    assert b_line.endswith(": larger; B_simple at the target 1.00x a's."), b_line
    assert c_line.endswith(": not told apart."), c_line
    assert study.recipes_compared({"a": fits["a"]}) == []


def test_the_noise_scale_verdict_follows_the_ratio_the_lr_choices_and_the_reading(study: ModuleType) -> None:
    """B_simple against the bend: a prediction where the ratio's joint interval holds 1; "approximately"
    where B_crit's span over the tied lr choices holds B_simple; not told apart from that where only
    B_simple read at another batch (EMA lag corrected) reaches the span; otherwise off by the factor."""
    assert study.noise_verdict((0.9, 0.8, 1.1), (300, 700), 380).startswith("the ratio's interval holds 1")
    assert study.noise_verdict((0.76, 0.63, 0.88), (269, 701), 317).startswith(
        "a 1.3x underestimate, consistent with \"approximately\"")
    assert study.noise_verdict((0.31, 0.26, 0.40), (569, 1203), 202, (182, 600)).startswith(
        "3.2x below the bend at the chosen lrs, but read at another batch")
    assert study.noise_verdict((0.31, 0.26, 0.40), (569, 1203), 202, (182, 315)).startswith(
        "3.2x below the bend, outside the ratio's interval")
    assert study.noise_verdict((2.0, 1.5, 2.6), None, 800).startswith("2.0x above the bend")


def test_the_joint_draws_resample_a_run_with_its_noise_scale_and_keep_the_bootstrap(study: ModuleType) -> None:
    rng = np.random.default_rng(2)
    by = {b: list(300 * (1 + 200 / b) * np.exp(rng.normal(0, 0.05, 4))) for b in (32, 64, 128, 256)}
    noise = {b: [None] * 4 if b == 32 else [float(b)] * 4 for b in by}  # each batch's runs read the batch
    draws = study.joint_draws(by, noise, draws=50)
    assert [d[1] for d in draws] == study.bootstrap_draws(by, draws=50)[1]  # the same resamples
    assert all(d[2] in (64.0, 128.0, 256.0) or 64 <= d[2] <= 256 for d in draws)
    assert study.joint_draws(by, None, draws=3)[0][2] is None


def test_the_lr_choice_span_covers_every_tied_choice(study: ModuleType) -> None:
    """Two tied lrs per batch, one fast and one slow: the span runs from the fit of the choice that
    flattens the curve most to the one that bends it most, each as ``fit_curve`` gives it."""
    import itertools
    base = {b: math.log(300 * (1 + 200 / b)) for b in (32, 64, 128, 256, 512)}
    means = {b: {0.1: m, 0.2: m + 0.1, 0.4: m + 3.0} for b, m in base.items()}  # 0.4 is told apart
    lo, hi, n = study.lr_choice_span(means, sd=0.1, df=40, n=2)
    assert n == 2 ** 5
    fits = [study.fit_curve(list(base), [math.exp(means[b][lr]) for b, lr in zip(base, pick)])[1]
            for pick in itertools.product((0.1, 0.2), repeat=5)]
    assert lo == pytest.approx(min(fits), rel=1e-4) and hi == pytest.approx(max(fits), rel=1e-4)
