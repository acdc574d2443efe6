"""The embedded default run with and without a record system's technique, over seeds, in one table.

fast.ai's DAWNBench 2018 ImageNet run trained at low resolution first and raised it (128 -> 224
-> 288 px) and evaluated at a higher resolution than it trained at; FFCV's ResNet configurations
ramp the resolution linearly and evaluate higher too (Touvron et al. 2019, arXiv 1906.06423, on
why a higher test resolution helps). Sony's 224-second run (Mikami et al. 2018) raised the global
batch during training (batch-size control; Smith et al. 2017 hold the lr instead). Does any make the default run (``largebatch-train`` on
the embedded set: resnet10t, 32 px crops of 48 px images, 8 epochs, target 90% val top-1) reach
its target sooner without losing accuracy? Each arm is the default plus Hydra overrides; every
arm runs every seed, the arms interleaved per seed (so a machine that gets busier later moves
every arm alike). The table gives each arm's best val top-1 (mean and range over seeds), its
time to the target (mean, of the seeds that reached it) and training wall time, and each
against the baseline as a ratio (time) or a difference (accuracy), with the per-seed pairs'
range.

    python benchmarks/default_run_techniques.py                  # 3 arms x 3 seeds (~1-3 h on 2 cores)
    python benchmarks/default_run_techniques.py --arms baseline progressive --seeds 0 1 2 3 4
    python benchmarks/default_run_techniques.py --quick          # smoke test: tiny, seconds
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Sequence

# arm -> Hydra overrides on top of the default run. The steps schedule trains the first 5 of the
# 8 epochs at 24 px (fast.ai's form: two steps; 24/32 is their 128/224 rounded to the 8-px grid
# this size allows) and evaluates at the training side; "+test-res" also evaluates at 40 px
# (the 48 px images resized to 40/0.875, centre-cropped: 1.25x the training side, as 288/224).
ARMS: dict[str, list[str]] = {
    "baseline": [],
    "progressive": ["data.resolution.schedule=steps", "data.resolution.steps=[[0,24],[5,32]]"],
    "progressive+test-res": ["data.resolution.schedule=steps", "data.resolution.steps=[[0,24],[5,32]]",
                             "data.resolution.eval_size=40"],
    "test-res": ["data.resolution.eval_size=40"],
    # batch-size control (Mikami et al. 2018's form): 64 for epochs 0-3, 128 for 4-5, 256 for 6-7,
    # the per-device batch raised (BN sees it) and the lr scaled by the linear rule per phase
    "batch-x2-x4": ["batch_schedule.steps=[[4,128],[6,256]]", "batch_schedule.via=per_device"],
    # Smith et al. 2017's form: the same batches, the lr held (the cosine decay still runs)
    "batch-x2-x4-hold": ["batch_schedule.steps=[[4,128],[6,256]]", "batch_schedule.via=per_device",
                         "batch_schedule.lr=hold"],
    # NHWC on the CPU (``model.channels_last: null`` means CUDA only): paid 1.3x for ResNet-50 in
    # benchmarks/cpu_layout.py; whether it pays for the default run, in both precisions (pass
    # precision=fp32 for the other), is this arm's question
    "channels-last": ["model.channels_last=true"],
    # the decoded loader (docs/decoded-loader.md): each split decoded once into a
    # store, each batch augmented as a whole; alone and with the two techniques the input wall blocked
    "decoded": ["data.loader=decoded"],
    "decoded-1-thread": ["data.loader=decoded", "data.workers=1"],  # one batch augmented at a time
    "decoded+progressive": ["data.loader=decoded", "data.resolution.schedule=steps",
                            "data.resolution.steps=[[0,24],[5,32]]"],
    "decoded+batch-x2-x4": ["data.loader=decoded", "batch_schedule.steps=[[4,128],[6,256]]",
                            "batch_schedule.via=per_device"],
}
QUICK = ["debug=smoke", "progress=false", "tensorboard=false", "data.workers=0", "global_batch_size=8",
         "data.synthetic.train_per_class=8", "data.synthetic.val_per_class=2", "data.image_size=16"]
QUICK_ARMS = {"baseline": [], "progressive": ["data.resolution.schedule=steps", "data.resolution.steps=[[0,8],[1,16]]"]}


def run_one(arm: str, overrides: list[str], seed: int, out: Path, extra: Sequence[str]) -> dict[str, Any]:
    run_dir = out / f"{arm}-seed{seed}"
    cmd = [sys.executable, "-m", "largebatch.train", f"run_dir={run_dir}", f"seed={seed}", "progress=false",
           *extra, *overrides]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{arm} seed {seed} failed ({proc.returncode}): {proc.stderr.strip().splitlines()[-1:]}")
    summary = json.loads((run_dir / "summary.json").read_text())
    return {"arm": arm, "seed": seed, "best_top1": summary["best_top1"], "time_to_target_s": summary["time_to_target_s"],
            "wall_time_s": summary["wall_time_s"], **reached(run_dir)}


def reached(run_dir: Path) -> dict[str, Any]:
    """The epoch and optimizer step of the first evaluation at the run's target (None: never):
    the other processes on a shared machine change the seconds, not these."""
    target = json.loads((run_dir / "summary.json").read_text()).get("target_top1")
    evals = [r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "eval"]
    first = next((r for r in evals if target is not None and r["top1"] >= target), None)
    return {"epochs_to_target": first and first["epoch"], "steps_to_target": first and first["step"]}


def spread(v: Sequence[float], fmt: str) -> str:
    if not v:
        return "n/a"
    return (f"{statistics.mean(v):{fmt}} [{min(v):{fmt}}, {max(v):{fmt}}]" if len(v) > 1
            else f"{v[0]:{fmt}}")


def table(rows: list[dict[str, Any]], arms: Sequence[str], target: str) -> str:
    by = {(r["arm"], r["seed"]): r for r in rows}
    seeds = sorted({r["seed"] for r in rows})
    L = [f"| arm | best val top-1 (mean [min, max]) | minus baseline, per seed | time to {target} (s) | "
         "time / baseline, per seed | reached | epochs to target | steps to target | wall (s) | wall / baseline |",
         "|---|---|---|---|---|---|---|---|---|---|"]
    for arm in arms:
        mine = [by[(arm, s)] for s in seeds if (arm, s) in by]
        base = {s: by[("baseline", s)] for s in seeds if ("baseline", s) in by}
        acc = [r["best_top1"] for r in mine]
        ttt = [r["time_to_target_s"] for r in mine if r["time_to_target_s"] is not None]
        d_acc = [r["best_top1"] - base[r["seed"]]["best_top1"] for r in mine if r["seed"] in base]
        r_ttt = [r["time_to_target_s"] / base[r["seed"]]["time_to_target_s"] for r in mine
                 if r["seed"] in base and r["time_to_target_s"] and base[r["seed"]]["time_to_target_s"]]
        r_wall = [r["wall_time_s"] / base[r["seed"]]["wall_time_s"] for r in mine if r["seed"] in base]
        same = arm == "baseline"
        e_tt = [r["epochs_to_target"] for r in mine if r.get("epochs_to_target") is not None]
        s_tt = [r["steps_to_target"] for r in mine if r.get("steps_to_target") is not None]
        L.append(f"| {arm} | {spread(acc, '.2f')} | {'' if same else spread(d_acc, '+.2f')} | {spread(ttt, '.0f')} | "
                 f"{'' if same else spread(r_ttt, '.2f')} | {len(ttt)}/{len(mine)} | {spread(e_tt, '.1f')} | "
                 f"{spread(s_tt, '.0f')} | "
                 f"{spread([r['wall_time_s'] for r in mine], '.0f')} | {'' if same else spread(r_wall, '.2f')} |")
    return "\n".join(L)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--arms", nargs="+", default=["baseline", "progressive", "progressive+test-res"],
                   choices=list(ARMS))
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--out", type=Path, default=None, help="run directories and rows.jsonl (default: a temp folder)")
    p.add_argument("--quick", action="store_true", help="smoke test: the tests' shrunk run, 2 arms")
    p.add_argument("overrides", nargs="*", help="Hydra overrides for every arm (e.g. precision=fp32)")
    args = p.parse_args(argv)
    arms = dict(QUICK_ARMS) if args.quick else {a: ARMS[a] for a in args.arms}
    if "baseline" not in arms:
        p.error("--arms must include baseline (the ratios are against it)")
    out = args.out or Path(tempfile.mkdtemp(prefix="default_run_techniques-"))
    out.mkdir(parents=True, exist_ok=True)
    extra = [*(QUICK if args.quick else []), *args.overrides]
    rows_path = out / "rows.jsonl"
    done = {(r["arm"], r["seed"]): r for r in map(json.loads, rows_path.read_text().splitlines())} \
        if rows_path.exists() else {}
    for (arm, seed), row in done.items():  # rows written before these columns: read them from the run
        run_dir = out / f"{arm}-seed{seed}"
        if "epochs_to_target" not in row and (run_dir / "metrics.jsonl").exists():
            row.update(reached(run_dir))
    for seed in args.seeds:  # arms interleaved per seed; a rerun with the same --out goes on
        for arm, overrides in arms.items():
            if (arm, seed) in done:
                continue
            row = run_one(arm, overrides, seed, out, extra)
            done[(arm, seed)] = row
            with rows_path.open("a") as f:
                f.write(json.dumps(row) + "\n")
            print(f"{arm} seed {seed}: best {row['best_top1']}, to target {row['time_to_target_s']} s, "
                  f"wall {row['wall_time_s']} s", flush=True)
    rows = [r for r in done.values() if r["arm"] in arms and r["seed"] in args.seeds]
    print(f"\nrows: {rows_path}; overrides for every arm: {' '.join(extra) or '(none)'}\n")
    print(table(rows, list(arms), "target"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
