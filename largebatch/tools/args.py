"""The argument parser of the command-line tools: a bad flag is one line and exit code 2."""

from __future__ import annotations

import argparse
from typing import Any, NoReturn

from largebatch import __version__

__all__ = ["OneLineArgumentParser"]


class OneLineArgumentParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose errors are ``PROG: error: MESSAGE`` alone (no usage
    block) with exit code 2, like the training command line's errors; ``--version`` prints
    the package's version, as ``largebatch-train --version`` does."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.add_argument("--version", action="version", version=f"largebatch {__version__}")

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")
