"""Worker exit codes for the launch scripts.

torchrun exits 1 whenever a worker fails, whatever the worker's reason. The scripts in
``launch/`` set ``LARGEBATCH_EXIT_DIR``; each worker writes its exit code to
``<dir>/exit-<restart>-<rank>`` (its error line, if any, on the second line) and the script
then exits with the documented code (75 preempted, 2 bad input, 3 non-finite, 4 out of
memory, 74 a run file write failed) instead of torchrun's 1, printing that line last, after torchrun's failure report.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

__all__ = ["ENV", "LINE_BY_LAUNCHER", "report_exit_code"]

ENV = "LARGEBATCH_EXIT_DIR"
# set by launch/lib.sh: it prints the ranks' one line once, so a rank does not print its own
LINE_BY_LAUNCHER = "LARGEBATCH_LINE_BY_LAUNCHER"


def report_exit_code(code: int, line: Optional[str] = None) -> None:
    """Write ``code`` (and the one error ``line``) for the launch script when it asked for it
    (``LARGEBATCH_EXIT_DIR``)."""
    directory = os.environ.get(ENV)
    if not directory:
        return
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or "0"
    rank = os.environ.get("RANK", "0") or "0"
    try:
        Path(directory).mkdir(parents=True, exist_ok=True)
        (Path(directory) / f"exit-{restart}-{rank}").write_text(f"{code}\n" + (f"{line}\n" if line else ""))
    except OSError:
        pass  # the exit code itself still reaches torchrun
