"""``python -m largebatch.train [overrides]``: the main training job (see largebatch.cli).

Under the launch scripts the exit code is also written for the script (see
:mod:`largebatch.launch.exit_code`), which passes it on instead of torchrun's generic 1.
"""

import sys

from largebatch.cli import main
from largebatch.launch.exit_code import report_exit_code

if __name__ == "__main__":
    code = main()
    report_exit_code(code)
    sys.exit(code)
