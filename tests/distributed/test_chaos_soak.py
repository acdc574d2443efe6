"""The chaos soak, seeded and bounded: random interruptions of a 2-rank job end in the
uninterrupted run's checkpoints, and nothing of the job outlives its launcher (issue 54).

A random signal (SIGKILL, SIGTERM, SIGINT, SIGHUP) to a random part of the job (a rank, the
torchrun agent, the launch shell, its process group, every process), each followed by
``resume=auto``: the last checkpoints of both runs are bit-identical (weights and optimizer state).
The long soak (41 interruptions) is ``python -m tests.distributed.chaos`` and the slow test here.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.distributed.chaos import run_soak


def _check(workdir: Path, interruptions: int, seed: int) -> None:
    report = run_soak(workdir, interruptions, seed)
    summary = f"{report.counts()}; log: {(workdir / 'soak.log').read_text()[-2000:]}"
    assert len(report.interruptions) == interruptions, summary
    assert not report.survivors, f"processes outlived their launcher: {report.survivors}; {summary}"
    assert report.compared_steps == 3 and not report.differing, (report.differing, summary)


def test_eight_random_interruptions_end_bit_identical(tmp_path: Path) -> None:
    _check(tmp_path, interruptions=8, seed=33)


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("LARGEBATCH_LONG_SOAK") != "1",
                    reason="the long soak takes ~15 min: LARGEBATCH_LONG_SOAK=1 runs it")
def test_the_long_soak(tmp_path: Path) -> None:
    _check(tmp_path, interruptions=41, seed=1)
