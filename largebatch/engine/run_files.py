"""Run files other than checkpoints, and what a failed write of one does.

``config.yaml``, ``metrics.jsonl``, ``mlperf_log.jsonl``, the TensorBoard events and
``summary.json`` are written by rank 0. An OSError writing one (disk full, quota, a file
system turned read-only) becomes a :class:`~largebatch.errors.RunFileError` naming the file
and the errno (exit 74). Before training (``config.yaml``, opening the logs) it is raised at
once. During training it is recorded on the trainer (``trainer.failure``) with one log line:
the ranks agree to stop after the current step (``PreemptionHook``), the checkpoint hook
saves that step, and the run then raises it, so the run resumes with ``resume=auto`` once
the disk has room. A failed TensorBoard writer is only turned off: training and checkpoints
go on, and the failure is raised when training ends.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Optional

from largebatch.errors import RunFileError, os_error_text

__all__ = ["AppendLog", "record_failure", "run_file_error"]

log = logging.getLogger("largebatch")

STOPPED = "the run stopped after saving a checkpoint of its last step; free space (or make it writable) and continue with resume=auto"


def run_file_error(what: str, path: str | os.PathLike, err: OSError, then: str) -> RunFileError:
    """``cannot write <what> <file>: [Errno N NAME] <strerror>; <then>``."""
    return RunFileError(f"cannot write {what} {os_error_text(err, path)}; {then}", path=Path(path), errno=err.errno)


def record_failure(trainer: Any, error: Optional[RunFileError]) -> None:
    """Log ``error`` once and keep the first one on the trainer (raised when the loop ends)."""
    if error is None:
        return
    log.error("%s", error)
    if getattr(trainer, "failure", None) is None:
        trainer.failure = error


class AppendLog:
    """A JSONL file opened for appending; the first failed write returns the failure and
    turns the file off (the lines after it are dropped, the run stops after this step).

    A write that failed halfway (disk full) is cut off again, so the file ends with a whole
    line and the resumed run appends whole lines after it (``largebatch-report`` reads it).
    """

    def __init__(self, path: str | os.PathLike, what: str) -> None:
        self.path = Path(path)
        self.what = what
        try:
            self.file: Optional[Any] = open(self.path, "a", encoding="utf-8")
            self.size = self.path.stat().st_size  # the bytes known to be whole lines
        except OSError as e:
            raise run_file_error(what, self.path, e, "nothing was trained; free space (or make it writable) and run again") from None

    def write_line(self, line: str) -> Optional[RunFileError]:
        """Append ``line``; the error of the write that failed first (later ones are dropped)."""
        if self.file is None:
            return None
        text = line + "\n"
        try:
            self.file.write(text)
            self.file.flush()
        except OSError as e:
            self._drop()
            try:
                os.truncate(self.path, self.size)  # frees space: works on a full disk
            except OSError:
                pass  # read-only: the failed write wrote nothing either
            return run_file_error(self.what, self.path, e, STOPPED)
        self.size += len(text.encode("utf-8"))
        return None

    def close(self) -> Optional[RunFileError]:
        if self.file is None:
            return None
        try:
            self.file.close()
            self.file = None
        except OSError as e:
            self._drop()
            return run_file_error(self.what, self.path, e, STOPPED)
        return None

    def set_aside(self, keep: Any, aside: Path) -> int:
        """Move the lines ``keep(line)`` refuses to the end of ``aside`` and rewrite this file
        without them (a new file renamed over it: a stop meanwhile leaves the old or the new,
        whole); returns how many moved. Raises ``RunFileError`` (nothing trained yet)."""
        if self.file is None:
            return 0
        try:
            self.file.flush()
            lines = self.path.read_text(encoding="utf-8").splitlines(keepends=True)
            kept = [line for line in lines if keep(line)]
            if len(kept) == len(lines):
                return 0
            with open(aside, "a", encoding="utf-8") as out:
                out.writelines(line for line in lines if not keep(line))
            partial = self.path.with_name(f".{self.path.name}.tmp")
            partial.write_text("".join(kept), encoding="utf-8")
            self.file.close()
            os.replace(partial, self.path)
            self.file = open(self.path, "a", encoding="utf-8")
            self.size = self.path.stat().st_size
        except OSError as e:
            raise run_file_error(self.what, self.path, e, "nothing was trained; free space (or make it writable) "
                                 "and run again") from None
        return len(lines) - len(kept)

    def _drop(self) -> None:
        file, self.file = self.file, None
        try:
            file.close()
        except OSError:
            pass  # its buffered lines cannot be written either: the failure is already recorded
