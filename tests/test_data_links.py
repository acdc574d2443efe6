"""Links inside the data folder: every loader and the data check list the same images.

A directory link that loops (``train/a/up -> ..``) used to be followed ~40 levels deep by
torchvision's listing, mislabelling every other class's images as ``a`` without a word. Now
each directory is entered once, a link that loops or leaves its class folder is refused with
one line naming it (exit 2 from the commands), and the legitimate uses of links (a class
folder that is a link, links to files, two links to one folder) keep working.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest

from largebatch.data.contract import LoaderSpec
from largebatch.data.images import list_split
from largebatch.data.pipelines.torchvision import build_loaders
from largebatch.data.pipelines.nvjpeg import build_nvjpeg_loaders
from largebatch.data.synthetic import make_synthetic_imagenet
from largebatch.errors import DataError

ROOT = Path(__file__).resolve().parents[1]
SMALL = dict(num_classes=2, train_per_class=4, val_per_class=2, image_size=32)


def _torchvision(root: Path) -> int:
    train, _, _ = build_loaders(root, LoaderSpec(image_size=24, batch_size=2, workers=0))
    return len(train.dataset)


def _nvjpeg(root: Path) -> int:
    train, _, _ = build_nvjpeg_loaders(root, LoaderSpec(image_size=24, batch_size=2, workers=0, device="cpu"))
    return len(train.dataset)


def _dali_listing(root: Path) -> int:  # what the DALI loaders and largebatch-check-data read
    return len(list_split(root, "train")[1])


LISTINGS: dict[str, Callable[[Path], int]] = {"torchvision": _torchvision, "nvjpeg": _nvjpeg,
                                              "dali-file-list": _dali_listing}


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_synthetic_imagenet(tmp_path_factory.mktemp("links") / "ds", **SMALL)


@pytest.fixture
def data(clean: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(clean, tmp_path / "ds", symlinks=True))


def _classes(root: Path) -> list[Path]:
    return sorted(p for p in (root / "train").iterdir() if p.is_dir())


def _loop_up(root: Path) -> Path:  # the case: train/a/up -> .. (the split folder)
    link = _classes(root)[0] / "up"
    link.symlink_to("..")
    return link


def _loop_inside(root: Path) -> Path:  # train/a/sub/back -> .. (a folder above it, in the class)
    sub = _classes(root)[0] / "sub"
    sub.mkdir()
    (sub / "back").symlink_to("..")
    return sub / "back"


def _other_class(root: Path) -> Path:  # train/a/more -> ../b: b's images labelled a
    a, b = _classes(root)[:2]
    (a / "more").symlink_to(os.path.relpath(b, a))
    return a / "more"


BAD = {"loop-to-split": _loop_up, "loop-inside-class": _loop_inside, "link-to-other-class": _other_class}


@pytest.mark.parametrize("listing", LISTINGS)
@pytest.mark.parametrize("case", BAD)
def test_a_looping_or_escaping_link_is_refused_naming_it(data: Path, case: str, listing: str) -> None:
    link = BAD[case](data)
    with pytest.raises(DataError, match="^" + str(link).replace("+", r"\+") + " links to "):
        LISTINGS[listing](data)


@pytest.mark.parametrize("listing", LISTINGS)
def test_links_users_rely_on_are_followed_once(data: Path, tmp_path: Path, listing: str) -> None:
    expected = LISTINGS[listing](data)
    a, b = _classes(data)[:2]
    # a class folder that is itself a link (a data set assembled from links)
    moved = tmp_path / "elsewhere" / b.name
    shutil.move(str(b), moved)
    b.symlink_to(moved)
    # a folder inside a class reached twice: once as itself, once through a link
    (a / "extra").mkdir()
    first = sorted(a.glob("*.JPEG"))[0]
    shutil.copy(first, a / "extra" / "copy.JPEG")
    (a / "extra-again").symlink_to("extra")
    # a link to a file
    (a / "linked.JPEG").symlink_to(first)
    assert LISTINGS[listing](data) == expected + 2


def test_the_commands_say_one_line_and_exit_2(data: Path, tmp_path: Path) -> None:
    link = _loop_up(data)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    check = subprocess.run([sys.executable, "-m", "largebatch.tools.check_data", str(data)],
                           capture_output=True, text=True, env=env, timeout=300)
    train = subprocess.run([sys.executable, "-m", "largebatch.train", "debug=smoke", "progress=false",
                            f"data.root={data}", f"run_dir={tmp_path / 'run'}"],
                           capture_output=True, text=True, env=env, timeout=300)
    for proc in (check, train):
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2, proc.stderr
        assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
        assert f"{link} links to" in lines[0] and "a folder above it (a loop)" in lines[0]
