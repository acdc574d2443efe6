"""``python -m largebatch.launch.torchrun``: torchrun itself (``torch.distributed.run``: the same
arguments, rendezvous, agent and restarts), as the launch scripts start it, minus the wall of text
it adds after the ranks have already said why they stopped.

When a worker exits non-zero, torchrun's agent logs an error per rank and its entry point ends
with a ``ChildFailedError`` traceback and banner (34 lines for one bad override on 2 ranks); a
stop signal ends it with a ``SignalException`` traceback. Under ``launch/*.sh`` every rank has
written its documented exit code and its one line (:mod:`largebatch.launch.exit_code`), and the
script prints that line once, last. So, when the script asked for the codes
(``LARGEBATCH_EXIT_DIR``), the agent's log records are held back and its failure is not re-raised:
printed only where no rank wrote a code (a crash, a kill: then they are the only explanation).
Run without that variable, this is torchrun unchanged.

Under the launch scripts the agent also ends with the launch shell (``prctl(PR_SET_PDEATHSIG,
SIGTERM)``, see :mod:`largebatch.launch.lifetime`): a ``kill -KILL -- -PGID`` of the launch used
to leave the agent and its ranks training unsupervised, holding the run lock. Its ranks end with
it alike (issue 54).
"""

from __future__ import annotations

import logging
import os
import sys
from collections import deque
from pathlib import Path
from typing import Optional, Sequence

from largebatch.launch.exit_code import ENV
from largebatch.launch.lifetime import AGENT_PID, LAUNCHER_PID, die_with_parent, expected_parent

__all__ = ["main"]

_HELD = 2000  # agent records kept for the end (a long elastic job logs a few per restart)


class _Held(logging.Handler):
    """Keeps the agent's records until the end of the run."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: deque[logging.LogRecord] = deque(maxlen=_HELD)

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def _ranks_reported(directory: str) -> bool:
    return any(Path(directory).glob("exit-*-*"))


def main(argv: Optional[Sequence[str]] = None) -> int:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun_main
    from torch.distributed.run import parse_args, run

    args = list(sys.argv[1:] if argv is None else argv)
    directory = os.environ.get(ENV)
    if not directory:
        torchrun_main(args)
        return 0
    if LAUNCHER_PID in os.environ:  # under launch/*.sh: end with the launch shell
        die_with_parent(expected_parent(LAUNCHER_PID))
    os.environ[AGENT_PID] = str(os.getpid())  # the parent each rank expects (largebatch.launch.lifetime)
    held = _Held()
    # torch's own logging set-up gives "torch.distributed" a stderr handler (and no propagation):
    # the agent's records go to the held ones instead
    agent_log = logging.getLogger("torch.distributed")
    agent_log.handlers = [held]
    agent_log.propagate = False
    code, failure = 0, None
    try:
        run(parse_args(args))
    except ChildFailedError as e:
        code, failure = 1, e.format_msg()
    except SignalException as e:
        code = 128 + int(e.sigval)
    if code and not _ranks_reported(directory):
        formatter = logging.Formatter("%(levelname).1s%(asctime)s %(process)d %(name)s] %(message)s")
        for record in held.records:
            print(formatter.format(record), file=sys.stderr)
        if failure:
            print(failure, file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
