"""The project's error for bad user input.

A library check whose message is written for the user (an optimizer option the optimizer
does not take, a BN group size that does not divide the world, an fp16 run on XLA) raises
:class:`UsageError`. The command line turns it into one line and exit status 2; any other
exception is a bug and keeps its traceback. It subclasses ``ValueError``, so code that calls
the library directly may keep catching ``ValueError``.
"""

from __future__ import annotations

__all__ = ["UsageError"]


class UsageError(ValueError):
    """A setting that cannot work; the message says which and how to fix it."""
