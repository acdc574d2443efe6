"""largebatch-check-data: each kind of bad file is found, the file list leaves out the fatal
ones, the exit codes, require_checked, and what DALI's decoder really does with each kind."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from largebatch.data import check
from largebatch.data.check import KINDS, check_dataset, inspect_image, require_checked
from largebatch.data.pipelines.torchvision import DataError
from largebatch.data.synthetic import make_synthetic_imagenet
from largebatch.tools.check_data import main
from tests.fifo_guard import watched_fifo

HAS_DALI = importlib.util.find_spec("nvidia.dali") is not None


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The synthetic set: grayscale, CMYK and PNG-named-.JPEG files, nothing fatal."""
    return make_synthetic_imagenet(tmp_path_factory.mktemp("check") / "set", num_classes=3,
                                   train_per_class=6, val_per_class=2, image_size=24)


@pytest.fixture
def clean(pristine: Path, tmp_path: Path) -> Path:
    root = tmp_path / "data"
    shutil.copytree(pristine, root)
    return root


def _good_jpeg(root: Path) -> bytes:
    return next((root / "train" / "n0001").glob("*.JPEG")).read_bytes()


PLANTED = {  # kind -> (relative path, how to make its bytes from a good JPEG)
    "empty": ("train/n0000/empty.JPEG", lambda good: b""),
    "truncated": ("train/n0001/cut.JPEG", lambda good: good[: len(good) // 2]),
    "not_image": ("val/n0002/error-page.JPEG", lambda good: b"<html>404 Not Found</html>\n"),
    "unsupported_format": ("train/n0002/anim.JPEG", None),  # a GIF, made below
}


@pytest.fixture
def planted(clean: Path) -> Path:
    good = _good_jpeg(clean)
    for kind, (rel, make) in PLANTED.items():
        if make is None:
            Image.new("RGB", (8, 8), (200, 10, 10)).save(clean / rel, format="GIF")
        else:
            (clean / rel).write_bytes(make(good))
    return clean


def _listed(list_path: Path) -> dict[str, int]:
    return {line.rsplit(" ", 1)[0]: int(line.rsplit(" ", 1)[1])
            for line in list_path.read_text().splitlines()}


def test_finds_each_planted_kind_and_lists_only_decodable_files(planted: Path, tmp_path: Path,
                                                                capsys) -> None:
    out = tmp_path / "report.json"
    assert main([str(planted), "--workers", "2", "--output", str(out)]) == 1
    report = json.loads(out.read_text())
    found = {(p["kind"], p["path"]) for p in report["problems"]}
    for kind, (rel, _) in PLANTED.items():
        assert (kind, rel) in found
    odd = json.loads((planted / "largebatch-synthetic.json").read_text())["oddities"]
    expected = {"L": "grayscale_jpeg", "CMYK": "cmyk_jpeg", "PNG": "wrong_extension"}
    for rel, what in odd.items():
        assert (expected[what], rel) in found
    assert len(found) == len(PLANTED) + len(odd)
    text = capsys.readouterr().out
    for kind in {k for k, _ in found}:
        assert kind in text
    fatal = {rel for kind, rel in found if KINDS[kind].fatal}
    for split, n_bad in (("train", 3), ("val", 1)):
        listed = _listed(planted / f".largebatch-filelist-{split}.txt")
        summary = report["splits"][split]
        assert summary["listed"] == len(listed) == summary["files"] - n_bad
        assert not fatal & set(listed)
        assert {rel for rel in odd if rel.startswith(split)} <= set(listed)  # DALI decodes them
    labels = _listed(planted / ".largebatch-filelist-train.txt")
    assert all(labels[rel] == int(rel.split("/")[1][1:]) for rel in labels)  # n0002 -> 2
    assert json.loads((planted / ".largebatch-check.json").read_text())["counts"] == report["counts"]


def test_exit_code_0_when_every_file_decodes(clean: Path, capsys) -> None:
    assert main([str(clean), "--workers", "1"]) == 0
    assert "every image can be decoded by DALI" in capsys.readouterr().out


def test_hidden_folders_are_skipped_and_named_not_counted_as_classes(clean: Path, capsys) -> None:
    """Issue 54 item 6a: ``train/.ipynb_checkpoints/`` was a class (exit 2, "holds no image")."""
    for split in ("train", "val"):
        (clean / split / ".ipynb_checkpoints").mkdir()
    (clean / "train" / ".ipynb_checkpoints" / "x-checkpoint.JPEG").write_bytes(_good_jpeg(clean))
    assert main([str(clean), "--workers", "1"]) == 0
    out = capsys.readouterr().out
    assert "train: 18 image files in 3 classes" in out, out
    for split in ("train", "val"):
        assert f"{split}: skipped 1 hidden folder(s), not classes: .ipynb_checkpoints" in out, out
    labels = _listed(clean / ".largebatch-filelist-train.txt")
    assert len(labels) == 18 and all(labels[rel] == int(rel.split("/")[1][1:]) for rel in labels)


@pytest.mark.parametrize("argv", [[], ["/no/such/folder"], ["ROOT", "--workers", "-1"],
                                  ["ROOT", "--splits", "test"]])
def test_bad_arguments_exit_2_with_one_line(argv: list[str], clean: Path, capsys) -> None:
    argv = [str(clean) if a == "ROOT" else a for a in argv]
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("largebatch-check-data: error:") and err.count("\n") == 1


def test_a_class_only_in_val_exits_2_with_one_line_before_writing_lists(clean: Path, capsys) -> None:
    """Issue 54 item 3: it passed ("every image can be decoded"), and DALI died an epoch later."""
    shutil.copytree(clean / "val" / "n0001", clean / "val" / "zzz")
    with pytest.raises(SystemExit) as exc:
        main([str(clean), "--workers", "1"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "class folders differ: 0 only in train [], 1 only in val ['zzz']" in err, err
    assert not (clean / ".largebatch-filelist-train.txt").exists()


def test_a_fifo_is_reported_and_left_out_never_opened(clean: Path, capsys) -> None:
    """Issue 54 item 4: a FIFO named .JPEG hung the check forever (it opened it to read its head)."""
    fifo = clean / "train" / "n0001" / "pipe.JPEG"
    with watched_fifo(fifo) as opens:
        code = main([str(clean), "--workers", "1"])
    assert opens.count == 0 and code == 1
    out = capsys.readouterr().out
    assert "not_a_file" in out and "train/n0001/pipe.JPEG  (a FIFO (named pipe))" in out, out
    assert "train/n0001/pipe.JPEG" not in _listed(clean / ".largebatch-filelist-train.txt")


def test_a_data_root_that_is_a_file_says_so(tmp_path: Path, capsys) -> None:
    """Issue 43 case 6: a file given as the data root was said not to exist."""
    archive = tmp_path / "imagenet.tar"
    archive.write_bytes(b"not a folder")
    with pytest.raises(SystemExit) as exc:
        main([str(archive)])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"data root {archive} is a file, not a folder" in err, err


@pytest.mark.parametrize("note_kind", [False, True], ids=["good_jpeg", "png_named_jpeg"])
def test_a_name_that_is_not_utf8_is_reported_escaped_not_a_crash(clean: Path, note_kind: bool) -> None:
    """Issue 43 case 3: `cafe<0xe9>.JPEG` crashed the check with UnicodeEncodeError (exit 1, a
    traceback) while writing the file list; a file of a note kind (PNG named .JPEG) was even listed."""
    import subprocess
    import sys

    source = next((clean / "train" / "n0001").glob("*.JPEG"))
    if note_kind:
        source = next(p for p in (clean / "train").rglob("*.JPEG") if p.read_bytes()[:4] == b"\x89PNG")
    bad = os.path.join(os.fsencode(clean / "train" / "n0000"), b"caf\xe9.JPEG")
    with open(bad, "wb") as f:
        f.write(source.read_bytes())
    env = {**os.environ, "PYTHONIOENCODING": "utf-8", "LC_ALL": "C.UTF-8"}
    proc = subprocess.run([sys.executable, "-m", "largebatch.tools.check_data", str(clean), "--workers", "1"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    table = proc.stdout.splitlines()
    row = next(i for i, line in enumerate(table) if line.startswith("unlistable_name "))
    assert table[row].split()[1] == "1" and "not UTF-8" in table[row]
    assert "train/n0000/caf\\xe9.JPEG  (not UTF-8)" in table[row + 1], proc.stdout
    report = json.loads((clean / check.REPORT_NAME).read_text())
    (problem,) = [p for p in report["problems"] if p["kind"] == "unlistable_name"]
    assert problem["path"] == "train/n0000/caf\\xe9.JPEG" and problem["fatal"]
    assert not any("caf" in name for name in _listed(clean / check.file_list_name("train")))
    require_checked(clean, "train")  # the fingerprint of the set with that name still matches


def test_exif_rotated_jpegs_are_counted_and_kept_in_the_list(clean: Path, capsys) -> None:
    """Issue 43 case 8: the check counts the JPEGs whose EXIF orientation every loader applies."""
    good = next((clean / "train" / "n0001").glob("*.JPEG"))
    exif = Image.Exif()
    exif[0x0112] = 6
    Image.open(good).convert("RGB").save(clean / "train" / "n0001" / "rotated.JPEG", "JPEG", exif=exif.tobytes())
    assert main([str(clean), "--workers", "1"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("exif_rotated "))
    assert row.split()[1:3] == ["1", "yes"], row
    assert "train/n0001/rotated.JPEG  (EXIF orientation 6)" in out
    assert "train/n0001/rotated.JPEG" in _listed(clean / check.file_list_name("train"))


def test_require_checked_refuses_an_unchecked_or_changed_set(planted: Path) -> None:
    message = (f"data set {planted} has not been checked for files DALI cannot decode; "
               f"run: largebatch-check-data {planted}")
    with pytest.raises(DataError) as exc:
        require_checked(planted, "train")
    assert str(exc.value) == message
    check_dataset(planted, workers=1)
    listed = require_checked(planted, "train")
    assert listed == planted / ".largebatch-filelist-train.txt"
    assert require_checked(planted, "val").name == ".largebatch-filelist-val.txt"
    victim = next((planted / "train" / "n0000").glob("n0000_train_*.JPEG"))
    for change in ("add", "replace", "rewrite", "remove"):
        if change == "add":
            shutil.copy(victim, victim.with_name("copy.JPEG"))
        elif change == "replace":
            victim.with_name("copy.JPEG").unlink()
            victim.write_bytes(victim.read_bytes() + b"\0")  # same name, another size
        elif change == "rewrite":  # same name, same size, broken bytes: only the mtime tells
            size = victim.stat().st_size
            os.utime(victim, ns=(victim.stat().st_atime_ns, victim.stat().st_mtime_ns - 10**9))
            check_dataset(planted, workers=1)
            victim.write_bytes(b"\0" * size)
        else:
            victim.unlink()
        with pytest.raises(DataError, match="since it changed.*run: largebatch-check-data"):
            require_checked(planted, "train")
        require_checked(planted, "val")  # the other split did not change
        check_dataset(planted, workers=1)
        require_checked(planted, "train")


def test_read_only_root_uses_the_cache(clean: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("LARGEBATCH_CACHE", str(tmp_path / "cache"))
    real_access = check.os.access
    monkeypatch.setattr(check.os, "access",
                        lambda p, mode: False if Path(p) == clean else real_access(p, mode))
    report = check_dataset(clean, workers=1)
    listed = require_checked(clean, "train")
    assert listed.parent == check.state_dirs(clean)[1] and str(listed).startswith(str(tmp_path))
    assert Path(report.report_path).parent == listed.parent
    assert not (clean / ".largebatch-check.json").exists()


def test_inspect_image_names_each_kind(tmp_path: Path) -> None:
    rgb = Image.fromarray(np.random.default_rng(0).integers(0, 255, (20, 30, 3), dtype=np.uint8))
    cases = {
        "ok.JPEG": (lambda p: rgb.save(p, format="JPEG"), None),
        "gray.JPEG": (lambda p: rgb.convert("L").save(p, format="JPEG"), "grayscale_jpeg"),
        "cmyk.JPEG": (lambda p: rgb.convert("CMYK").save(p, format="JPEG"), "cmyk_jpeg"),
        "png.JPEG": (lambda p: rgb.save(p, format="PNG"), "wrong_extension"),
        "real.png": (lambda p: rgb.save(p, format="PNG"), None),
        "gif.JPEG": (lambda p: rgb.save(p, format="GIF"), "unsupported_format"),
        "empty.JPEG": (lambda p: p.write_bytes(b""), "empty"),
        "text.JPEG": (lambda p: p.write_text("not an image"), "not_image"),
    }
    for name, (make, kind) in cases.items():
        make(tmp_path / name)
        assert inspect_image(tmp_path / name)[0] == kind, name
    full = (tmp_path / "ok.JPEG").read_bytes()
    for cut in (len(full) // 3, len(full) - 2):  # half the scan, or only the end marker missing
        (tmp_path / "cut.JPEG").write_bytes(full[:cut])
        assert inspect_image(tmp_path / "cut.JPEG")[0] == "truncated"
    (tmp_path / "bad.JPEG").write_bytes(full[:200] + bytes(len(full) - 200))
    assert KINDS[inspect_image(tmp_path / "bad.JPEG")[0]].fatal


@pytest.mark.skipif(not HAS_DALI, reason="needs nvidia-dali")
def test_dali_cpu_decoder_fails_exactly_on_the_fatal_kinds(planted: Path) -> None:
    """What KINDS says DALI does, measured: fatal kinds stop a pipeline, the others decode to
    the same RGB pixels as Pillow."""
    import nvidia.dali as dali

    odd = json.loads((planted / "largebatch-synthetic.json").read_text())["oddities"]
    samples = {rel: kind for kind, (rel, _) in PLANTED.items()}
    samples.update({rel: "odd" for rel in odd})
    for rel, kind in samples.items():
        data = np.fromfile(planted / rel, dtype=np.uint8)

        @dali.pipeline_def(batch_size=1, num_threads=1, device_id=None)
        def decode():
            encoded = dali.fn.external_source(source=lambda: [data], batch=True)
            return dali.fn.decoders.image(encoded, device="cpu", output_type=dali.types.RGB)

        pipe = decode()
        pipe.build()
        if kind != "odd" and KINDS[kind].fatal:
            with pytest.raises(RuntimeError):
                pipe.run()
        else:
            got = np.asarray(pipe.run()[0][0])
            with Image.open(planted / rel) as img:
                want = np.asarray(img.convert("RGB"))
            assert got.shape == want.shape and np.abs(got.astype(int) - want).max() <= 1, rel
