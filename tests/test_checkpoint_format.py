"""What a checkpoint holds has one home (``largebatch.engine.checkpoint_format``), and a
checkpoint of the format before it (format 1, no ``format`` key) still resumes, exactly.

The format-1 file is written by the code of :data:`FORMAT_1_COMMIT` (the last main that wrote
format 1), taken from this repository's history and run in a subprocess.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import torch

from largebatch.engine.checkpoint import checkpoint_name, list_checkpoints, load_checkpoint
from largebatch.engine.checkpoint_format import FORMAT, RunCheckpoint, RunIdentity
from largebatch.errors import CheckpointError
from tests.smoke import EXACT, smoke

REPO = Path(__file__).resolve().parents[1]
FORMAT_1_COMMIT = "1e2a6df"  # main before the format had a module and a number (issue 46)

# tests/test_resume.py's exact resume (warmup + cosine, momentum SGD: the schedule, optimizer and
# RNG states all matter), with a checkpoint every 2 of its 8 steps
RUN = smoke("checkpoint.every_steps=2", base=EXACT)


def _record(**changes: object) -> RunCheckpoint:
    parts = dict(model={"w": torch.ones(2)}, optimizer={"state": {}}, scheduler={"last_epoch": 3}, scaler=None,
                 train_state={"step": 3}, rng={"torch": torch.zeros(2, dtype=torch.uint8)}, world_size=2,
                 global_batch_size=8, accumulation_steps=1, steps_per_epoch=4,
                 identity=RunIdentity(model_name="resnet10t", config={"optimizer": {"name": "lars"}},
                                      resolved={"num_classes": 10}))
    return RunCheckpoint(**{**parts, **changes})


def test_the_record_goes_to_a_plain_dict_and_back() -> None:
    record = _record(ema={"w": torch.zeros(2)})
    state = record.to_state()
    assert state["format"] == FORMAT and state["model_name"] == "resnet10t" and "ema" in state
    back = RunCheckpoint.from_state(state, "x.pt")
    assert back.identity == record.identity and back.steps_per_epoch == 4 and torch.equal(back.ema["w"], torch.zeros(2))
    assert back.identity.optimizer_name == "lars" and back.identity.num_classes == 10
    assert "ema" not in _record().to_state()  # no EMA: no key (as format 1 wrote it)


def test_the_noise_scale_averages_are_an_optional_part() -> None:
    """Written where the run measured the noise scale; a file without them (older, or a run
    without the measurement) reads as before, with ``noise_scale`` None, and is not incomplete."""
    from largebatch.diagnostics import GradientNoiseScale

    tracker = GradientNoiseScale(0.9)
    tracker.update(torch.tensor(4.0), 8, torch.tensor(1.0), 16)
    state = _record(noise_scale=tracker.state_dict()).to_state()
    back = RunCheckpoint.from_state(state, "x.pt")
    resumed = GradientNoiseScale(0.9)
    resumed.load_state_dict(back.noise_scale)
    assert resumed.updates == 1 and torch.equal(resumed.noise_scale(), tracker.noise_scale())
    older = RunCheckpoint.from_state(_record().to_state(), "old.pt")
    assert "noise_scale" not in _record().to_state() and older.noise_scale is None and not older.missing_parts()


def test_format_1_and_weights_only_files_read_and_say_what_is_missing() -> None:
    old = {k: v for k, v in _record().to_state().items() if k != "format"}
    assert RunCheckpoint.from_state(old, "old.pt").format == 1
    weights = RunCheckpoint.from_state({"model": {"w": torch.ones(1)}}, "w.pt")
    assert weights.missing_parts() == ["optimizer", "scheduler", "train_state", "rng"]
    assert weights.identity == RunIdentity()


def test_a_newer_format_is_refused_in_one_line() -> None:
    with pytest.raises(CheckpointError) as err:
        RunCheckpoint.from_state({**_record().to_state(), "format": FORMAT + 1, "version": "9.0"}, "new.pt")
    msg = str(err.value)
    assert "\n" not in msg and f"format {FORMAT + 1}" in msg and "9.0" in msg and "new.pt" in msg


def _format_1_tree(tmp: Path) -> Path:
    """The package as FORMAT_1_COMMIT had it, importable from ``tmp`` (its config tree inside)."""
    if not (REPO / ".git").exists():
        pytest.skip("needs the repository's history (a git checkout) to run the format-1 code")
    archive = tmp / "old.tar"
    done = subprocess.run(["git", "-C", str(REPO), "archive", "-o", str(archive), FORMAT_1_COMMIT, "largebatch", "conf"],
                          capture_output=True, text=True)
    if done.returncode:
        pytest.skip(f"commit {FORMAT_1_COMMIT} is not in this clone's history (shallow?): {done.stderr.strip()}")
    tree = tmp / "old"
    with tarfile.open(archive) as tar:
        tar.extractall(tree, filter="data")
    (tree / "conf").rename(tree / "largebatch" / "conf")  # setup.py installs conf/ as largebatch.conf
    return tree


def _train(code: Path, *overrides: str) -> None:
    """``python -m largebatch.train`` with the package of ``code``, one thread (same arithmetic in both)."""
    env = {**os.environ, "PYTHONPATH": str(code), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "largebatch.train", *overrides], cwd=code.parent, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


def test_a_format_1_checkpoint_of_the_previous_main_resumes_exactly(tmp_path: Path) -> None:
    """The previous main trains 8 steps (checkpoints every 2); this code resumes its step-4
    checkpoint and ends with the same weights, bit for bit, as its step-8 checkpoint."""
    tree = _format_1_tree(tmp_path)
    old_run = tmp_path / "old-run"
    _train(tree, *RUN, f"run_dir={old_run}")
    written = {p.name: load_checkpoint(p) for p in list_checkpoints(old_run / "checkpoints")}
    step4 = old_run / "checkpoints" / checkpoint_name(1, 4)
    assert "format" not in written[step4.name], "the previous main should write format 1"

    run = tmp_path / "run"
    _train(REPO, *RUN, f"run_dir={run}", f"resume={step4}")  # this code, in the same kind of process
    resumed = load_checkpoint(list_checkpoints(run / "checkpoints")[-1])
    straight = written[checkpoint_name(2, 8)]
    assert resumed["format"] == FORMAT and resumed["train_state"]["step"] == 8
    assert resumed["model"].keys() == straight["model"].keys()
    for key, value in straight["model"].items():
        assert torch.equal(resumed["model"][key], value), key
