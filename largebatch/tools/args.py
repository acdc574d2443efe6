"""The argument parser of the command-line tools: a bad flag is one line and exit code 2."""

from __future__ import annotations

import argparse
from typing import NoReturn

__all__ = ["OneLineArgumentParser"]


class OneLineArgumentParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose errors are ``PROG: error: MESSAGE`` alone (no usage
    block) with exit code 2, like the training command line's errors."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")
