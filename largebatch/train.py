"""``python -m largebatch.train [overrides]``: the main training job (see largebatch.cli).

Under the launch scripts the exit code and the error line are also written for the script
(see :mod:`largebatch.launch.exit_code`), which passes the code on instead of torchrun's
generic 1 and prints the line once for all ranks, as the last thing the user sees.
"""

import os
import sys

from largebatch.launch.lifetime import start_rank

if __name__ == "__main__":
    start_rank(command_line=True)  # before the imports below (seconds of torch): a stop while they run is a stop too

from largebatch.cli import run_command  # noqa: E402
from largebatch.launch.exit_code import LINE_BY_LAUNCHER, report_exit_code
from largebatch.launch.lifetime import EXIT_PEER_LOST  # noqa: E402

if __name__ == "__main__":
    code, line = run_command()
    # Under launch/*.sh the script prints the line once for all ranks (LARGEBATCH_LINE_BY_LAUNCHER)
    if line and not os.environ.get(LINE_BY_LAUNCHER):
        print(line, file=sys.stderr)
    if code != EXIT_PEER_LOST:  # the rank that ended (or the agent, for a killed one) reports why
        report_exit_code(code, line)
    sys.exit(code)
