"""``largebatch-train``: the command line; the only code that composes the config from arguments.

``largebatch-train [--cfg job] [-m] [key=value ...]`` (also ``python -m largebatch.train``)
composes ``conf/train.yaml`` with Hydra and runs one training job (``largebatch.run.run``),
or a sweep of them with ``-m`` (``largebatch.multirun``). The command line itself (Hydra's
flags, ``hydra.run.dir``) is ``largebatch.config.command_line``.

Exit codes are ``largebatch.errors``'s table (0 done, 2 bad input, 3 non-finite loss, 4 a step out
of memory, 74 a file of the run could not be written, 75 preempted after saving, 130 a second Ctrl-C); every exception is
mapped by ``largebatch.errors.exit_code`` alone, and one it does not know (a bug) keeps its
traceback.
"""

from __future__ import annotations

import os
import sys
from typing import Optional, Sequence

from largebatch import __version__
from largebatch.launch.lifetime import EXIT_PEER_LOST, peer_lost
from largebatch.errors import (  # noqa: F401  (EXIT_*: the codes, importable from the CLI as before)
    EXIT_INTERRUPTED, EXIT_IO_ERROR, EXIT_NON_FINITE, EXIT_OK, EXIT_PREEMPTED, EXIT_USAGE, error_line, exit_code,
)

__all__ = ["main", "run_command"]


def _train_once(overrides: Sequence[str]) -> int:
    from largebatch.config import compose_config, to_train_config
    from largebatch.config.command_line import single_run_overrides
    from largebatch.run import run

    raw = compose_config(single_run_overrides(overrides))
    run(to_train_config(raw), raw)
    return EXIT_OK


def run_command(argv: Optional[Sequence[str]] = None) -> tuple[int, Optional[str]]:
    """``largebatch-train``'s work: the exit code, and the one line for stderr when it is not 0
    because of an error :func:`largebatch.errors.exit_code` knows (a bug raises)."""
    from largebatch.config.command_line import multirun_overrides, parse_command_line, show

    args = list(sys.argv[1:] if argv is None else argv)
    if "--version" in args:
        print(f"largebatch {__version__}")
        return EXIT_OK, None
    try:
        opts = parse_command_line(args)
        if opts.help or opts.hydra_help or opts.cfg or opts.info:
            show(opts)
            return EXIT_OK, None
        if opts.multirun:
            from largebatch.multirun import run_multirun

            return run_multirun(multirun_overrides(opts.overrides)), None
        return _train_once(opts.overrides), None
    except BaseException as e:  # KeyboardInterrupt too: a second Ctrl-C is exit 130
        code = exit_code(e)
        if code is None and peer_lost(e):  # another rank ended: its line says why, not a traceback here
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            return EXIT_PEER_LOST, f"largebatch: error: rank {os.environ.get('RANK', '?')} stopped: another rank of the job ended ({first[:200]})"
        if code is None:
            raise  # a bug: keep its traceback
        return code, error_line(e)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``largebatch-train [--cfg job] [-m] [key=value ...]``: compose the config and run it (or sweep it)."""
    from largebatch.launch.lifetime import start_rank

    # a stop before training exits 75 (not 143) where this is the process's command line (argv
    # None) or a torchrun rank; under torchrun it also ends with the agent
    start_rank(command_line=argv is None)
    code, line = run_command(argv)
    if line:
        print(line, file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
