"""The generated ImageNet-style data set: layout, determinism, oddities, cache, CLI."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from PIL import Image

from largebatch.data.synthetic import (
    MANIFEST_NAME,
    check_args,
    default_dataset_root,
    ensure_synthetic,
    make_synthetic_imagenet,
    oddity_positions,
)
from largebatch.errors import UsageError
from largebatch.tools.make_synthetic import main

SMALL = dict(num_classes=3, train_per_class=4, val_per_class=2, image_size=24)


def _digest(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*.JPEG"))
    }


@pytest.fixture(scope="module")
def small_set(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_synthetic_imagenet(tmp_path_factory.mktemp("syn") / "ds", **SMALL)


def test_layout_and_counts(small_set: Path) -> None:
    for split, per in (("train", 4), ("val", 2)):
        classes = sorted(p.name for p in (small_set / split).iterdir())
        assert classes == ["n0000", "n0001", "n0002"]
        for c in classes:
            assert len(list((small_set / split / c).glob("*.JPEG"))) == per
    manifest = json.loads((small_set / MANIFEST_NAME).read_text())
    assert manifest["counts"] == {"train": 12, "val": 6}
    assert manifest["spec"]["num_classes"] == 3


def test_same_args_same_bytes_other_seed_other_bytes(small_set: Path, tmp_path: Path) -> None:
    again = make_synthetic_imagenet(tmp_path / "again", workers=2, **SMALL)
    assert _digest(again) == _digest(small_set)
    other = make_synthetic_imagenet(tmp_path / "other", seed=1, **SMALL)
    a, b = _digest(small_set), _digest(other)
    assert a.keys() == b.keys() and all(a[k] != b[k] for k in a)


def test_second_call_returns_at_once_and_other_args_fail(small_set: Path) -> None:
    before = _digest(small_set)
    assert make_synthetic_imagenet(small_set, **SMALL) == small_set
    assert _digest(small_set) == before
    with pytest.raises(ValueError, match="other arguments"):
        make_synthetic_imagenet(small_set, **{**SMALL, "seed": 5})


def test_foreign_folder_is_refused(tmp_path: Path) -> None:
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "mine.txt").write_text("keep me")
    with pytest.raises(ValueError, match="not a largebatch synthetic"):
        make_synthetic_imagenet(tmp_path / "x", **SMALL)
    (tmp_path / "empty").mkdir()  # an empty folder is filled
    assert (make_synthetic_imagenet(tmp_path / "empty", **SMALL) / MANIFEST_NAME).exists()
    assert [p.name for p in tmp_path.iterdir() if ".tmp-" in p.name] == []


def test_oddities_are_in_train(small_set: Path) -> None:
    found = {}
    for (c, i), kind in oddity_positions(3, 4).items():
        path = small_set / "train" / f"n{c:04d}" / f"n{c:04d}_train_{i:06d}.JPEG"
        with Image.open(path) as img:
            found[kind] = found.get(kind, []) + [(img.format, img.mode)]
    assert found == {"L": [("JPEG", "L")] * 3, "CMYK": [("JPEG", "CMYK")], "PNG": [("PNG", "RGB")]}
    for path in (small_set / "val").rglob("*.JPEG"):
        with Image.open(path) as img:
            assert (img.format, img.mode) == ("JPEG", "RGB")


def test_oddity_positions_distinct_and_bounded() -> None:
    assert len(oddity_positions(10, 1300)) == 5
    assert len(oddity_positions(1, 3)) == 3
    for (c, i) in oddity_positions(7, 3):
        assert 0 <= c < 7 and 0 <= i < 3


def test_many_classes_render(tmp_path: Path) -> None:
    root = make_synthetic_imagenet(tmp_path / "ds", num_classes=25, train_per_class=1,
                                   val_per_class=1, image_size=16)
    assert len(list((root / "train").iterdir())) == 25


def test_default_root_uses_cache_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("LARGEBATCH_CACHE", str(tmp_path / "cache"))
    root = default_dataset_root(**SMALL)
    assert root.parent == tmp_path / "cache" and root.name.startswith("synthetic-")
    assert default_dataset_root(**{**SMALL, "seed": 1}) != root
    assert ensure_synthetic(**SMALL) == root and (root / MANIFEST_NAME).exists()


def test_cli_writes_and_reports(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["--root", str(tmp_path / "ds"), "--classes", "2", "--train-per-class", "2",
                 "--val-per-class", "1", "--image-size", "16", "--workers", "0"]) == 0
    out = capsys.readouterr().out
    assert str(tmp_path / "ds") in out and "4 train + 2 val" in out


@pytest.mark.parametrize(("argv", "says"), [
    (["--classes", "0"], "--classes must be in 1..100, got 0"),
    (["--image-size", "4"], "--image-size must be in 16..1024 pixels, got 4"),
    (["--seed", "x"], "argument --seed: invalid int value: 'x'"),
    (["--seed", "-1"], "--seed must be >= 0, got -1"),
    (["--train-per-class", "-1"], "--train-per-class must be >= 1, got -1"),
    (["--val-per-class", "0"], "--val-per-class must be >= 1, got 0"),
    (["--workers", "-1"], "--workers must be >= 0, got -1"),
    (["--bogus"], "unrecognized arguments: --bogus"),
])
def test_cli_bad_arguments_exit_2_one_line_naming_the_flag(argv: list[str], says: str, capsys: pytest.CaptureFixture,
                                                           tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--root", str(tmp_path / "ds"), *argv])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("largebatch-make-synthetic: error: ") and says in err, err
    assert not (tmp_path / "ds").exists()


def test_cli_unwritable_root_is_one_line_exit_74(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    with pytest.raises(SystemExit) as exc:
        main(["--root", str(blocker / "ds"), "--classes", "2", "--train-per-class", "1", "--val-per-class", "1",
              "--image-size", "16", "--workers", "0"])
    assert exc.value.code == 74
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("largebatch-make-synthetic: error: cannot write the data set: "), err


def test_the_class_limit_is_what_the_families_make() -> None:
    """The config's range (largebatch.defaults.MAX_CLASSES) is the generator's: one class per
    (shape family, colour family) pair."""
    from largebatch.data.synthetic import NUM_FAMILIES
    from largebatch.defaults import MAX_CLASSES

    assert MAX_CLASSES == NUM_FAMILIES * NUM_FAMILIES
    check_args(MAX_CLASSES, 1, 1, 16, 0)  # the limit itself is accepted
    with pytest.raises(UsageError, match="num_classes must be in 1..100, got 101"):
        check_args(MAX_CLASSES + 1, 1, 1, 16, 0)

