"""``python -m largebatch.train [overrides]``: the main training job (see largebatch.cli)."""

import sys

from largebatch.cli import main

if __name__ == "__main__":
    sys.exit(main())
