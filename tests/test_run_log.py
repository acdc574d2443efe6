"""The run's log (largebatch/engine/run_log.py): a job run in-process (``largebatch.cli.main()``
from a script or a notebook, twice) leaves no earlier job's ``train.log`` open or written to."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Iterator

import pytest

from largebatch.engine.run_log import log_into_run_dir, setup_logging


@pytest.fixture()
def root() -> Iterator[logging.Logger]:
    """The root logger, its handlers and level put back afterwards (the jobs here replace them)."""
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    yield root
    for h in list(root.handlers):
        root.removeHandler(h)
        if h not in saved[0]:
            h.close()
    for h in saved[0]:  # not an earlier in-process job's log file, which setup_logging closed
        if not isinstance(h, logging.FileHandler) or h.stream is not None:
            root.addHandler(h)
    root.setLevel(saved[1])


def test_a_second_job_closes_the_first_jobs_train_log(tmp_path: Path, root: logging.Logger) -> None:
    setup_logging(True)
    (tmp_path / "a").mkdir()
    log_into_run_dir(tmp_path / "a")
    first = [h for h in root.handlers if isinstance(h, logging.FileHandler)]
    logging.getLogger("largebatch").info("first job")
    setup_logging(True)
    assert len(first) == 1 and first[0].stream is None  # closed, not only detached
    logging.getLogger("largebatch").info("second job")
    (tmp_path / "b").mkdir()
    log_into_run_dir(tmp_path / "b")
    assert "first job" in (tmp_path / "a" / "train.log").read_text()
    assert "second job" not in (tmp_path / "a" / "train.log").read_text()
    assert "second job" in (tmp_path / "b" / "train.log").read_text()


def test_a_train_log_that_cannot_be_written_says_so_once(tmp_path: Path, root: logging.Logger,
                                                         capsys: pytest.CaptureFixture) -> None:
    """Several lines logged before the run directory existed (the data's, the loader's), then a
    train.log every write to which fails (ENOSPC: /dev/full): one console line, not one per
    line handed over, and no later record tries the file again."""
    setup_logging(True)
    for n in range(3):
        logging.getLogger("largebatch").info("before the run directory %d", n)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "train.log").symlink_to("/dev/full")
    log_into_run_dir(tmp_path / "run")
    logging.getLogger("largebatch").info("after")
    out = capsys.readouterr().out
    assert out.count("cannot write the run log") == 1 and "ENOSPC" in out, out
    assert "after" in out and not [h for h in root.handlers if isinstance(h, logging.FileHandler)]
