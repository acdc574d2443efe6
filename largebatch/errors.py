"""The project's error types and the one map from an exception to an exit code.

Every error a user can cause or meet has a type here, so a caller can catch it and the
command lines (``largebatch-train``, its ``-m`` sweeps, ``python -m largebatch.launch.xla``)
turn it into one line and an exit code through :func:`exit_code` alone. Any other exception
is a bug and keeps its traceback. Each type keeps the base class it always had (``except
ValueError`` in a caller behaves the same) and stays importable from the module that raises
it (``largebatch.data.pipelines.torchvision.DataError``, ...). This module imports nothing of the project.

Exit codes:

* 0 (``EXIT_OK``): the run finished (or stopped at ``max_steps`` / its target).
* 2 (``EXIT_USAGE``): bad input (config key or type, batch sizes, data folders, run
  directory, a checkpoint that does not fit the run): one line on stderr naming the problem
  and the fix, no traceback.
* 3 (``EXIT_NON_FINITE``): the loss became NaN/inf (``non_finite=stop``, or more than
  ``max_skipped_steps`` skipped steps with ``non_finite=skip``); the message names the step
  and the rank.
* 4 (``EXIT_OUT_OF_MEMORY``): a training step could not allocate its tensors (CUDA out of
  memory, the CPU allocator's "can't allocate memory"): the line names the step, the
  per-device batch and the training side, and what to lower; the checkpoints written before
  are intact: with a larger ``accumulation_steps`` ``resume=auto`` continues from the last one
  (:class:`StepOutOfMemoryError`).
  An out-of-memory kill by the kernel (137) comes with no line: nothing is left to print it.
* 74 (``EXIT_IO_ERROR``, sysexits' EX_IOERR): a file of the run could not be written (disk
  full, quota, read-only file system, I/O error): a checkpoint, ``config.yaml``,
  ``metrics.jsonl``, ``mlperf_log.jsonl``, the TensorBoard events or ``summary.json``
  (:class:`WriteError`), or the embedded data set into its cache (``LARGEBATCH_CACHE``) on the
  first run; the line names the file (or folder) and the errno. A partial checkpoint is
  removed and the earlier checkpoints are intact (the line says how many, or that the run has
  none to resume from); a failed run file stops the run after a
  checkpoint of its last step: free space, then ``resume=auto``.
* 75 (``EXIT_PREEMPTED``, sysexits' EX_TEMPFAIL: "try again later"): SIGTERM, SIGINT or
  SIGHUP (a closed terminal, a dropped ssh session: :data:`STOP_SIGNALS`) arrived; every
  rank finished the same step and a checkpoint was saved, so rerunning with
  ``resume=auto run_dir=<same>`` continues. Distinct from 143 (128 + SIGTERM), which means
  the process was killed before it could save.
* 130 (``EXIT_INTERRUPTED``): a second Ctrl-C interrupted without saving (one arriving
  during a checkpoint write waits for the write to finish).
"""

from __future__ import annotations

import errno as errno_codes
import os
import signal
from pathlib import Path
from typing import Optional

__all__ = [
    "EXIT_INTERRUPTED", "EXIT_IO_ERROR", "EXIT_NON_FINITE", "EXIT_OK", "EXIT_OUT_OF_MEMORY", "EXIT_PREEMPTED",
    "EXIT_USAGE", "STOP_SIGNALS", "USER_ERRORS", "CheckpointError", "CheckpointSaveError", "ConfigError", "DataError",
    "EvalOutOfMemoryError",
    "ModelError", "NonFiniteLossError", "Preempted", "ReplicaError", "ReportError", "RunDirError", "RunFileError",
    "StepOutOfMemoryError", "TooFewSamplesError", "UsageError", "WriteError", "error_line", "exit_code", "os_error_text",
]

EXIT_OK = 0
EXIT_USAGE = 2
EXIT_NON_FINITE = 3
EXIT_OUT_OF_MEMORY = 4
EXIT_IO_ERROR = 74
EXIT_PREEMPTED = 75
EXIT_INTERRUPTED = 130

# The signals that stop a run resumably (step, save, EXIT_PREEMPTED), wherever one is handled:
# a scheduler's preemption or time limit (TERM), Ctrl-C (INT), a closed terminal or a dropped
# ssh session (HUP, which would otherwise kill the run with 129 and lose its work).
STOP_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class UsageError(ValueError):
    """A setting that cannot work; the message says which and how to fix it.

    A library check whose message is written for the user (an optimizer option the
    optimizer does not take, a BN group size that does not divide the world, an fp16 run on
    XLA) raises it. It subclasses ``ValueError``, so code that calls the library directly
    may keep catching ``ValueError``.
    """


class ConfigError(ValueError):
    """A config that cannot be composed: unknown key, wrong type, unknown option."""


class DataError(ValueError):
    """A data set that cannot be used as it is; the message names the path and the fix."""


class TooFewSamplesError(DataError):
    """A training split too small for one full batch on every rank; ``num_samples`` is its size.

    Raised where the batch is cut (the samplers, the packed-shard reader), which know the
    per-rank batch only; ``largebatch.run`` restates it in terms of ``global_batch_size``.
    """

    def __init__(self, message: str, *, num_samples: int) -> None:
        super().__init__(message)
        self.num_samples = num_samples


class ModelError(ValueError):
    """A model name or option that cannot be built."""


class RunDirError(UsageError):
    """The run directory cannot be used (unwritable, or in use by another live run)."""


class ReportError(ValueError):
    """An input that is not a readable run directory; the message names it."""


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be read or does not fit the run."""


class WriteError(RuntimeError):
    """Writing a file of the run failed with an OSError (disk full, quota, read-only, I/O error).

    ``path`` is the file that was being written (None only on a rank that learnt of rank 0's
    failure) and ``errno`` the error number; the message names both (:func:`os_error_text`).
    """

    def __init__(self, message: str, *, path: Optional[Path], errno: Optional[int]) -> None:
        super().__init__(message)
        self.path = path
        self.errno = errno


class CheckpointSaveError(WriteError):
    """Writing a checkpoint failed: the temporary file is gone, the earlier checkpoints are untouched."""


class RunFileError(WriteError):
    """Writing a run file other than a checkpoint failed (config.yaml, metrics.jsonl,
    mlperf_log.jsonl, the TensorBoard events, summary.json)."""


def os_error_text(err: OSError, path: str | os.PathLike) -> str:
    """``<file>: [Errno 28 ENOSPC] No space left on device``, naming the file even when the
    OSError does not (a failed ``write()`` carries no file name)."""
    code = err.errno
    name = errno_codes.errorcode.get(code, "?") if code is not None else "?"
    return f"{err.filename or os.fspath(path)}: [Errno {code} {name}] {err.strerror or err}"


class NonFiniteLossError(RuntimeError):
    """The training loss became NaN or infinite (names the step and the rank)."""


class StepOutOfMemoryError(RuntimeError):
    """A training step could not allocate its tensors (reading its batch, forward, backward or
    the optimizer step): ``step`` (1-based: the step that failed), ``epoch`` (0-based) and
    ``per_device_batch`` (the images one device held in a micro-batch) locate it, ``cause``
    says what could not be allocated.

    Raised by the loop (:class:`largebatch.engine.loop.Trainer`), which knows the step but not
    the settings behind it; ``largebatch.run`` restates it with the training side and the
    setting to lower.
    """

    def __init__(self, message: str, *, step: int, epoch: int, per_device_batch: int, cause: str) -> None:
        super().__init__(message)
        self.step = step
        self.epoch = epoch
        self.per_device_batch = per_device_batch
        self.cause = cause  # the failed allocation in a few words


class EvalOutOfMemoryError(StepOutOfMemoryError):
    """An evaluation could not allocate its tensors: ``epoch`` (1-based here: the epoch just
    trained, whose evaluation failed), ``step`` the steps trained, ``per_device_batch`` the
    images of one evaluation batch. The epoch's checkpoint is saved before it is raised
    (:class:`largebatch.engine.hooks.EvalHook`); exit code 4 as a step's."""


class Preempted(Exception):
    """The run stopped on SIGTERM/SIGINT/SIGHUP after saving a checkpoint (resumable).

    ``signal_name`` is the signal that stopped it (``"SIGTERM"``), or None where this process
    did not get one (a rank that stopped because another rank was signalled).
    """

    def __init__(self, message: str, *, signal_name: Optional[str] = None) -> None:
        super().__init__(message)
        self.signal_name = signal_name


class ReplicaError(RuntimeError):
    """An XLA replica stopped on one of the errors above; carries its exit code and line."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(code, message)
        self.code = code
        self.message = message

    def __str__(self) -> str:
        return self.message


# Bad input: one line and EXIT_USAGE. RunDirError is a UsageError.
USER_ERRORS: tuple[type[BaseException], ...] = (
    UsageError, ConfigError, DataError, CheckpointError, ModelError, ReportError,
)


def exit_code(exc: BaseException) -> Optional[int]:
    """The exit code for ``exc``, or ``None`` when it is a bug (the caller re-raises it)."""
    if isinstance(exc, ReplicaError):
        return exc.code
    if isinstance(exc, WriteError):
        return EXIT_IO_ERROR
    if isinstance(exc, USER_ERRORS):
        return EXIT_USAGE
    if isinstance(exc, NonFiniteLossError):
        return EXIT_NON_FINITE
    if isinstance(exc, StepOutOfMemoryError):
        return EXIT_OUT_OF_MEMORY
    if isinstance(exc, Preempted):
        return EXIT_PREEMPTED
    if isinstance(exc, KeyboardInterrupt):
        return EXIT_INTERRUPTED
    return None


def error_line(exc: BaseException) -> str:
    """The one line a command line prints to stderr for an exception :func:`exit_code` maps."""
    if isinstance(exc, ReplicaError):
        return exc.message
    if isinstance(exc, Preempted):
        return f"largebatch: preempted: {exc}"
    if isinstance(exc, KeyboardInterrupt):
        return "largebatch: interrupted"
    return f"largebatch: error: {exc}"
