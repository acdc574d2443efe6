"""The run's log (largebatch/engine/run_log.py): a job run in-process (``largebatch.cli.main()``
from a script or a notebook, twice) leaves no earlier job's ``train.log`` open or written to."""

from __future__ import annotations

import logging
from pathlib import Path

from largebatch.engine.run_log import log_into_run_dir, setup_logging


def test_a_second_job_closes_the_first_jobs_train_log(tmp_path: Path) -> None:
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    try:
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
    finally:
        for h in list(root.handlers):
            root.removeHandler(h)
            if h not in saved[0]:
                h.close()
        for h in saved[0]:  # not an earlier in-process job's log file, which setup_logging closed
            if not isinstance(h, logging.FileHandler) or h.stream is not None:
                root.addHandler(h)
        root.setLevel(saved[1])
