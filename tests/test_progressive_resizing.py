"""Progressive resizing (``data.resolution``): the schedule's arithmetic, its checks, and real
CPU runs whose training batches have each epoch's scheduled side, after a resume too."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from largebatch.cli import main
from largebatch.data.pipelines import torchvision as tv
from largebatch.engine.checkpoint import list_checkpoints, load_checkpoint
from largebatch.errors import ConfigError
from largebatch.resolution import ResolutionSchedule, ramp_size
from tests.smoke import EXACT, smoke

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


def test_a_pipeline_that_cannot_resize_refuses_the_schedule(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    args = smoke("data.loader=nvjpeg", "data.resolution.eval_size=24", f"run_dir={tmp_path / 'run'}")
    assert main(args) != 0
    err = capsys.readouterr().err.strip()
    assert "read by the torchvision loader only" in err and "\n" not in err, err


# ---------------------------------------------------------------------------------------
# real runs: the side of every batch, recorded where the loader stacks it


@pytest.fixture()
def sides(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[int]]:
    """The side of every train and val batch the torchvision loader stacks (workers=0: in this
    process), recorded around the real :func:`collate_skipping`."""
    seen: dict[str, list[int]] = {"train": [], "val": []}
    real = tv.collate_skipping

    def recording(batch: Any, *, refill: bool) -> Any:
        out = real(batch, refill=refill)
        if out[0] is not None:
            assert out[0].shape[-1] == out[0].shape[-2]
            seen["train" if refill else "val"].append(int(out[0].shape[-1]))
        return out

    monkeypatch.setattr(tv, "collate_skipping", functools.wraps(real)(recording))
    return seen


# 4 steps per epoch (tests/smoke.py), 3 epochs: 16 px, then 24, then 32 (the set's images are 36 px)
STEPS = ["epochs=3", "data.resolution.schedule=steps", "data.resolution.steps=[[0,16],[1,24],[2,32]]"]


def _epoch_records(run: Path) -> list[dict[str, Any]]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == "epoch"]


def test_training_batches_follow_the_steps_and_evaluation_its_own_side(tmp_path: Path,
                                                                     sides: dict[str, list[int]]) -> None:
    run = tmp_path / "run"
    assert main(smoke(*STEPS, "data.resolution.eval_size=28", f"run_dir={run}")) == 0
    assert sides["train"] == [16] * 4 + [24] * 4 + [32] * 4
    assert sides["val"] and set(sides["val"]) == {28}
    assert [(r["epoch"], r["image_size"]) for r in _epoch_records(run)] == [(1, 16), (2, 24), (3, 32)]
    log = (run / "train.log").read_text()
    assert "resolution: training crops steps 16 px from epoch 0, 24 px from epoch 1, 32 px from epoch 2" in log
    assert "epoch 2/3: training crops of 24 px (was 16 px)" in log
    assert "epoch 3/3: training crops of 32 px (was 24 px)" in log


def test_the_ramp_in_a_real_run(tmp_path: Path, sides: dict[str, list[int]]) -> None:
    """16 -> 32 px over epochs 0..2 in multiples of 8: 16, 24, 32."""
    ramp = ["epochs=3", "data.resolution.schedule=ramp", "data.resolution.start_epoch=0",
            "data.resolution.end_epoch=2", "data.resolution.start_size=16", "data.resolution.end_size=32",
            "data.resolution.multiple=8"]
    assert main(smoke(*ramp, f"run_dir={tmp_path / 'run'}")) == 0
    assert sides["train"] == [16] * 4 + [24] * 4 + [32] * 4
    assert set(sides["val"]) == {16}  # eval_size null: data.image_size, as without a schedule


def test_off_by_default_every_batch_at_image_size(tmp_path: Path, sides: dict[str, list[int]]) -> None:
    run = tmp_path / "run"
    assert main(smoke("epochs=3", f"run_dir={run}")) == 0
    assert sides["train"] == [16] * 12 and set(sides["val"]) == {16}
    assert all("image_size" not in r for r in _epoch_records(run))  # the records of before


def _weights(run: Path, step: int) -> dict[str, torch.Tensor]:
    last = load_checkpoint(list_checkpoints(run / "checkpoints")[-1])
    assert last["train_state"]["step"] == step
    return last["model"]


def test_a_resume_inside_a_later_epoch_trains_at_that_epochs_side(tmp_path: Path,
                                                                 sides: dict[str, list[int]]) -> None:
    """Stopped after step 6 (epoch 1, 24 px, half done): the resumed run reads the epoch's last 2
    batches at 24 px, then epoch 2 at 32 px, and ends with the uninterrupted run's weights."""
    exact = [*EXACT, *STEPS]
    straight = tmp_path / "straight"
    assert main([*exact, f"run_dir={straight}"]) == 0
    assert sides["train"] == [16] * 4 + [24] * 4 + [32] * 4
    run = tmp_path / "run"
    assert main([*exact, f"run_dir={run}", "max_steps=6"]) == 0
    assert load_checkpoint(list_checkpoints(run / "checkpoints")[-1])["train_state"]["epoch_step"] == 2
    sides["train"].clear()
    assert main([*exact, f"run_dir={run}", "resume=auto", "max_steps=null"]) == 0
    assert sides["train"] == [24] * 2 + [32] * 4
    a, b = _weights(straight, 12), _weights(run, 12)
    assert [k for k in a if not torch.equal(a[k], b[k])] == []
    lines = (run / "train.log").read_text().splitlines()
    assert any(line.endswith("epoch 2/3: training crops of 24 px") for line in lines)  # the resumed process


def test_persistent_workers_follow_the_schedule_bit_for_bit(tmp_path: Path) -> None:
    """2 persistent loader workers (built once, the side chosen per sample from its epoch)
    train the weights of the in-process run (0 workers), through a mid-epoch resume."""
    exact = [*EXACT, *STEPS]
    in_process = tmp_path / "in_process"
    assert main([*exact, f"run_dir={in_process}"]) == 0
    workers = [a for a in exact if not a.startswith("data.workers=")] + ["data.workers=2"]
    run = tmp_path / "workers"
    assert main([*workers, f"run_dir={run}", "max_steps=7"]) == 0
    assert main([*workers, f"run_dir={run}", "resume=auto", "max_steps=null"]) == 0
    a, b = _weights(in_process, 12), _weights(run, 12)
    assert [k for k in a if not torch.equal(a[k], b[k])] == []


def test_a_resume_with_another_resolution_schedule_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run = tmp_path / "run"
    assert main(smoke(*STEPS, f"run_dir={run}", "max_steps=2")) == 0
    capsys.readouterr()
    other = smoke(*STEPS, "data.resolution.steps=[[0,16],[1,32]]", f"run_dir={run}", "resume=auto")
    assert main(other) != 0
    err = capsys.readouterr().err.strip()
    assert "belongs to another run" in err and "data.resolution.steps=[[0, 16], [1, 32]]" in err and "\n" not in err


def test_a_checkpoint_from_before_the_setting_resumes_with_it_off(tmp_path: Path) -> None:
    """A checkpoint's config without data.resolution trained at data.image_size every epoch."""
    from largebatch.config import compose_config
    from largebatch.engine.resume import check_same_run
    from omegaconf import OmegaConf

    now = OmegaConf.to_container(compose_config(["debug=smoke"]), resolve=True)
    old = json.loads(json.dumps(now, default=str))
    old["data"].pop("resolution")
    now = json.loads(json.dumps(now, default=lambda e: e.value))
    check_same_run(old, now, tmp_path / "ckpt.pt")  # no error
    now["data"]["resolution"]["schedule"] = "steps"
    with pytest.raises(Exception, match="data.resolution.schedule=None"):
        check_same_run(old, now, tmp_path / "ckpt.pt")
