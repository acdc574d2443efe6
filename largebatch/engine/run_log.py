"""The run's log: console lines on every rank, and rank 0's ``train.log`` in the run directory.

:func:`setup_logging` starts a job's logging (rank 0: INFO, the others: WARNING) and keeps rank
0's records until the run directory exists; :func:`log_into_run_dir` then writes them, and every
later record, to ``<run_dir>/train.log``. The data is built before the run directory is made (a
batch it cannot fill stops the run before anything is written), so ``train.log`` still starts
with the lines logged before. A ``train.log`` that cannot be written (disk full, read-only)
is turned off with one console line naming it; the console has the same lines.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from largebatch.errors import os_error_text

__all__ = ["log_into_run_dir", "setup_logging"]

log = logging.getLogger("largebatch")

_LOG_FORMAT = logging.Formatter("[%(asctime)s %(levelname)s] %(message)s", "%H:%M:%S")


class _RunLogFile(logging.FileHandler):
    """``train.log``: a write that fails (disk full, read-only) turns the file off with one
    console line naming it, instead of logging's traceback for every later record (the
    console has the same lines). Off, it drops every later record: the ones logged before the
    run directory existed are handed to it before it joins the root logger, and each would
    otherwise open the file again and fail again."""

    off = False

    def emit(self, record: logging.LogRecord) -> None:
        if not self.off:
            super().emit(record)

    def handleError(self, record: logging.LogRecord) -> None:
        err = sys.exc_info()[1]
        if not isinstance(err, OSError):
            super().handleError(record)
            return
        self.off = True
        logging.getLogger().removeHandler(self)
        try:
            self.close()
        except OSError:
            pass  # its buffered lines cannot be written either
        log.error("cannot write the run log %s; the log goes on on the console only",
                  os_error_text(err, self.baseFilename))


class _Pending(logging.Handler):
    """Keeps rank 0's records until the run directory exists (:func:`log_into_run_dir`): the
    data is built first, so that a batch it cannot fill stops the run before anything is written."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def setup_logging(is_main: bool) -> None:
    """Console logging (rank 0: INFO, the others: WARNING); rank 0 also keeps the records for train.log."""
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
        if isinstance(h, (_RunLogFile, _Pending)):  # an earlier job's in this process: its file closed
            h.close()
    console = logging.StreamHandler(sys.stdout)
    console.setFormatter(_LOG_FORMAT)
    root.addHandler(console)
    if is_main:
        root.addHandler(_Pending())
    root.setLevel(logging.INFO if is_main else logging.WARNING)


def log_into_run_dir(run_dir: Path) -> None:
    """Rank 0: ``train.log`` in the run directory, starting with the records logged before it existed."""
    root = logging.getLogger()
    pending = [h for h in root.handlers if isinstance(h, _Pending)]
    if not pending:
        return  # not rank 0
    fh = _RunLogFile(run_dir / "train.log")
    fh.setFormatter(_LOG_FORMAT)
    for h in pending:
        root.removeHandler(h)
        for record in h.records:
            fh.handle(record)
    if not fh.off:
        root.addHandler(fh)
