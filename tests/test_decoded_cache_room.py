"""A cache with no room, or one that cannot be written (issue 90, item 5), as the commands are
typed: ``data.loader=decoded`` and ``largebatch-make-decoded`` without room end 74 (they ended
2) with the sizes in the unit that fits them (a 55.3 kB store was "needs 0.00 GB"); a read-only
cache is not chosen by ``data.loader=auto`` (it checked free space only, chose the store, and the
run ended 74), which trains with the next loader and says why, and ``--plan`` says so instead of
"(fits)".

Both caches are real tmpfs mounts (32 KiB; read-only); mounting needs CAP_SYS_ADMIN (root in
most containers), without it the tests skip, saying so.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from largebatch.data.synthetic import make_synthetic_imagenet
from tests.smoke import smoke

SETS = smoke("data.synthetic.classes=4")  # 32 train images: a 55.3 kB store at 24 px, 8 val at 18 px


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_synthetic_imagenet(tmp_path_factory.mktemp("data") / "set", num_classes=4, train_per_class=8,
                                   val_per_class=2, image_size=36)


@pytest.fixture()
def mount(tmp_path: Path) -> Iterator[object]:
    """``mount(options)``: a fresh tmpfs mounted with ``options``; all unmounted afterwards."""
    made: list[Path] = []

    def tmpfs(options: str) -> Path:
        where = tmp_path / f"fs{len(made)}"
        where.mkdir()
        if subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)],
                          capture_output=True, check=False).returncode != 0:
            pytest.skip("cannot mount a tmpfs here (needs CAP_SYS_ADMIN); the caches under test need one")
        made.append(where)
        return where

    yield tmpfs
    for where in reversed(made):
        subprocess.run(["umount", "-l", str(where)], capture_output=True, check=False)


def _command(cache: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, timeout=300, check=False,
                          env={**os.environ, "LARGEBATCH_CACHE": str(cache)})


def test_a_cache_with_no_room_is_exit_74_in_the_unit_that_fits(images: Path, mount, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    cache = mount("size=32k")
    want = (f"no room for the decoded store {cache}/decoded-{{}}-train-24px: 32 images at 24 px, 55.3 kB, and "
            f"{cache} has 32.8 kB free; free space, lower the side, or set LARGEBATCH_CACHE to a folder with room for it")
    made = _command(cache, "largebatch.tools.make_decoded", *SETS, f"data.root={images}")
    lines = made.stderr.strip().splitlines()
    assert made.returncode == 74 and len(lines) == 1, (made.returncode, made.stderr[-2000:])  # before: 2
    key = lines[0].split("/decoded-")[1].split("-")[0]
    assert lines[0] == "largebatch-make-decoded: error: " + want.format(key)  # before: "needs 0.00 GB"
    run = _command(cache, "largebatch.train", *SETS, f"data.root={images}", "data.loader=decoded",
                   f"run_dir={tmp_path / 'run'}")
    assert (run.returncode, run.stderr.strip().splitlines()) == (74, ["largebatch: error: " + want.format(key)]), \
        run.stderr[-2000:]
    assert not list(cache.iterdir())


def test_a_read_only_cache_is_not_chosen_by_auto(images: Path, mount, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    cache = mount("size=1m,ro")
    plan = _command(cache, "largebatch.tools.make_decoded", "--plan", *SETS, f"data.root={images}")
    assert plan.returncode == 0, plan.stderr
    assert plan.stdout.splitlines()[2].endswith(  # before: "(fits)"
        "free (CANNOT be written there: [Errno 30 EROFS] Read-only file system; set LARGEBATCH_CACHE to a "
        "writable folder)"), plan.stdout
    run_dir = tmp_path / "run"
    run = _command(cache, "largebatch.train", *SETS, f"data.root={images}", "data.loader=auto", "epochs=1",
                   f"run_dir={run_dir}")
    assert run.returncode == 0, run.stderr[-2000:]  # before: 74, the decoded store chosen and not writable
    log = (run_dir / "train.log").read_text()
    assert (f"data.loader=auto: not the decoded store: its 63.1 kB cannot be written to {cache} ([Errno 30 EROFS] "
            "Read-only file system); set LARGEBATCH_CACHE to a writable folder with room for it to read with it") in log
    assert "input pipeline: torchvision" in log, log[-3000:]
