"""``largebatch-make-decoded``: the stores it builds (or plans) are the ones a run with the same
overrides and ``data.loader=decoded`` reads, so that run decodes nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from largebatch.cli import main as train
from largebatch.tools.make_decoded import main
from tests.smoke import smoke

SETS = smoke("data.synthetic.classes=4")  # 32 train and 8 val images of 36 px


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("LARGEBATCH_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _stores(cache: Path) -> list[str]:
    return sorted(p.name.rsplit("-", 2)[1] + "-" + p.name.rsplit("-", 1)[1] for p in cache.glob("decoded-*"))


def test_plan_then_make_then_the_run_decodes_nothing(cache: Path, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture) -> None:
    assert main(["--plan", *SETS]) == 0
    plan = capsys.readouterr().out.splitlines()
    assert plan[0].startswith("train: 32 images at ") and plan[0].endswith("(to build)"), plan
    assert plan[1].startswith("val: 8 images at ") and plan[1].endswith("(to build)"), plan
    assert plan[2].startswith("to build: ") and "free (fits)" in plan[2]
    assert not list(cache.glob("decoded-*")), "--plan built a store"

    assert main(SETS) == 0
    made = capsys.readouterr().out.splitlines()
    assert [line.split(" (")[0] for line in made] == [line.split(" (")[0] for line in plan[:2]]  # sides, sizes, folders
    assert all("built in" in line for line in made) and _stores(cache) == ["train-24px", "val-18px"]

    run = tmp_path / "run"
    assert train([*SETS, "data.loader=decoded", "epochs=1", f"run_dir={run}"]) == 0
    log = (run / "train.log").read_text()
    assert "decoded by an earlier run" in log, log[-2000:]
    assert _stores(cache) == ["train-24px", "val-18px"]  # nothing else built
    capsys.readouterr()  # the run's own lines

    assert main(["--plan", *SETS]) == 0
    assert all(line.endswith("(built)") for line in capsys.readouterr().out.splitlines()[:2])
    assert main(["--plan", *smoke("data.synthetic.classes=4", "data.image_size=24")]) == 0
    assert capsys.readouterr().out.splitlines()[0].endswith("(to build)")  # other sides: another store


def test_bad_input_is_one_line_and_its_exit_code(cache: Path, tmp_path: Path) -> None:
    """As the command line runs it: a bad override 2; a cache it cannot write 74."""
    env = {**os.environ, "LARGEBATCH_CACHE": str(cache)}
    bad = subprocess.run([sys.executable, "-m", "largebatch.tools.make_decoded", *SETS, "data.image_size=x"],
                         capture_output=True, text=True, env=env, timeout=120)
    assert bad.returncode == 2 and bad.stderr.strip().splitlines() == [
        "largebatch-make-decoded: error: data.image_size=x is not an integer; set data.image_size= to an integer"]
    images = tmp_path / "images"  # the embedded set elsewhere, the stores' cache under a file
    made = subprocess.run([sys.executable, "-m", "largebatch.tools.make_decoded", *SETS],
                          capture_output=True, text=True, env={**env, "LARGEBATCH_CACHE": str(images)}, timeout=120)
    assert made.returncode == 0, made.stderr
    blocked = tmp_path / "file"
    blocked.write_text("")
    root = next(images.glob("synthetic*"))
    full = subprocess.run([sys.executable, "-m", "largebatch.tools.make_decoded", *SETS, f"data.root={root}"],
                          capture_output=True, text=True, env={**env, "LARGEBATCH_CACHE": str(blocked / "cache")},
                          timeout=120)
    lines = full.stderr.strip().splitlines()
    assert full.returncode == 74 and len(lines) == 1 and "set LARGEBATCH_CACHE to a writable folder" in lines[0], lines


def test_a_corrupted_store_is_refused_by_the_run_and_by_check(cache: Path, tmp_path: Path) -> None:
    """Issue 90 item 4, as typed: bytes written over a built store trained silently (rc 0). Now
    the run refuses it in one line naming the store and the command that rebuilds it, exit 2;
    ``largebatch-make-decoded --check`` reads it whole and says the same with the overrides."""
    env = {**os.environ, "LARGEBATCH_CACHE": str(cache)}

    def command(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, env=env, timeout=300)

    assert command("largebatch.tools.make_decoded", *SETS).returncode == 0
    checked = command("largebatch.tools.make_decoded", "--check", *SETS)
    assert checked.returncode == 0, checked.stderr
    assert [line.rsplit("(", 1)[1].split(",")[0] for line in checked.stdout.splitlines()] == [
        "checked: its data", "checked: its data"], checked.stdout
    train = next(cache.glob("decoded-*-train-*"))
    with open(train / "images.uint8", "r+b") as pixels:
        pixels.seek(1000)
        pixels.write(os.urandom(64))

    run = command("largebatch.train", *SETS, "data.loader=decoded", "epochs=1", f"run_dir={tmp_path / 'run'}")
    assert run.returncode == 2, (run.returncode, run.stderr[-2000:])
    assert run.stderr.strip().splitlines() == [
        f"largebatch: error: decoded store {train} is corrupted: bytes 0 to 55,296 of images.uint8 differ from what "
        f"was written: delete it and rebuild it: rm -r {train} && largebatch-make-decoded with the run's overrides "
        "(or the run rebuilds it on first use)"]
    checked = command("largebatch.tools.make_decoded", "--check", *SETS)
    assert checked.returncode == 2 and checked.stderr.strip().splitlines() == [
        f"largebatch-make-decoded: error: decoded store {train} is corrupted: bytes 0 to 55,296 of images.uint8 "
        f"differ from what was written: delete it and rebuild it: rm -r {train} && largebatch-make-decoded "
        f"{' '.join(SETS)} (or the run rebuilds it on first use)"], checked.stderr
