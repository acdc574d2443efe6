"""Checkpoints are complete or absent; the newest readable one is found."""

from __future__ import annotations

import errno
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from largebatch.engine.checkpoint import (
    checkpoint_name,
    is_readable,
    list_checkpoints,
    save_checkpoint,
)
from largebatch.engine.checkpoint_retention import prune_checkpoints
from largebatch.engine.resume import load_latest
from largebatch.engine.rng_state import capture_rng_state, restore_rng_state


def test_save_keeps_newest_and_orders_by_step(tmp_path: Path) -> None:
    for step in (5, 10, 15, 20):
        written = save_checkpoint({"model": {"step": step}}, tmp_path, checkpoint_name(step // 5, step))
        prune_checkpoints(tmp_path, 2, written=written)
    names = [p.name for p in list_checkpoints(tmp_path)]
    assert names == [checkpoint_name(3, 15), checkpoint_name(4, 20)]
    assert not list(tmp_path.glob("*.tmp"))


def test_corrupt_newest_falls_back_to_previous(tmp_path: Path) -> None:
    save_checkpoint({"model": {"w": torch.ones(3)}}, tmp_path, checkpoint_name(1, 10))
    newest = save_checkpoint({"model": {"w": torch.zeros(3)}}, tmp_path, checkpoint_name(2, 20))
    newest.write_bytes(newest.read_bytes()[:50])  # truncated
    path, state = load_latest(tmp_path)
    assert path.name == checkpoint_name(1, 10)
    assert torch.equal(state["model"]["w"], torch.ones(3))


_WRITER = """
import sys, torch
from largebatch.engine.checkpoint import save_checkpoint, checkpoint_name
big = {"model": {"w": torch.randn(64, 1024, 1024)}}  # 256 MB: slow enough to be killed midway
print("writing", flush=True)
save_checkpoint(big, sys.argv[1], checkpoint_name(2, 20))
"""


def test_killed_writer_leaves_previous_checkpoint(tmp_path: Path) -> None:
    save_checkpoint({"model": {"w": torch.ones(3)}}, tmp_path, checkpoint_name(1, 10))
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "writing"
    # kill once the temporary file exists (the write is under way)
    deadline = time.time() + 60
    while not list(tmp_path.glob(".*.tmp")) and time.time() < deadline and proc.poll() is None:
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    path, state = load_latest(tmp_path)
    assert path.name == checkpoint_name(1, 10)
    assert torch.equal(state["model"]["w"], torch.ones(3))


def test_rng_state_round_trips_through_a_checkpoint(tmp_path: Path) -> None:
    import random

    import numpy as np

    def draw() -> tuple:
        return random.random(), float(np.random.rand()), torch.rand(3).tolist()

    path = save_checkpoint({"model": {}, "rng": capture_rng_state()}, tmp_path, checkpoint_name(0, 1))
    expected = draw()
    restore_rng_state(load_latest(tmp_path)[1]["rng"])
    assert draw() == expected
    assert path.exists()


class _Payload:
    """Unpickling this runs ``touch <marker>``: what a crafted checkpoint would do."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (os.system, (f"touch {self.marker}",))


def _crafted_checkpoint(path: Path, marker: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"model": {"w": torch.ones(2)}, "extra": _Payload(marker)}, path)
    return path


def test_a_crafted_checkpoint_is_refused_and_its_payload_never_runs(tmp_path: Path) -> None:
    import pytest

    from largebatch.engine.checkpoint import CheckpointError, is_readable, load_checkpoint

    marker = tmp_path / "payload-ran"
    path = _crafted_checkpoint(tmp_path / "ckpts" / checkpoint_name(1, 10), marker)
    with pytest.raises(CheckpointError, match="not a plain largebatch checkpoint"):
        load_checkpoint(path)
    with pytest.raises(CheckpointError, match="none of the 1 checkpoint"):
        load_latest(tmp_path / "ckpts")
    assert not is_readable(path)
    assert not marker.exists()
    torch.load(path, weights_only=False)  # the payload is real: an unsafe load runs it
    assert marker.exists()


def test_pruning_counts_only_readable_checkpoints(tmp_path: Path) -> None:
    """Damaged newer files must not push out the checkpoint just written (keep=1)."""
    save_checkpoint({"model": {"w": torch.ones(3)}}, tmp_path, checkpoint_name(0, 1))
    for step in (10, 11, 12):  # damaged "newest" checkpoints of an abandoned attempt
        p = save_checkpoint({"model": {"w": torch.zeros(3)}}, tmp_path, checkpoint_name(1, step))
        p.write_bytes(p.read_bytes()[:40])
    written = save_checkpoint({"model": {"w": torch.full((3,), 2.0)}}, tmp_path, checkpoint_name(0, 2))
    prune_checkpoints(tmp_path, 1, written=written)
    names = [p.name for p in list_checkpoints(tmp_path)]
    assert written.name in names and checkpoint_name(0, 1) not in names  # the older valid one went
    path, state = load_latest(tmp_path)
    assert path == written and torch.equal(state["model"]["w"], torch.full((3,), 2.0))


def test_pruning_does_not_count_a_bit_flipped_checkpoint_as_kept(tmp_path: Path) -> None:
    """A flipped bit leaves the file a readable zip; only its checksum tells. Pruning must not
    delete the last good checkpoint to keep a damaged one (keep=2)."""
    from tests.test_checkpoint_integrity import _flip_one_bit

    good = save_checkpoint({"model": {"w": torch.ones(1 << 16)}}, tmp_path, checkpoint_name(0, 1))
    damaged = save_checkpoint({"model": {"w": torch.zeros(1 << 16)}}, tmp_path, checkpoint_name(0, 2))
    _flip_one_bit(damaged)
    assert is_readable(damaged)  # torch.load still opens it
    written = save_checkpoint({"model": {"w": torch.full((1 << 16,), 3.0)}}, tmp_path, checkpoint_name(0, 3))
    prune_checkpoints(tmp_path, 2, written=written)
    names = [p.name for p in list_checkpoints(tmp_path)]
    assert names == [good.name, damaged.name, written.name], names  # good kept: the damaged one is no keeper
    path, state = load_latest(tmp_path)
    assert path == written
    # The next save keeps 3 and 4; the damaged file, now older than every kept one, goes too.
    newest = save_checkpoint({"model": {"w": torch.ones(1 << 16)}}, tmp_path, checkpoint_name(0, 4))
    prune_checkpoints(tmp_path, 2, written=newest)
    assert [p.name for p in list_checkpoints(tmp_path)] == [written.name, checkpoint_name(0, 4)]


def test_orphaned_temp_files_are_removed(tmp_path: Path) -> None:
    from largebatch.engine.checkpoint_retention import remove_orphaned_temp_files

    keep = save_checkpoint({"model": {}}, tmp_path, checkpoint_name(0, 1))
    for i in range(5):
        (tmp_path / f".{checkpoint_name(0, 2 + i)}.x{i}.tmp").write_bytes(b"\0" * 1000)
    assert remove_orphaned_temp_files(tmp_path) == (5, 5000)
    assert not list(tmp_path.glob(".*.tmp")) and keep.exists()


_INTERRUPTED_WRITER = """
import signal, sys, torch
from largebatch.engine.checkpoint import save_checkpoint, checkpoint_name
# Ctrl-C raises KeyboardInterrupt (a background shell starts Python with SIGINT ignored)
signal.signal(signal.SIGINT, signal.default_int_handler)
big = {"model": {"w": torch.randn(32, 1024, 1024)}}  # 128 MB: the signal lands mid-write
print("writing", flush=True)
try:
    save_checkpoint(big, sys.argv[1], checkpoint_name(2, 20))
    print("no interrupt", flush=True)
except KeyboardInterrupt:
    print("interrupted after the write", flush=True)
"""


def test_ctrl_c_during_a_write_waits_for_it(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", _INTERRUPTED_WRITER, str(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "writing"
    deadline = time.time() + 60
    while not list(tmp_path.glob(".*.tmp")) and time.time() < deadline and proc.poll() is None:
        time.sleep(0.005)
    assert list(tmp_path.glob(".*.tmp")), "the write did not start"
    os.kill(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert "interrupted after the write" in out, (out, err)
    path, state = load_latest(tmp_path)
    assert path.name == checkpoint_name(2, 20) and state["model"]["w"].shape == (32, 1024, 1024)
    assert not list(tmp_path.glob(".*.tmp"))


_FULL_DISK_WRITER = """
import resource, signal, sys, torch
from largebatch.engine.checkpoint import CheckpointSaveError, save_checkpoint, checkpoint_name
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))  # files of at most 1 MiB
try:
    save_checkpoint({"model": {"w": torch.randn(1 << 20)}}, sys.argv[1], checkpoint_name(2, 20))
except CheckpointSaveError as e:
    print(e.errno, e.path.name, str(e), sep="|", flush=True)
"""


def test_a_failed_write_names_path_and_errno_and_keeps_earlier_checkpoints(tmp_path: Path) -> None:
    save_checkpoint({"model": {"w": torch.ones(3)}}, tmp_path, checkpoint_name(1, 10))
    proc = subprocess.run([sys.executable, "-c", _FULL_DISK_WRITER, str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    code, name, message = proc.stdout.strip().split("|", 2)
    assert int(code) == errno.EFBIG and name == checkpoint_name(2, 20), proc.stderr
    assert f"[Errno {errno.EFBIG} EFBIG]" in message and str(tmp_path) in message
    assert f"the 1 earlier checkpoint(s) are intact (newest: {checkpoint_name(1, 10)})" in message, message
    assert not list(tmp_path.glob(".*.tmp"))
    assert [p.name for p in list_checkpoints(tmp_path)] == [checkpoint_name(1, 10)]


def test_a_failed_first_write_says_there_is_nothing_to_resume_from(tmp_path: Path) -> None:
    """Issue 54 item 5c: the first save of a run failing (a 3 MiB disk) said "the earlier
    checkpoints are intact" and "resume=auto" when there were none."""
    proc = subprocess.run([sys.executable, "-c", _FULL_DISK_WRITER, str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    message = proc.stdout.strip().split("|", 2)[-1]
    assert "no earlier checkpoint: this run has none to resume from" in message, (message, proc.stderr)
    assert "intact" not in message and "resume=auto" not in message, message
    assert not list(tmp_path.glob(".*.tmp")) and list_checkpoints(tmp_path) == []


def test_a_checkpoint_pruning_cannot_delete_is_a_warning_and_the_save_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 54 item 5b: a PermissionError deleting an old checkpoint (after the new one was
    written) escaped save_checkpoint and killed a healthy run. Root deletes anything, so the
    refusal is stood in for that one file."""
    first = save_checkpoint({"model": {"step": 1}}, tmp_path, checkpoint_name(0, 1))
    second = save_checkpoint({"model": {"step": 2}}, tmp_path, checkpoint_name(0, 2))
    unlink = Path.unlink

    def refuse(self: Path, missing_ok: bool = False) -> None:
        if self == first:
            raise PermissionError(errno.EACCES, "Permission denied", str(self))
        unlink(self, missing_ok=missing_ok)

    monkeypatch.setattr(Path, "unlink", refuse)
    written = save_checkpoint({"model": {"step": 3}}, tmp_path, checkpoint_name(0, 3))
    with caplog.at_level(logging.WARNING, logger="largebatch.engine.checkpoint_retention"):
        prune_checkpoints(tmp_path, 1, written=written)
    assert [p.name for p in list_checkpoints(tmp_path)] == [first.name, written.name]  # the second went
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and f"cannot delete old checkpoint {first}" in warnings[0], warnings
    assert f"[Errno {errno.EACCES} EACCES]" in warnings[0] and "the run goes on" in warnings[0], warnings
    assert not second.exists() and load_latest(tmp_path)[0] == written


@pytest.mark.parametrize("features", ["noise_scale", 5, ["ema", 3]])
def test_a_damaged_features_field_is_one_line(features: object) -> None:
    """Issue 90 case 6: a 'features' field of the wrong type was read as its letters (a string) or
    ended in a 29-line TypeError (a number); now one CheckpointError line naming the field."""
    from largebatch.engine.checkpoint_format import RunCheckpoint
    from largebatch.engine.resume import CheckpointError

    with pytest.raises(CheckpointError) as caught:
        RunCheckpoint.from_state({"format": 3, "features": features, "model": {}}, "ckpt.pt")
    message = str(caught.value)
    assert "\n" not in message and f"its 'features' field is {features!r}, not a list of names" in message
