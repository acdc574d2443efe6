"""Progressive resizing (``data.resolution``): the schedule's arithmetic and its checks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from largebatch.cli import main
from largebatch.errors import ConfigError
from largebatch.resolution import ResolutionSchedule, ramp_size

# ---------------------------------------------------------------------------------------
# the arithmetic


def test_steps_hold_each_side_from_its_epoch_on() -> None:
    """fast.ai's DAWNBench schedule: 128 px, then 224 from epoch 14, then 288 from epoch 28."""
    s = ResolutionSchedule.of("steps", steps=[[0, 128], [14, 224], [28, 288]], image_size=224, epochs=30)
    assert [s.size_at(e) for e in (0, 13, 14, 27, 28, 29)] == [128, 128, 224, 224, 288, 288]
    assert s.sizes(30) == [128, 224, 288]


def test_the_ramp_is_linear_and_rounded_to_the_multiple() -> None:
    """FFCV's rn50 ramp: 160 px up to epoch 10, 192 from epoch 13, rounded to 32 in between."""
    r = ResolutionSchedule.of("ramp", start_epoch=10, end_epoch=13, start_size=160, end_size=192, image_size=224,
                              epochs=16)
    assert [r.size_at(e) for e in range(9, 15)] == [160, 160, 160, 192, 192, 192]  # 170.7 -> 160, 181.3 -> 192
    wide = ResolutionSchedule.of("ramp", start_epoch=0, end_epoch=10, start_size=128, end_size=256, multiple=32,
                                 image_size=224, epochs=10)
    sides = [wide.size_at(e) for e in range(11)]
    assert sides == sorted(sides) and sides[0] == 128 and sides[-1] == 256
    assert all(side % 32 == 0 for side in sides) and len(set(sides)) == 5  # bounded: 128, 160, ..., 256
    assert ramp_size(5, start_epoch=0, end_epoch=10, start_size=128, end_size=256, multiple=1) == 192


def test_the_ramp_defaults_to_image_size_and_none_is_no_schedule() -> None:
    assert ResolutionSchedule.of("none", image_size=224) is None
    r = ResolutionSchedule.of("ramp", start_epoch=0, end_epoch=4, start_size=64, image_size=96, multiple=16)
    assert (r.size_at(0), r.size_at(4)) == (64, 96)


@pytest.mark.parametrize("args,pattern", [
    (dict(kind="steps", steps=[]), "data.resolution.steps=[] is out of range"),
    (dict(kind="steps", steps=[[1, 128]]), "epochs ascending from 0"),
    (dict(kind="steps", steps=[[0, 128], [3, 224], [2, 288]]), "data.resolution.steps="),
    (dict(kind="steps", steps=[[0, 128], [8, 224]]), "each epoch < epochs (8)"),
    (dict(kind="steps", steps=[[0, 0]]), "pixels >= 1"),
    (dict(kind="ramp", start_epoch=3, end_epoch=3), "data.resolution.end_epoch=3 is out of range"),
    (dict(kind="ramp", start_epoch=0, end_epoch=9), "it must be <= epochs (8)"),
    (dict(kind="ramp", start_epoch=0, end_epoch=4, start_size=16), "data.resolution.start_size=16 is out of range"),
    (dict(kind="ramp", start_epoch=0, end_epoch=4, multiple=0), "data.resolution.multiple=0 is out of range"),
])
def test_bad_schedules_are_one_clear_error(args: dict[str, Any], pattern: str) -> None:
    with pytest.raises(ConfigError) as err:
        ResolutionSchedule.of(image_size=224, epochs=8, **args)
    assert pattern in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("override,pattern", [
    ("data.resolution.schedule=steps", "data.resolution.steps=[] is out of range"),
    ("data.resolution.eval_size=0", "data.resolution.eval_size=0 is out of range"),
    ("data.resolution.steps=[[0,16]]", "is set but data.resolution.schedule=none"),
    ("data.resolution.schedule=fast", "data.resolution.schedule"),
])
def test_bad_settings_stop_at_compose_time_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                       override: str, pattern: str) -> None:
    run = tmp_path / "run"
    assert main(["debug=smoke", "progress=false", f"run_dir={run}", override]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("largebatch: error:") and "\n" not in err and "Traceback" not in err
    assert pattern in err, err
    assert not run.exists()
