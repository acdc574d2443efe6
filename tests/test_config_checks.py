"""Out-of-range values fail at compose time, naming the key, before a run directory exists."""

from __future__ import annotations

from pathlib import Path

import pytest

from largebatch.cli import main

CASES = [
    ("epochs=0", "epochs=0 is out of range"),
    ("max_steps=-5", "max_steps=-5 is out of range"),
    ("optimizer.momentum=2", "optimizer.momentum=2.0 is out of range"),
    ("optimizer.lr=nan", "optimizer.lr=nan is out of range"),
    ("optimizer.lr=-1", "optimizer.lr=-1.0 is out of range"),
    ("data.image_size=0", "data.image_size=0 is out of range"),
    ("data.shuffle_buffer=0", "data.shuffle_buffer=0 is out of range: it must be an integer >= 1"),
    ("checkpoint.keep=-1", "checkpoint.keep=-1 is out of range"),
    ("label_smoothing=5", "label_smoothing=5.0 is out of range"),
    ("data.crop_scale=[0.5,0.1]", "data.crop_scale=[0.5, 0.1] is out of range"),
    ("bn.group_size=0", "bn.group_size=0 is out of range"),
    ("optimizer.eps=-1", "optimizer.eps=-1.0 is out of range"),
    ("ema.decay=1", "ema.decay=1.0 is out of range: it must be a number in [0, 1)"),
    ("ema.every=0", "ema.every=0 is out of range"),
    ("ema.warmup_power=0", "ema.warmup_power=0.0 is out of range"),
    ("ema.min_decay=0.99999", "ema.min_decay=0.99999 is out of range: it must be <= ema.decay (0.9999)"),
    ("ema.update_after_step=-3", "ema.update_after_step=-3 is out of range: it must be an integer >= -2"),
    ("ema.target=ema", "ema.target=ema needs the weight EMA: set ema.enabled=true"),
    ("diagnostics.noise_scale.beta=0", "diagnostics.noise_scale.beta=0.0 is out of range: it must be a number in (0, 1)"),
    ("diagnostics.noise_scale.beta=1", "diagnostics.noise_scale.beta=1.0 is out of range"),
    ("diagnostics.noise_scale.probe_every=-1",
     "diagnostics.noise_scale.probe_every=-1 is out of range: it must be an integer >= 0"),
    # the generator's own range (largebatch.defaults), not a wider one it refuses later by its own names
    ("data.synthetic.image_size=8", "data.synthetic.image_size=8 is out of range: it must be an integer in 16..1024"),
    ("data.synthetic.classes=101", "data.synthetic.classes=101 is out of range: it must be an integer in 2..100"),
    ("data.synthetic.seed=-1", "data.synthetic.seed=-1 is out of range: it must be an integer >= 0"),
    ("model.compile=fastest", "model.compile='fastest' is not a compile mode; use one of none, default,"),
]


@pytest.mark.parametrize("override,pattern", CASES, ids=[c[0] for c in CASES])
def test_out_of_range_value_is_one_line_before_the_run_dir(
    tmp_path: Path, capsys: pytest.CaptureFixture, override: str, pattern: str
) -> None:
    run = tmp_path / "run"
    assert main(["debug=smoke", "progress=false", f"run_dir={run}", override]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("largebatch: error:") and "\n" not in err and "Traceback" not in err
    assert pattern in err, err
    assert not run.exists()


def test_every_experiment_preset_is_in_range() -> None:
    from largebatch.config import compose_config

    presets = sorted(p.stem for p in (Path(__file__).parents[1] / "conf" / "experiment").glob("*.yaml"))
    for name in presets:
        compose_config([f"experiment={name}", "data.root=/data/imagenet"])


def test_eps_zero_is_lars_only(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """eps=0 is the MLPerf reference's LARS epsilon; LAMB divides by it, so LAMB refuses it."""
    common = ["debug=smoke", "progress=false", "tensorboard=false", "max_steps=1", "optimizer.eps=0"]
    assert main([*common, "optimizer=lars", f"run_dir={tmp_path / 'lars'}"]) == 0
    capsys.readouterr()
    assert main([*common, "optimizer=lamb", f"run_dir={tmp_path / 'lamb'}"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "invalid eps 0.0, must be > 0" in err, err


# A list-of-pairs key of a wrong shape or type (issue 75, item 2): one line naming the key, the item
# (position from 1, and value) and the form to write, derived from what was written where it can be.
PAIR_CASES = [
    (["data.resolution.crop_scale_steps=[1,0.5]"],
     "data.resolution.crop_scale_steps: item 1 is 1, not a pair [epoch, min_scale]",
     "data.resolution.crop_scale_steps=[[1,0.5]]"),
    (["data.resolution.crop_scale_steps=[null]"],
     "data.resolution.crop_scale_steps: item 1 is null, not a pair [epoch, min_scale]",
     "data.resolution.crop_scale_steps=[[1,0.5]]"),
    (["data.resolution.crop_scale_steps=0.5"],  # the hint used to suggest the flat form, which crashed
     "data.resolution.crop_scale_steps=0.5 is not a list of pairs [epoch, min_scale]",
     "data.resolution.crop_scale_steps=[[1,0.5]]"),
    (["schedule=piecewise", "schedule.points=[1,0.5]"],
     "schedule.points: item 1 is 1, not a pair [epoch, factor]", "schedule.points=[[1,0.5]]"),
    (["batch_schedule.steps=[1,64]"],
     "batch_schedule.steps: item 1 is 1, not a pair [epoch, global_batch_size]", "batch_schedule.steps=[[1,64]]"),
    (["batch_schedule.steps=[[1,64.0]]"],
     "batch_schedule.steps: item 1 is [1, 64.0], not a pair [epoch, global_batch_size] of integers",
     "batch_schedule.steps=[[1,64]]"),
    (["batch_schedule.steps=64"],
     "batch_schedule.steps=64 is not a list of pairs [epoch, global_batch_size]", "batch_schedule.steps=[[1,64]]"),
    (["data.resolution.schedule=steps", "data.resolution.steps=[0,32]"],
     "data.resolution.steps: item 1 is 0, not a pair [epoch, pixels]", "data.resolution.steps=[[0,32]]"),
    (["data.resolution.schedule=steps", "data.resolution.steps=[[0,16],[1,24.0]]"],
     "data.resolution.steps: item 2 is [1, 24.0], not a pair [epoch, pixels] of integers",
     "data.resolution.steps=[[0,16],[1,24]]"),
]


@pytest.mark.parametrize("overrides,named,suggested", PAIR_CASES, ids=[" ".join(c[0]) for c in PAIR_CASES])
def test_a_list_of_pairs_of_a_wrong_shape_names_the_item_and_a_form_that_works(
    tmp_path: Path, capsys: pytest.CaptureFixture, overrides: list[str], named: str, suggested: str
) -> None:
    from largebatch.config import compose_config

    run = tmp_path / "run"
    common = ["debug=smoke", "progress=false", f"run_dir={run}"]
    assert main([*common, *overrides]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err == f"largebatch: error: {named}; write {suggested}\n", err
    assert not run.exists()
    compose_config([*common, *overrides[:-1], suggested])  # the form it suggests is accepted
