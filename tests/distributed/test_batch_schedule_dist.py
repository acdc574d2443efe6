"""Batch-size control (``batch_schedule``, issue 57) under real torchrun: 2 gloo ranks on CPU.

For each way the batch grows (``via=accumulation``: more micro-batches per step, each rank's
DDP reduction once per step; ``via=per_device``: each rank's k loader batches concatenated), a
run whose global batch goes 8 -> 16 (epoch 1) -> 32 (epoch 2) is run through, and again resumed
(``resume=auto``) inside phase 2 and inside phase 3: from the checkpoint the run through saved at
step 10 (``checkpoint.every_steps=10``, copied into a new run directory: the steps before it are
the run through's own, so a launch of its own for them would only repeat them), then stopped by
``max_steps`` at step 13 and resumed again:

* the resumed run's final weights, optimizer and lr scheduler states equal the uninterrupted
  run's bit for bit (its noise-scale averages to rounding), and every stop leaves the planned step, epoch position and images seen;
* the epoch records of ``metrics.jsonl`` carry each epoch's global batch;
* the noise scale (source ``ranks``) is handed each phase's sizes, the local gradient's and the
  global batch's, k times the base's (recorded in the workers by ``faults/sitecustomize.py``).

4 classes x 16 images, base global batch 8 (4 per rank): 8 steps in epoch 0, 4 of 16 in epoch 1,
2 of 32 in epoch 2 (14 in all). Three launches per form, about 9 s each on 2 idle cores.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from largebatch.engine.checkpoint import list_checkpoints, load_checkpoint
from tests.distributed.harness import run_to_end
from tests.smoke import EXACT, smoke

ROOT = Path(__file__).resolve().parents[2]
FAULTS = Path(__file__).resolve().parent / "faults"  # sitecustomize: the noise sizes recorder
TIMEOUT_S = 240  # a healthy launch takes ~9 s on 2 idle cores

JOB = smoke("backend=cpu", "data.synthetic.train_per_class=16", "epochs=3", "batch_schedule.steps=[[1,16],[2,32]]",
            "checkpoint.every_steps=10", base=EXACT)

# (step, epoch, epoch_step, images_seen) after each stop: inside phase 2, inside phase 3, the end
PLAN = {10: (10, 1, 2, 8 * 8 + 2 * 16), 13: (13, 2, 1, 8 * 8 + 4 * 16 + 32), 14: (14, 3, 0, 3 * 64)}
# per rank, per step: (local images, global images) = (4k, 8k) in a phase of factor k
NOISE_SIZES = [(4, 8)] * 8 + [(8, 16)] * 4 + [(16, 32)] * 2


def _torchrun(root: Path, run: Path, noise_sizes: Path, *extra: str) -> None:
    env = dict(os.environ, OMP_NUM_THREADS="1", LARGEBATCH_TEST_NOISE_SIZES=str(noise_sizes))
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(FAULTS), str(ROOT), env.get("PYTHONPATH")] if p)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           "-m", "largebatch.train", *JOB, f"run_dir={run}", *extra]
    log = root / "torchrun.log"
    code = run_to_end(cmd, env=env, cwd=ROOT, log=log, timeout_s=TIMEOUT_S)
    assert code == 0, f"torchrun {' '.join(extra)} exited with {code}:\n{log.read_text()[-4000:]}"


def _last(run: Path) -> dict[str, Any]:
    return load_checkpoint(list_checkpoints(run / "checkpoints")[-1])


def _state(run: Path) -> tuple[int, int, int, int]:
    s = _last(run)["train_state"]
    return s["step"], s["epoch"], s["epoch_step"], s["images_seen"]


def _epochs(run: Path) -> list[tuple[int, int, int]]:
    records = map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
    return [(r["epoch"], r["step"], r["global_batch_size"]) for r in records if r["kind"] == "epoch"]


def _noise_sizes(prefix: Path, rank: int) -> list[tuple[int, int]]:
    lines = Path(f"{prefix}.rank{rank}").read_text().split("\n")[:-1]
    return [tuple(map(int, line.split())) for line in lines]  # type: ignore[misc]


def _unequal(a: Any, b: Any) -> list[str]:
    """The paths where two (nested) checkpoint values differ (tensors by ``torch.equal``)."""
    if isinstance(a, torch.Tensor):
        return [] if isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b) else [""]
    if isinstance(a, dict):
        if not isinstance(b, dict) or a.keys() != b.keys():
            return [""]
        return [f"{k}.{p}".rstrip(".") for k in a for p in _unequal(a[k], b[k])]
    if isinstance(a, (list, tuple)):
        if not isinstance(b, (list, tuple)) or len(a) != len(b):
            return [""]
        return [f"{i}.{p}".rstrip(".") for i, (x, y) in enumerate(zip(a, b)) for p in _unequal(x, y)]
    return [] if a == b else [""]


@pytest.mark.parametrize("via", ["accumulation", "per_device"])
def test_two_ranks_resumed_inside_each_phase_are_bit_identical(tmp_path: Path, via: str) -> None:
    straight, run = tmp_path / "straight", tmp_path / "run"
    _torchrun(tmp_path, straight, tmp_path / "noise-straight", f"batch_schedule.via={via}")
    assert _state(straight) == PLAN[14]
    # the stop inside phase 2: the run through's checkpoint of step 10, in a run directory of its own
    at_10 = [p for p in list_checkpoints(straight / "checkpoints") if load_checkpoint(p)["train_state"]["step"] == 10]
    assert len(at_10) == 1, list_checkpoints(straight / "checkpoints")
    (run / "checkpoints").mkdir(parents=True)
    shutil.copy2(at_10[0], run / "checkpoints" / at_10[0].name)
    assert _state(run) == PLAN[10]
    for stop in (13, None):
        _torchrun(tmp_path, run, tmp_path / "noise-resumed", f"batch_schedule.via={via}", f"max_steps={stop or 'null'}",
                  "resume=auto")
        assert _state(run) == PLAN[stop or 14]

    a, b = _last(straight), _last(run)
    assert a["world_size"] == b["world_size"] == 2
    for part in ("model", "optimizer", "scheduler"):
        assert _unequal(a[part], b[part]) == [], part
    # The noise-scale averages agree to rounding, not bit for bit, the same without a batch schedule
    # (measured: 2e-5 relative). Likely cause, not proven: the local squared norm is a sum of one
    # norm per DDP bucket, and each process's first step runs on DDP's initial buckets (rebuilt
    # after it), so the resumed process's first step sums another partition.
    noise_a, noise_b = a["noise_scale"], b["noise_scale"]
    assert noise_a["updates"] == noise_b["updates"] == 14
    torch.testing.assert_close(noise_b["ema"], noise_a["ema"], rtol=1e-3, atol=0)

    # each epoch record carries its global batch; the resumed run's (from step 10 on) are the same records
    assert _epochs(straight) == [(1, 8, 8), (2, 12, 16), (3, 14, 32)]
    assert _epochs(run) == _epochs(straight)[1:]

    # the noise scale from the ranks: each phase's sizes on both ranks, the same across the resumes
    for rank in (0, 1):
        assert _noise_sizes(tmp_path / "noise-straight", rank) == NOISE_SIZES
        assert _noise_sizes(tmp_path / "noise-resumed", rank) == NOISE_SIZES[10:]
    for r in (straight, run):
        summary = json.loads((r / "summary.json").read_text())
        assert summary["steps"] == 14 and summary["world_size"] == 2
        assert summary["noise_scale_final"] is not None
