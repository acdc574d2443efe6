"""Progressive resizing (``data.resolution``): the schedule's arithmetic, its checks, real
CPU runs whose training batches have each epoch's scheduled side, after a resume too, and every
other loader (nvjpeg, DALI over files and over packed shards) at the same sides."""

from __future__ import annotations

import dataclasses
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
from largebatch.resolution import ResolutionSchedule, check_crop_scale_steps, min_scale_at, ramp_size
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


def test_a_crop_scale_per_phase_holds_from_its_epoch_on() -> None:
    from largebatch.data.contract import LoaderSpec

    steps = check_crop_scale_steps([[2.0, 0.5], [4, 0.25]], max_scale=1.0, epochs=6)  # the config's floats
    assert steps == ((2, 0.5), (4, 0.25))
    assert [min_scale_at(steps, e, 0.08) for e in range(6)] == [0.08, 0.08, 0.5, 0.5, 0.25, 0.25]
    spec = LoaderSpec(image_size=16, batch_size=1, workers=0, crop_scale=(0.1, 0.9), crop_scale_steps=steps)
    assert [spec.crop_scale_at(e) for e in (0, 2, 5)] == [(0.1, 0.9), (0.5, 0.9), (0.25, 0.9)]


@pytest.mark.parametrize("steps,pattern", [
    ([[0, 0.0]], "0 < min_scale <= data.crop_scale[1] (1.0)"),
    ([[0, 1.5]], "0 < min_scale"),
    ([[3, 0.5], [2, 0.6]], "epochs ascending"),
    ([[-1, 0.5]], "epochs ascending from >= 0"),
    ([[1.5, 0.5]], "[[epoch, min_scale], ...]"),
    ([[8, 0.5]], "each epoch < epochs (8)"),
    ([[1, 0.5, 2]], "[[epoch, min_scale], ...]"),
])
def test_bad_crop_scale_steps_are_one_clear_error(steps: list, pattern: str) -> None:
    with pytest.raises(ConfigError) as err:
        check_crop_scale_steps(steps, max_scale=1.0, epochs=8)
    msg = str(err.value)
    assert msg.startswith("data.resolution.crop_scale_steps=") and pattern in msg and "\n" not in msg, msg


@pytest.mark.parametrize("override,pattern", [
    ("data.resolution.schedule=steps", "data.resolution.steps=[] is out of range"),
    ("data.resolution.eval_size=0", "data.resolution.eval_size=0 is out of range"),
    ("data.resolution.steps=[[0,16]]", "is set but data.resolution.schedule=none"),
    ("data.resolution.schedule=fast", "data.resolution.schedule"),
    ("data.resolution.crop_scale_steps=[[1,0.9]]", "data.resolution.crop_scale_steps=[[1, 0.9]] is out of range: "
                                                   "it must be [[epoch, min_scale], ...] with epochs ascending from >= 0 "
                                                   "and 0 < min_scale <= data.crop_scale[1] (0.5)"),
    ("data.resolution.crop_scale_steps=[[9,0.5]]", "each epoch < epochs (2)"),
    ("data.resolution.eval_follows_train=true data.resolution.eval_size=28",
     "both set the evaluation side: set data.resolution.eval_size=null"),
    ("data.resolution.rect_val_from_epoch=1", "data.resolution.rect_val_from_epoch=1 is set but "
                                              "data.resolution.rect_val=false: set data.resolution.rect_val=true"),
    ("data.resolution.rect_val=true data.resolution.rect_val_from_epoch=2",
     "data.resolution.rect_val_from_epoch=2 is out of range: it must be an integer >= 0 and < epochs (2)"),
])
def test_bad_settings_stop_at_compose_time_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                       override: str, pattern: str) -> None:
    run = tmp_path / "run"
    crop = ["data.crop_scale=[0.08,0.5]"] if "crop_scale_steps=[[1," in override else []
    assert main(["debug=smoke", "progress=false", f"run_dir={run}", "epochs=2", *crop, *override.split()]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("largebatch: error:") and "\n" not in err and "Traceback" not in err
    assert pattern in err, err
    assert not run.exists()


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


# 4 steps per epoch (tests/smoke.py), 3 epochs: 16 px, then 24, then 32 (the set's images are 36 px);
# read by the torchvision loader, whose batches `sides` records (the decoded store's schedule:
# tests/test_decoded_loader.py)
TV = "data.loader=torchvision"
STEPS = ["epochs=3", "data.resolution.schedule=steps", "data.resolution.steps=[[0,16],[1,24],[2,32]]", TV]


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
    assert "longest side of the images" not in log  # 32 px crops of 36 px images: no warning (issue 75)


def test_the_ramp_in_a_real_run(tmp_path: Path, sides: dict[str, list[int]]) -> None:
    """16 -> 32 px over epochs 0..2 in multiples of 8: 16, 24, 32."""
    ramp = ["epochs=3", "data.resolution.schedule=ramp", "data.resolution.start_epoch=0",
            "data.resolution.end_epoch=2", "data.resolution.start_size=16", "data.resolution.end_size=32",
            "data.resolution.multiple=8", TV]
    assert main(smoke(*ramp, f"run_dir={tmp_path / 'run'}")) == 0
    assert sides["train"] == [16] * 4 + [24] * 4 + [32] * 4
    assert set(sides["val"]) == {16}  # eval_size null: data.image_size, as without a schedule


def test_off_by_default_every_batch_at_image_size(tmp_path: Path, sides: dict[str, list[int]]) -> None:
    run = tmp_path / "run"
    assert main(smoke("epochs=3", TV, f"run_dir={run}")) == 0
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
    with pytest.raises(Exception, match="made with data.resolution.schedule=none, this run has data.resolution.schedule=steps"):
        check_same_run(old, now, tmp_path / "ckpt.pt")


# ---------------------------------------------------------------------------------------
# the other loaders: nvjpeg (decode on the CPU here), decoded, DALI over files and over packed shards

SCHEDULES = {
    "steps": ResolutionSchedule.of("steps", steps=[[0, 16], [1, 24], [2, 32]], image_size=16, epochs=3),
    "ramp": ResolutionSchedule.of("ramp", start_epoch=0, end_epoch=2, start_size=16, end_size=32, multiple=8,
                                  image_size=16, epochs=3),
}
LOADERS = ["nvjpeg", "decoded", "dali", "shards"]


@pytest.fixture(scope="module")
def image_set(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """2 classes x 8 train / 2 val images of 36 px, checked, and its packed shards."""
    from largebatch.data.check import check_dataset
    from largebatch.data.synthetic import make_synthetic_imagenet

    base = tmp_path_factory.mktemp("resizing")
    root = make_synthetic_imagenet(base / "set", num_classes=2, train_per_class=8, val_per_class=2, image_size=36)
    out = {"root": root}
    if _have_dali():
        from largebatch.tools.make_shards import main as make_shards

        assert check_dataset(root, workers=1).ok
        assert make_shards([str(root), str(base / "shards"), "--shard-size", "4", "--workers", "1"]) == 0
        out["shards"] = base / "shards"
    return out


def _have_dali() -> bool:
    from largebatch.data.pipelines.dali_graph import dali_available

    return dali_available()


def _build(loader: str, image_set: dict[str, Path], spec: Any) -> tuple[Any, Any]:
    if loader == "torchvision":
        return tv.build_loaders(image_set["root"], spec)[:2]
    if loader == "nvjpeg":
        from largebatch.data.pipelines.nvjpeg import build_nvjpeg_loaders

        return build_nvjpeg_loaders(image_set["root"], spec, prefetch_batches=0)[:2]
    if loader == "decoded":
        from largebatch.data.pipelines.decoded import build_decoded_loaders

        return build_decoded_loaders(image_set["root"], spec, cache=image_set["root"].parent / "decoded")[:2]
    if not _have_dali():
        pytest.skip("NVIDIA DALI is not installed")
    if loader == "dali":
        from largebatch.data.pipelines.dali_files import build_dali_loaders

        return build_dali_loaders(image_set["root"], spec)[:2]
    from largebatch.data.pipelines.dali_shards import build_dali_shard_loaders

    return build_dali_shard_loaders(image_set["shards"], spec)[:2]


def _spec(schedule: ResolutionSchedule, **kw: Any) -> Any:
    from largebatch.data.contract import LoaderSpec

    return LoaderSpec(image_size=16, batch_size=4, workers=1, seed=3, train_sizes=schedule, eval_size=28, **kw)


def _pass(loader: Any, epoch: int, skip: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    loader.set_epoch(epoch, skip_batches=skip)
    return [(images.clone(), labels.clone()) for images, labels in loader]


@pytest.mark.parametrize("kind", sorted(SCHEDULES))
@pytest.mark.parametrize("loader", LOADERS)
def test_every_loader_crops_each_epochs_side_and_the_evaluation_side(image_set: dict[str, Path], loader: str,
                                                                    kind: str) -> None:
    schedule = SCHEDULES[kind]
    train, val = _build(loader, image_set, _spec(schedule))
    try:
        for epoch in range(3):
            batches = _pass(train, epoch)
            assert len(batches) == len(train) == 4
            side = schedule.size_at(epoch)
            assert {tuple(images.shape) for images, _ in batches} == {(4, 3, side, side)}, (epoch, side)
        assert [schedule.size_at(e) for e in range(3)] == [16, 24, 32]
        evaluated = _pass(val, 0)
        assert evaluated and {images.shape[-2:] for images, _ in evaluated} == {torch.Size([28, 28])}
        assert sum(len(labels) for _, labels in evaluated) == 4
    finally:
        train.close()
        val.close()


@pytest.mark.parametrize("loader", LOADERS)
def test_a_resume_inside_an_epoch_reads_the_uninterrupted_batches(image_set: dict[str, Path], loader: str) -> None:
    """Epoch 1 (24 px) read whole after epoch 0, and by a fresh loader (a resumed process) from
    its third batch: the same batches. nvjpeg (crops keyed by seed, epoch, index) and the shard
    pipeline (built per epoch) give the same bits. DALI over files gives the same files at the
    same side; its crops come from one random stream that runs on across epochs (the crops
    after a resume differ, docs/checkpoints.md), so there the crop is the whole image
    (crop_scale 1) and the pixels are compared up to the random flip."""
    spec = _spec(SCHEDULES["steps"], crop_scale=(1.0, 1.0) if loader == "dali" else (0.08, 1.0))
    straight = _build(loader, image_set, spec)[0]
    _pass(straight, 0)
    whole = _pass(straight, 1)
    resumed_loader = _build(loader, image_set, spec)[0]
    resumed = _pass(resumed_loader, 1, skip=2)
    straight.close()
    resumed_loader.close()
    assert len(whole) == 4 and len(resumed) == 2
    assert not torch.equal(whole[0][0], resumed[0][0])  # not the epoch's start again
    for (a, la), (b, lb) in zip(whole[2:], resumed):
        assert a.shape[-1] == b.shape[-1] == 24 and torch.equal(la, lb)
        if loader == "dali":
            a, b = a + a.flip(-1), b + b.flip(-1)  # the flip's random stream is not the same
        assert torch.equal(a, b)


def test_a_dali_run_follows_the_schedule_and_the_evaluation_side(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A real CLI run with data.loader=dali (the embedded set, checked on first use, decoded on
    the CPU): every training batch has its epoch's side, every evaluation batch 28 px."""
    if not _have_dali():
        pytest.skip("NVIDIA DALI is not installed")
    from largebatch.data.pipelines import dali_files

    seen: list[int] = []
    real = dali_files._to_batch

    def recording(out: Any, layout: str) -> Any:
        images, labels = real(out, layout)
        seen.append(int(images.shape[-1]))
        return images, labels

    monkeypatch.setattr(dali_files, "_to_batch", recording)
    run = tmp_path / "run"
    assert main(smoke(*STEPS, "data.loader=dali", "data.resolution.eval_size=28", f"run_dir={run}")) == 0
    assert [side for side in seen if side != 28] == [16] * 4 + [24] * 4 + [32] * 4
    assert 28 in seen
    log = (run / "train.log").read_text()
    assert "input pipeline: DALI" in log
    assert "resolution: training crops steps 16 px from epoch 0, 24 px from epoch 1, 32 px from epoch 2; " \
           "evaluation crops 28 px" in log
    assert [(r["epoch"], r["image_size"]) for r in _epoch_records(run)] == [(1, 16), (2, 24), (3, 32)]


# ---------------------------------------------------------------------------------------
# a crop scale per phase, and evaluation at each epoch's training side (fast.ai 2018)


def _symmetric(images: torch.Tensor) -> torch.Tensor:
    return images + images.flip(-1)  # the same whichever way each image was flipped


@pytest.mark.parametrize("loader", ["torchvision", *LOADERS])
def test_every_loader_takes_each_phases_crop_scale(image_set: dict[str, Path], loader: str) -> None:
    """From epoch 1 the crop area is 1.0 (``crop_scale_steps=[[1, 1.0]]``): the whole (square)
    image, the same pixels (up to each image's flip) as a loader whose crop_scale is (1, 1)
    throughout; epoch 0 still draws crops of 8%..100% of the image."""
    phased = _build(loader, image_set, _spec(SCHEDULES["steps"], crop_scale_steps=((1, 1.0),)))[0]
    whole = _build(loader, image_set, _spec(SCHEDULES["steps"], crop_scale=(1.0, 1.0)))[0]
    try:
        first, first_whole = _pass(phased, 0), _pass(whole, 0)
        second, second_whole = _pass(phased, 1), _pass(whole, 1)
    finally:
        phased.close()
        whole.close()
    assert len(second) == len(second_whole) == 4
    for (a, la), (b, lb) in zip(second, second_whole):
        assert a.shape[-1] == 24 and torch.equal(la, lb)
        assert torch.allclose(_symmetric(a), _symmetric(b), atol=1e-5), loader
    assert not all(torch.allclose(_symmetric(a), _symmetric(b), atol=1e-3) for (a, _), (b, _) in zip(first, first_whole))


def test_the_torchvision_crops_sample_each_phases_area(image_set: dict[str, Path], monkeypatch: pytest.MonkeyPatch
                                                        ) -> None:
    """The transform's own parameters and the boxes it draws: area 0.08..1 in epoch 0, 0.5..1 from
    epoch 1 (``crop_scale_steps=[[1, 0.5]]``, fast.ai's last phase), in this process (workers=0)."""
    from torchvision.transforms import v2

    areas: list[float] = []
    real = v2.RandomResizedCrop.make_params

    def recording(self: Any, flat_inputs: list[Any]) -> dict[str, Any]:
        params = real(self, flat_inputs)
        height, width = flat_inputs[0].size[::-1]
        areas.append(params["height"] * params["width"] / (height * width))
        return params

    monkeypatch.setattr(v2.RandomResizedCrop, "make_params", recording)
    spec = dataclasses.replace(_spec(SCHEDULES["steps"], crop_scale_steps=((1, 0.5),)), workers=0)
    train = tv.build_loaders(image_set["root"], spec)[0]
    assert [train.dataset.epoch_transforms.at(e).transforms[0].scale for e in range(3)] == [
        (0.08, 1.0), (0.5, 1.0), (0.5, 1.0)]
    by_epoch = []
    for epoch in range(3):
        areas.clear()
        _pass(train, epoch)
        by_epoch.append(list(areas))
    assert all(len(a) == 16 for a in by_epoch)
    assert min(by_epoch[0]) < 0.4  # 8%..100%
    assert min(by_epoch[1] + by_epoch[2]) >= 0.5 - 0.05  # 50%..100% (the box's sides are rounded)


@pytest.mark.parametrize("loader", ["torchvision", *LOADERS])
def test_every_loader_evaluates_at_each_epochs_training_side(image_set: dict[str, Path], loader: str) -> None:
    """``eval_follows_train`` (``data.resolution.eval_follows_train``): the evaluation after epoch e
    crops ``size_at(e)``, the epoch the val loader's ``set_epoch`` names, back and forth."""
    from largebatch.data.contract import LoaderSpec

    spec = LoaderSpec(image_size=16, batch_size=4, workers=1, seed=3, train_sizes=SCHEDULES["steps"],
                      eval_follows_train=True)
    val = _build(loader, image_set, spec)[1]
    try:
        for epoch in (0, 1, 2, 0, 2):
            evaluated = _pass(val, epoch)
            side = SCHEDULES["steps"].size_at(epoch)
            assert {tuple(images.shape[-2:]) for images, _ in evaluated} == {(side, side)}, (loader, epoch)
            assert sum(len(labels) for _, labels in evaluated) == 4
    finally:
        val.close()


def test_a_run_evaluates_each_epoch_at_its_training_side(tmp_path: Path, sides: dict[str, list[int]]) -> None:
    run = tmp_path / "run"
    assert main(smoke(*STEPS, "data.resolution.eval_follows_train=true", "data.resolution.crop_scale_steps=[[2,0.5]]",
                      f"run_dir={run}")) == 0
    assert sides["train"] == [16] * 4 + [24] * 4 + [32] * 4
    assert sides["val"] == [16, 24, 32]  # 8 val images, one batch of the per-device batch (8) after each epoch
    log = (run / "train.log").read_text()
    assert ("resolution: training crops steps 16 px from epoch 0, 24 px from epoch 1, 32 px from epoch 2; crop area "
            "0.5..1 from epoch 2; evaluation crops at each epoch's training side") in log


def test_a_resume_with_another_crop_scale_or_evaluation_side_is_refused(tmp_path: Path) -> None:
    """Like the other resolution keys, what is trained or reported: another run. A checkpoint from
    before the keys ran without them (and resumes with them off)."""
    from largebatch.engine.resume import check_same_run
    from largebatch.errors import CheckpointError

    off = {"schedule": "steps", "eval_size": None, "crop_scale_steps": [], "eval_follows_train": False,
           "rect_val_from_epoch": 0}
    before_the_keys = {"data": {"resolution": {"schedule": "steps", "eval_size": None}}}
    check_same_run(before_the_keys, {"data": {"resolution": off}}, tmp_path)
    for key, value in (("crop_scale_steps", [[37.0, 0.5]]), ("eval_follows_train", True)):
        now = {"data": {"resolution": {**off, key: value}}}
        for saved in (before_the_keys, {"data": {"resolution": off}}):
            with pytest.raises(CheckpointError, match=f"data.resolution.{key}"):
                check_same_run(saved, now, tmp_path)


def test_each_resolution_option_keeps_its_config_name_in_the_loader_spec() -> None:
    """A ``data.resolution`` key reaches the loaders under its own name (issue 71): a loader's
    author reads ``spec.eval_size`` for ``data.resolution.eval_size``. Only the schedule's own keys
    become one object, ``train_sizes``."""
    from largebatch.config import compose_config, to_train_config
    from largebatch.data.contract import LoaderSpec
    from largebatch.parts.data import resolution_options

    cfg = to_train_config(compose_config(["data.resolution.schedule=steps", "data.resolution.steps=[[0,16],[1,24]]",
                                          "data.resolution.eval_size=28"]))
    options = resolution_options(cfg)
    spec_fields = {f.name for f in dataclasses.fields(LoaderSpec)}
    config_keys = {f.name for f in dataclasses.fields(type(cfg.data.resolution))}
    assert set(options) <= spec_fields
    assert set(options) - {"train_sizes"} <= config_keys, set(options) - config_keys
    assert options["eval_size"] == 28 and options["train_sizes"] is not None
