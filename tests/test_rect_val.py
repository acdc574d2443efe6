"""Rectangular validation (``data.resolution.rect_val``): the batch shapes' arithmetic, batches that
follow the sorted aspect ratios, every image once over 1, 2 and 4 ranks, a real CLI run counting
the same images as without, and the one-line refusals where it cannot work."""

from __future__ import annotations

import functools
import json
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from PIL import Image

from largebatch.cli import main
from largebatch.data.augment import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from largebatch.data.build import build_run_loaders
from largebatch.data.contract import LoaderSpec
from largebatch.data.pipelines import torchvision as tv
from largebatch.data.rect_val import aspect_ratios, plan_rect_batches, rect_shape
from largebatch.data.samplers import ExactShardSampler
from largebatch.engine.resume import check_same_run
from largebatch.errors import CheckpointError, UsageError, exit_code
from tests.smoke import smoke

# (width, height) of the val images, two classes alternating: portrait, square and landscape,
# out of order on disk. 11 images in batches of 4: 3 batches, the last one short.
VAL_SIZES = [(60, 30), (20, 40), (32, 32), (48, 24), (24, 36), (40, 30), (30, 40), (36, 36), (20, 44),
             (50, 25), (33, 30)]
SIDE, BATCH = 16, 4


def _colour(i: int) -> tuple[int, int, int]:
    return (20 * i + 10, 255 - 20 * i, (70 * i) % 256)  # one flat colour per val image: its identity


def _make_root(root: Path, train_per_class: int) -> Path:
    """``train/`` (3 classes of squares) and ``val/`` (:data:`VAL_SIZES`, flat colours, PNG)."""
    for c in range(3):
        (root / "train" / f"c{c}").mkdir(parents=True)
        (root / "val" / f"c{c}").mkdir(parents=True)
        for j in range(train_per_class):
            Image.new("RGB", (24 + 4 * j, 24), (80 * c, 40 * j, 100)).save(root / "train" / f"c{c}" / f"{j}.png")
    for i, size in enumerate(VAL_SIZES):
        Image.new("RGB", size, _colour(i)).save(root / "val" / f"c{i % 3}" / f"{i:02d}.png")
    return root


@pytest.fixture(scope="module")
def image_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _make_root(tmp_path_factory.mktemp("rect") / "ds", train_per_class=8)  # a batch of 4 on each of 4 ranks


def _spec(**kw: Any) -> LoaderSpec:
    return LoaderSpec(**{"image_size": SIDE, "batch_size": BATCH, "workers": 0, "rect_val": True, **kw})


def _identities(images: torch.Tensor) -> list[tuple[int, int, int]]:
    """Each image's flat colour back from the normalised batch (the crop of a flat image is flat)."""
    mean, std = torch.tensor(IMAGENET_DEFAULT_MEAN).view(1, 3, 1, 1), torch.tensor(IMAGENET_DEFAULT_STD).view(1, 3, 1, 1)
    pixels = ((images * std + mean) * 255).round()
    assert (pixels == pixels[:, :, :1, :1]).all()
    return [tuple(int(v) for v in p[:, 0, 0]) for p in pixels]


def _expected_batches() -> list[tuple[tuple[int, int], list[int]]]:
    """The batches worked out here: images sorted by width / height (ties by their place in the data
    set: class folder, then name), cut into 4s, each one shape."""
    order = sorted(range(len(VAL_SIZES)), key=lambda i: (VAL_SIZES[i][0] / VAL_SIZES[i][1], i % 3, i))
    out = []
    for b in range(0, len(order), BATCH):
        chunk = order[b:b + BATCH]
        mean = sum(VAL_SIZES[i][0] / VAL_SIZES[i][1] for i in chunk) / len(chunk)
        long_side = max(SIDE, int(SIDE * max(mean, 1 / mean)) // 8 * 8)
        out.append(((SIDE, long_side) if mean >= 1 else (long_side, SIDE), chunk))
    return out


# ---------------------------------------------------------------------------------------
# the arithmetic


def test_the_short_side_is_the_evaluation_side_and_the_long_one_a_multiple_of_8() -> None:
    assert rect_shape(1.5, 224) == (224, 336)
    assert rect_shape(4 / 3, 224) == (224, 296)  # 298.7 rounded down to 8, as fast.ai's CropArTfm
    assert rect_shape(3 / 4, 224) == (296, 224)  # portrait: taller
    assert rect_shape(1.0, 224) == (224, 224) and rect_shape(1.02, 20) == (20, 20)  # never below the side


def test_the_plan_sorts_by_ratio_ties_by_index_and_shapes_each_batch() -> None:
    plan = plan_rect_batches([2.0, 0.5, 1.0, 0.5, 2.0], batch_size=2, side=16)
    assert plan.order == (1, 3, 2, 0, 4)
    assert plan.shapes == ((32, 16), (16, 24), (16, 32))  # ratios 0.5 | 1.0, 2.0 (mean 1.5) | 2.0
    assert plan.shape_by_index() == [(16, 24), (32, 16), (16, 24), (32, 16), (16, 32)]


def test_the_ratios_are_read_from_the_headers_once(image_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    paths = sorted(str(p) for p in (image_root / "val").rglob("*.png"))
    ratios = aspect_ratios(image_root / "val", paths)
    assert ratios == tuple(VAL_SIZES[int(Path(p).stem)][0] / VAL_SIZES[int(Path(p).stem)][1] for p in paths)
    monkeypatch.setattr("largebatch.data.rect_val.read_aspect_ratio", lambda p: pytest.fail("read again"))
    assert aspect_ratios(image_root / "val", paths) == ratios


def test_ranks_read_whole_batches_of_the_order_and_may_get_none() -> None:
    parts = [list(ExactShardSampler(5, rank=r, world_size=4, order=[4, 3, 2, 1, 0], whole_batches=2))
             for r in range(4)]
    assert parts == [[4, 3], [2, 1], [0], []]
    assert [len(ExactShardSampler(9, rank=r, world_size=2, whole_batches=4)) for r in range(2)] == [8, 1]


def test_a_resume_may_turn_it_on_or_off(tmp_path: Path) -> None:
    """It changes the evaluation only (fast.ai turned it on for the last phase); a checkpoint from
    before the key resumes too. Another evaluation side is still another run."""
    before = {"data": {"resolution": {"schedule": "none", "eval_size": None}}}
    now = {"data": {"resolution": {"schedule": "none", "eval_size": None, "rect_val": True}}}
    check_same_run(before, now, tmp_path)
    check_same_run(now, {"data": {"resolution": {**now["data"]["resolution"], "rect_val_from_epoch": 37}}}, tmp_path)
    with pytest.raises(CheckpointError, match="data.resolution.eval_size"):
        check_same_run(before, {"data": {"resolution": {**now["data"]["resolution"], "eval_size": 288}}}, tmp_path)


# ---------------------------------------------------------------------------------------
# the torchvision loader


def test_the_batches_follow_the_sorted_aspect_ratios(image_root: Path) -> None:
    _, val, _ = tv.build_loaders(image_root, _spec())
    batches = list(val)
    expected = _expected_batches()
    assert [tuple(x.shape[-2:]) for x, _ in batches] == [shape for shape, _ in expected]
    assert [s for s, _ in expected] == [(24, 16), (16, 16), (16, 32)]  # portrait, square, landscape
    assert [_identities(x) for x, _ in batches] == [[_colour(i) for i in chunk] for _, chunk in expected]
    assert [y.tolist() for _, y in batches] == [[i % 3 for i in chunk] for _, chunk in expected]


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_every_image_once_over_the_ranks(image_root: Path, world_size: int) -> None:
    seen: list[tuple[int, int, int]] = []
    shapes: list[tuple[int, int]] = []
    for rank in range(world_size):
        _, val, _ = tv.build_loaders(image_root, _spec(rank=rank, world_size=world_size,
                                                       workers=2 if world_size == 2 else 0))
        rank_batches = list(val)
        assert len(rank_batches) == len(val)
        for x, _ in rank_batches:
            seen += _identities(x)
            shapes.append(tuple(x.shape[-2:]))
    assert sorted(seen) == sorted(_colour(i) for i in range(len(VAL_SIZES)))  # each once, none twice
    assert shapes == [shape for shape, _ in _expected_batches()]  # whole batches, in order over the ranks


@pytest.mark.parametrize("workers", [0, 2])
def test_from_an_epoch_on_rectangles_and_squares_before(image_root: Path, workers: int) -> None:
    """``rect_val_from_epoch=2`` (fast.ai: its last phase only): the evaluations after epochs 0
    and 1 are centre squares in the data set's order, from epoch 2 on the rectangles of the
    sorted ratios; the epoch reaches persistent workers with each key, and may go back."""
    _, val, _ = tv.build_loaders(image_root, _spec(rect_val_from_epoch=2, workers=workers))
    expected = _expected_batches()
    for epoch in (0, 1, 2, 3, 0, 2):
        val.set_epoch(epoch)
        batches = list(val)
        assert len(batches) == len(val) == 3
        if epoch < 2:
            assert {tuple(x.shape[-2:]) for x, _ in batches} == {(SIDE, SIDE)}, epoch
            assert [y.tolist() for _, y in batches] == [[0] * 4, [1] * 4, [2] * 3]  # class folders in order
        else:
            assert [tuple(x.shape[-2:]) for x, _ in batches] == [shape for shape, _ in expected], epoch
            assert [_identities(x) for x, _ in batches] == [[_colour(i) for i in chunk] for _, chunk in expected]


def test_rectangles_at_each_epochs_training_side(image_root: Path) -> None:
    """With ``eval_follows_train`` the rectangles' short side is the epoch's training side."""
    from largebatch.resolution import ResolutionSchedule

    sizes = ResolutionSchedule.of("steps", steps=[[0, 8], [1, SIDE]], image_size=SIDE, epochs=3)
    _, val, _ = tv.build_loaders(image_root, _spec(train_sizes=sizes, eval_follows_train=True, rect_val_from_epoch=1))
    val.set_epoch(0)
    assert {tuple(x.shape[-2:]) for x, _ in val} == {(8, 8)}
    val.set_epoch(1)
    assert [tuple(x.shape[-2:]) for x, _ in val] == [shape for shape, _ in _expected_batches()]


def test_off_every_val_batch_is_square(image_root: Path) -> None:
    _, val, _ = tv.build_loaders(image_root, replace(_spec(), rect_val=False))
    assert {tuple(x.shape[-2:]) for x, _ in val} == {(SIDE, SIDE)}


# ---------------------------------------------------------------------------------------
# a real run, and where it cannot work


@pytest.fixture()
def val_shapes(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """The (H, W) of every val batch the torchvision loader stacks (workers=0: in this process)."""
    seen: list[tuple[int, int]] = []
    real = tv.collate_skipping

    def recording(batch: Any, *, refill: bool) -> Any:
        out = real(batch, refill=refill)
        if not refill and out[0] is not None:
            seen.append(tuple(out[0].shape[-2:]))
        return out

    monkeypatch.setattr(tv, "collate_skipping", functools.wraps(real)(recording))
    return seen


def _evaluated(run: Path) -> list[int]:
    records = map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
    return [r["total"] for r in records if r["kind"] == "eval"]


def test_a_run_evaluates_the_same_images_in_rectangles(tmp_path: Path, val_shapes: list[tuple[int, int]]) -> None:
    root = _make_root(tmp_path / "ds", train_per_class=2)  # one training step of 4
    base = smoke(f"data.root={root}", "data.loader=torchvision", "epochs=1",
                 "global_batch_size=4")  # val batches of the per-device batch, 4
    assert main([*base, f"run_dir={tmp_path / 'square'}"]) == 0
    assert set(val_shapes) == {(SIDE, SIDE)}
    val_shapes.clear()
    assert main([*base, "data.resolution.rect_val=true", f"run_dir={tmp_path / 'rect'}"]) == 0
    assert val_shapes == [shape for shape, _ in _expected_batches()]
    assert _evaluated(tmp_path / "rect") == _evaluated(tmp_path / "square") == [len(VAL_SIZES)]
    assert "a rectangle per batch of like aspect ratio (rect_val)" in (tmp_path / "rect" / "train.log").read_text()


def test_a_run_evaluates_in_rectangles_from_an_epoch_on(tmp_path: Path, val_shapes: list[tuple[int, int]]) -> None:
    root = _make_root(tmp_path / "ds", train_per_class=2)
    base = smoke(f"data.root={root}", "data.loader=torchvision", "epochs=3", "global_batch_size=4")
    assert main([*base, "data.resolution.rect_val=true", "data.resolution.rect_val_from_epoch=2",
                 f"run_dir={tmp_path / 'run'}"]) == 0
    rectangles = [shape for shape, _ in _expected_batches()]
    assert val_shapes == [(SIDE, SIDE)] * 3 * 2 + rectangles  # after epochs 0 and 1: squares; after 2: rectangles
    assert _evaluated(tmp_path / "run") == [len(VAL_SIZES)] * 3
    assert "(rect_val) from epoch 2" in (tmp_path / "run" / "train.log").read_text()


@pytest.mark.parametrize("override,pattern", [
    ("data.loader=nvjpeg", "not data.loader=nvjpeg: set data.loader=torchvision"),
    ("data.loader=dali", "not data.loader=dali: set data.loader=torchvision"),
    ("data.shards=/nowhere", "drop data.shards and set data.loader=torchvision"),
    ("backend=xla", "each validation batch shape would compile a graph of its own"),
])
def test_where_it_cannot_work_the_config_is_refused_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                                override: str, pattern: str) -> None:
    run = tmp_path / "run"
    assert main(["debug=smoke", "progress=false", f"run_dir={run}", "data.resolution.rect_val=true", override]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("largebatch: error: data.resolution.rect_val=true") and "\n" not in err, err
    assert pattern in err, err
    assert not run.exists()


def _backend(name: str) -> Any:
    return SimpleNamespace(name=name, is_main=True, broadcast_object=lambda obj: obj)


@pytest.mark.parametrize("backend,device,pattern", [
    ("cuda", "cuda:0", "data.loader=auto reads with nvjpeg here: set data.loader=torchvision"),
    ("xla", "cpu", "cannot run on the xla backend"),
])
def test_what_is_known_only_when_the_loaders_are_built_is_refused_there(
        image_root: Path, backend: str, device: str, pattern: str) -> None:
    with pytest.raises(UsageError) as err:
        build_run_loaders(image_root, _spec(device=torch.device(device)), loader="auto", shards=None,
                          backend=_backend(backend))
    assert pattern in str(err.value) and "\n" not in str(err.value) and exit_code(err.value) == 2
