"""The line and code the torchrun agent writes for a rank a signal killed (largebatch.launch.torchrun).

A rank dies of a stop signal only while its interpreter is still starting (from its first line
of Python on, every stop is a save and exit 75): the chaos soak met it 2 times in 34 stop
signals (129, 143). That is a stop with nothing to save: 75. SIGKILL stays a failure, 137.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from largebatch.launch.torchrun import _report_killed


@pytest.mark.parametrize("name", ["SIGTERM", "SIGINT", "SIGHUP"])
def test_a_rank_a_stop_signal_killed_as_it_started_is_a_stop(tmp_path: Path, name: str) -> None:
    _report_killed(str(tmp_path), 0, 1, name)
    code, line = (tmp_path / "exit-0-1").read_text().splitlines()
    assert code == "75"
    assert line == (f"largebatch: preempted: {name} reached rank 1 as it started, before the first step; "
                     "nothing to save yet: rerun the same command (resume=auto)")


def test_a_rank_sigkill_killed_is_a_failure_that_names_it(tmp_path: Path) -> None:
    _report_killed(str(tmp_path), 2, 0, "SIGKILL")
    code, line = (tmp_path / "exit-2-0").read_text().splitlines()
    assert code == "137" and line.startswith("largebatch: error: rank 0 was killed by SIGKILL")


def test_a_rank_that_wrote_its_own_code_keeps_it(tmp_path: Path) -> None:
    (tmp_path / "exit-0-0").write_text("75\nlargebatch: preempted: ...\n")
    _report_killed(str(tmp_path), 0, 0, "SIGTERM")
    assert (tmp_path / "exit-0-0").read_text() == "75\nlargebatch: preempted: ...\n"
