"""Checkpoints are complete or absent; the newest readable one is found."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

from largebatch.engine.checkpoint import (
    capture_rng_state,
    checkpoint_name,
    list_checkpoints,
    load_latest,
    restore_rng_state,
    save_checkpoint,
)


def test_save_keeps_newest_and_orders_by_step(tmp_path: Path) -> None:
    for step in (5, 10, 15, 20):
        save_checkpoint({"model": {"step": step}}, tmp_path, checkpoint_name(step // 5, step), keep=2)
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
