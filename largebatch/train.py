"""``python -m largebatch.train [overrides]``: the main training job (see largebatch.cli).

Under the launch scripts the exit code and the error line are also written for the script
(see :mod:`largebatch.launch.exit_code`), which passes the code on instead of torchrun's
generic 1 and prints the line again after torchrun's own report, as the last thing the user sees.
"""

import sys

from largebatch.cli import run_command
from largebatch.launch.exit_code import report_exit_code

if __name__ == "__main__":
    code, line = run_command()
    if line:
        print(line, file=sys.stderr)
    report_exit_code(code, line)
    sys.exit(code)
