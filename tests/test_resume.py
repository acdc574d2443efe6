"""Exact resume: a run stopped after step k and resumed with ``resume=auto`` ends with the
same weights, bit for bit, as the run that never stopped (fp32, data.workers=0)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from largebatch.cli import main
from largebatch.engine.checkpoint import list_checkpoints, load_checkpoint

# debug=smoke shrunk: 4 classes x 8 train images, global batch 8 -> 4 steps per epoch, 2
# epochs. A warmup + cosine schedule and random-resized crops make the schedule position and
# the RNG state matter; momentum SGD makes the optimizer state matter.
EXACT = [
    "debug=smoke",
    "global_batch_size=8",
    "data.synthetic.train_per_class=8",
    "data.synthetic.val_per_class=2",
    "data.image_size=16",
    "progress=false",
    "tensorboard=false",
    "model=resnet10t",
    "data.workers=0",
    "precision=fp32",
    "schedule=cosine",
    "schedule.warmup_epochs=0.5",
    "checkpoint.keep=0",
]


@pytest.fixture(scope="module")
def straight(tmp_path_factory: pytest.TempPathFactory) -> dict[str, torch.Tensor]:
    """Final weights of the run that trains its 8 steps without stopping."""
    run = tmp_path_factory.mktemp("straight") / "run"
    assert main([*EXACT, f"run_dir={run}"]) == 0
    return _final_weights(run, expected_step=8)


def _final_weights(run: Path, expected_step: int) -> dict[str, torch.Tensor]:
    last = load_checkpoint(list_checkpoints(run / "checkpoints")[-1])
    assert last["train_state"]["step"] == expected_step
    return last["model"]


def _assert_complete(ckpt: dict) -> None:
    """Everything an exact resume needs, plus what tells a later run what made it."""
    import largebatch

    assert {"model", "optimizer", "scheduler", "scaler", "train_state", "rng", "config"} <= ckpt.keys()
    assert ckpt["optimizer"]["state"], "no momentum buffers"
    assert ckpt["scheduler"]["last_epoch"] == ckpt["train_state"]["step"]
    assert {"python", "numpy", "torch"} <= ckpt["rng"].keys()
    assert ckpt["version"] == largebatch.__version__ and ckpt["model_name"] == "resnet10t"
    assert (ckpt["world_size"], ckpt["global_batch_size"], ckpt["steps_per_epoch"]) == (1, 8, 4)
    assert ckpt["config"]["schedule"]["warmup_epochs"] == 0.5  # the resolved config


def _assert_identical(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    different = [k for k in a if not torch.equal(a[k], b[k])]
    assert not different, f"{len(different)} tensors differ after resume, e.g. {different[:3]}"


@pytest.mark.parametrize("stop_after", [4, 5], ids=["epoch-boundary", "mid-epoch"])
def test_stop_and_resume_gives_identical_weights(
    tmp_path: Path, straight: dict[str, torch.Tensor], stop_after: int
) -> None:
    run = tmp_path / "run"
    assert main([*EXACT, f"run_dir={run}", f"max_steps={stop_after}"]) == 0
    stopped = load_checkpoint(list_checkpoints(run / "checkpoints")[-1])
    assert stopped["train_state"]["step"] == stop_after
    assert stopped["train_state"]["epoch_step"] == stop_after % 4  # the data position
    _assert_complete(stopped)
    assert main([*EXACT, f"run_dir={run}", "resume=auto", "max_steps=null"]) == 0
    _assert_identical(straight, _final_weights(run, expected_step=8))
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 8 and summary["epochs"] == 2


def test_resume_at_max_steps_runs_no_extra_step(tmp_path: Path) -> None:
    run = tmp_path / "run"
    assert main([*EXACT, f"run_dir={run}", "max_steps=3"]) == 0
    assert main([*EXACT, f"run_dir={run}", "resume=auto", "max_steps=3"]) == 0
    assert json.loads((run / "summary.json").read_text())["steps"] == 3
