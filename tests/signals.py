"""Helpers of the tests that signal a training run from outside, as a scheduler does."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from largebatch.engine.checkpoint import list_checkpoints


def wait_for_checkpoint(directory: Path, proc: subprocess.Popen, timeout_s: float = 240, poll_s: float = 0.02) -> None:
    """Return once ``directory`` holds a checkpoint: training is under way; fail if ``proc`` ended first."""
    deadline = time.time() + timeout_s
    while not list_checkpoints(directory):
        assert proc.poll() is None, f"training ended before it was signalled: {proc.communicate()}"
        assert time.time() < deadline, f"no checkpoint appeared in {directory}"
        time.sleep(poll_s)
