"""A checkpoint whose bytes changed is refused, naming the file; a rollback's abandoned
timeline is set aside so that ``resume=auto`` continues the run the user last made."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pytest
import torch

from largebatch.cli import main
from largebatch.engine.checkpoint import (
    CheckpointError,
    checkpoint_name,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
)
from largebatch.engine.resume import load_latest
from tests.smoke import EXACT


def _flip_one_bit(path: Path) -> int:
    """Flip one bit in the middle of the file (inside the tensor data); return its offset."""
    data = bytearray(path.read_bytes())
    offset = len(data) // 2
    data[offset] ^= 0x10
    path.write_bytes(bytes(data))
    return offset


def test_a_flipped_bit_is_caught_and_the_previous_checkpoint_loads(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    save_checkpoint({"model": {"w": torch.ones(1 << 20)}}, tmp_path, checkpoint_name(1, 10))
    newest = save_checkpoint({"model": {"w": torch.zeros(1 << 20)}}, tmp_path, checkpoint_name(2, 20))
    assert load_checkpoint(newest)["model"]["w"].count_nonzero() == 0
    _flip_one_bit(newest)
    # the flip is silent to torch.load: one weight changed, nothing failed
    silently = torch.load(newest, weights_only=True)["model"]["w"]
    assert silently.count_nonzero() == 1
    with pytest.raises(CheckpointError, match=re.escape(f"checkpoint {newest} is damaged")):
        load_checkpoint(newest)
    with caplog.at_level(logging.WARNING):
        path, state = load_latest(tmp_path)
    assert path.name == checkpoint_name(1, 10) and torch.equal(state["model"]["w"], torch.ones(1 << 20))
    skipped = [r.getMessage() for r in caplog.records if "damaged" in r.getMessage()]
    assert len(skipped) == 1 and str(newest) in skipped[0] and "\n" not in skipped[0], skipped


def test_a_checkpoint_is_still_a_zip_that_torch_load_reads(tmp_path: Path) -> None:
    import zipfile

    path = save_checkpoint({"model": {"w": torch.arange(5.0)}}, tmp_path, checkpoint_name(0, 1))
    assert torch.equal(torch.load(path, weights_only=True)["model"]["w"], torch.arange(5.0))
    assert zipfile.ZipFile(path).comment.startswith(b"largebatch-sha256:")


def test_a_checkpoint_without_checksum_loads_with_one_log_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    old = tmp_path / checkpoint_name(1, 10)
    torch.save({"model": {"w": torch.ones(3)}}, old)  # how checkpoints were written before
    with caplog.at_level(logging.WARNING):
        assert torch.equal(load_checkpoint(old)["model"]["w"], torch.ones(3))
        assert load_latest(tmp_path)[0] == old
    lines = [r.getMessage() for r in caplog.records if "no checksum" in r.getMessage()]
    assert len(lines) == 1 and str(old) in lines[0], lines


def _one_error_line(capsys: pytest.CaptureFixture) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("largebatch: error:") and "\n" not in err and "Traceback" not in err, err
    return err


def test_resume_from_a_flipped_file_exits_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from largebatch.errors import EXIT_USAGE

    run = tmp_path / "run"
    assert main([*EXACT, f"run_dir={run}", "max_steps=2", "checkpoint.every_steps=1"]) == 0
    first, damaged = list_checkpoints(run / "checkpoints")
    _flip_one_bit(damaged)
    torch.load(damaged, weights_only=True)  # still opens: only the checksum tells
    capsys.readouterr()
    assert main([*EXACT, f"run_dir={run}", f"resume={damaged}", "max_steps=3"]) == EXIT_USAGE == 2
    err = _one_error_line(capsys)
    assert f"checkpoint {damaged} is damaged" in err and "resume=auto" in err
    # resume=auto skips it for the one before, naming it in the log
    assert main([*EXACT, f"run_dir={run}", "resume=auto", "max_steps=3"]) == 0
    log_text = (run / "train.log").read_text()
    assert f"checkpoint {damaged} is damaged" in log_text and f"resumed from {first}" in log_text


def test_resume_from_a_pre_checksum_checkpoint_runs(tmp_path: Path) -> None:
    run = tmp_path / "run"
    assert main([*EXACT, f"run_dir={run}", "max_steps=2"]) == 0
    path = list_checkpoints(run / "checkpoints")[-1]
    torch.save(load_checkpoint(path), path)  # rewritten as an older version wrote it
    assert main([*EXACT, f"run_dir={run}", "resume=auto", "max_steps=3"]) == 0
    lines = [ln for ln in (run / "train.log").read_text().splitlines() if "no checksum" in ln]
    assert len(lines) == 1 and str(path) in lines[0], lines
    assert load_checkpoint(list_checkpoints(run / "checkpoints")[-1])["train_state"]["step"] == 3


def test_resume_auto_reads_and_verifies_the_checkpoint_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Choosing the newest readable checkpoint loads it; the resume uses that state instead of a
    second SHA-256 pass and torch.load (ResNet-50: ~70 ms hashing + ~140 ms loading each)."""
    import largebatch.engine.checkpoint as checkpoint

    run = tmp_path / "run"
    assert main([*EXACT, f"run_dir={run}", "max_steps=2"]) == 0
    newest = list_checkpoints(run / "checkpoints")[-1]
    verified: list[Path] = []
    real = checkpoint.verify_checksum
    monkeypatch.setattr(checkpoint, "verify_checksum", lambda path: verified.append(Path(path)) or real(path))
    assert main([*EXACT, f"run_dir={run}", "resume=auto", "max_steps=3"]) == 0
    assert verified.count(newest) == 1, verified
    assert load_checkpoint(list_checkpoints(run / "checkpoints")[-1])["train_state"]["step"] == 3


def _steps(directory: Path) -> list[int]:
    return [load_checkpoint(p)["train_state"]["step"] for p in list_checkpoints(directory)]


def test_resume_auto_after_a_rollback_continues_the_new_timeline(tmp_path: Path) -> None:
    """Run to step 12 (checkpoints 4, 8, 12; keep=3), roll back to step 4 and stop at 7:
    the checkpoints 8 and 12 of the abandoned timeline are set aside (not deleted), step 4
    (resumed from) stays, and ``resume=auto`` continues from 7, not from 12."""
    run = tmp_path / "run"
    ckpts = run / "checkpoints"
    args = [*EXACT, f"run_dir={run}", "epochs=4", "checkpoint.keep=3"]
    assert main([*args, "max_steps=12"]) == 0
    assert _steps(ckpts) == [4, 8, 12]
    step_4 = list_checkpoints(ckpts)[0]
    assert main([*args, f"resume={step_4}", "max_steps=7"]) == 0
    assert _steps(ckpts) == [4, 7]  # the one resumed from was not pruned
    aside = [p for p in ckpts.iterdir() if p.is_dir()]
    assert len(aside) == 1 and aside[0].name.startswith("abandoned-"), aside
    assert _steps(aside[0]) == [8, 12]
    log_text = (run / "train.log").read_text()
    assert re.search(rf"moved 2 newer checkpoint\(s\) .*\(steps 8-12\).* to {re.escape(str(aside[0]))}", log_text)
    assert main([*args, "resume=auto", "max_steps=9"]) == 0
    assert f"resumed from {ckpts / checkpoint_name(1, 7)}" in (run / "train.log").read_text()
    assert _steps(ckpts) == [7, 8, 9] and _steps(aside[0]) == [8, 12]
    assert json.loads((run / "summary.json").read_text())["steps"] == 9
