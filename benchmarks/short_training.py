"""A short real training that has to hold three promises on the device it runs on: the loss goes
down, every evaluation counts each validation image exactly once, and a run stopped half-way and
resumed with ``resume=auto`` ends with the same weights, bit for bit, as the run that never stopped.

Three ``largebatch-train`` runs on the same data: straight to ``--steps`` steps, then a second one
stopped after half of the steps the first made and resumed to the same end. Prints one table (a row
per check) and exits 1 if a check fails. The data is an ImageFolder tree given as ``data.root``
(its ``val/`` files are what an evaluation must count); the runs keep every checkpoint.

Run:
    python benchmarks/short_training.py --root DATA --out /tmp/short --steps 300 -- backend=cuda
    python benchmarks/short_training.py --root DATA --out /tmp/short --steps 8 -- backend=cpu debug=smoke

On CUDA the runs set ``backend.cudnn_benchmark=false`` and ``CUBLAS_WORKSPACE_CONFIG`` so that the
two runs choose the same kernels; whatever differs after that is what the table reports.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Optional, Sequence

import torch

from largebatch.engine.checkpoint import list_checkpoints, load_checkpoint

TRAIN = "import sys; from largebatch.cli import main; sys.exit(main(sys.argv[1:]))"
# every checkpoint kept, no progress bar or TensorBoard; fp32-exact kernels where the device has a choice
FIXED = ("progress=false", "tensorboard=false", "checkpoint.keep=0", "backend.cudnn_benchmark=false")


def train(run_dir: Path, overrides: Sequence[str]) -> None:
    env = dict(os.environ, CUBLAS_WORKSPACE_CONFIG=os.environ.get("CUBLAS_WORKSPACE_CONFIG", ":4096:8"))
    argv = [sys.executable, "-c", TRAIN, *overrides, *FIXED, f"run_dir={run_dir}"]
    print("$ largebatch-train " + " ".join([*overrides, *FIXED, f"run_dir={run_dir}"]), flush=True)
    proc = subprocess.run(argv, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"short_training: the run in {run_dir} exited {proc.returncode}")


def records(run_dir: Path, kind: str) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r.get("kind") == kind]


def last_weights(run_dir: Path) -> tuple[int, dict[str, torch.Tensor]]:
    ckpt = load_checkpoint(list_checkpoints(run_dir / "checkpoints")[-1])
    return ckpt["train_state"]["step"], ckpt["model"]


def differing(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> list[str]:
    return sorted(set(a) ^ set(b)) + [k for k in a if k in b and not torch.equal(a[k], b[k])]


def val_files(root: Path) -> int:
    return sum(1 for p in (root / "val").rglob("*") if p.is_file())


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--root", type=Path, required=True, help="ImageFolder data set (train/ and val/)")
    p.add_argument("--out", type=Path, required=True, help="the three runs' folders go here")
    p.add_argument("--steps", type=int, default=300, help="steps of the straight run (fewer if its epochs end first)")
    p.add_argument("overrides", nargs="*", help="largebatch-train overrides (after --)")
    args = p.parse_args(argv)
    base = [*args.overrides, f"data.root={args.root}"]
    straight, resumed = args.out / "straight", args.out / "resumed"
    train(straight, [*base, f"max_steps={args.steps}"])
    end, weights = last_weights(straight)
    stop = end // 2
    train(resumed, [*base, f"max_steps={stop}"])
    stopped_at, _ = last_weights(resumed)
    train(resumed, [*base, f"max_steps={end}", "resume=auto"])
    resumed_end, resumed_weights = last_weights(resumed)

    losses = [r["loss"] for r in records(straight, "train") if r["loss"] is not None]  # null: steps skipped
    evals = [r["total"] for r in records(straight, "eval")]
    expected = val_files(args.root)
    diff = differing(weights, resumed_weights)
    checks = [
        ("the loss goes down", bool(losses) and losses[-1] < losses[0],
         f"first logged {losses[0]:.4f} -> last {losses[-1]:.4f} over {end} steps" if losses else "no train record"),
        ("every evaluation counts each val image once", bool(evals) and all(n == expected for n in evals),
         f"{len(evals)} evaluations counted {sorted(set(evals))} of {expected} val files"),
        ("stop + resume = the straight run, bit for bit", stopped_at == stop and resumed_end == end and not diff,
         f"stopped at step {stopped_at}, resumed to {resumed_end}; "
         + (f"{len(diff)} of {len(weights)} tensors differ, e.g. {', '.join(diff[:3])}" if diff
            else f"all {len(weights)} tensors identical")),
    ]
    print("\n| short training check | result | detail |\n|---|---|---|")
    for name, ok, detail in checks:
        print(f"| {name} | {'ok' if ok else 'FAILED'} | {detail} |")
    return 0 if all(ok for _, ok, _ in checks) else 1


if __name__ == "__main__":
    raise SystemExit(main())
