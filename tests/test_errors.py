"""One error policy: every project error type in ``largebatch.errors``, one ``exit_code``.

The command line, the ``-m`` sweep and the XLA launcher map exceptions through
``exit_code`` alone; the types stay importable from the modules that raise them.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from largebatch import errors
from largebatch.errors import (
    EXIT_INTERRUPTED, EXIT_IO_ERROR, EXIT_NON_FINITE, EXIT_PREEMPTED, EXIT_USAGE, error_line, exit_code,
)

OLD_HOMES = [
    ("largebatch.config", "ConfigError", ValueError),
    ("largebatch.config.compose", "ConfigError", ValueError),
    ("largebatch.data.pipelines.torchvision", "DataError", ValueError),
    ("largebatch.models", "ModelError", ValueError),
    ("largebatch.engine.checkpoint", "CheckpointError", RuntimeError),
    ("largebatch.engine.checkpoint", "CheckpointSaveError", RuntimeError),
    ("largebatch.engine.nonfinite", "NonFiniteLossError", RuntimeError),
    ("largebatch.engine.loop", "NonFiniteLossError", RuntimeError),
    ("largebatch.engine.preemption", "Preempted", Exception),
    ("largebatch.engine.run_dir", "RunDirError", errors.UsageError),
    ("largebatch.report", "ReportError", ValueError),
    ("largebatch.launch.xla", "ReplicaError", RuntimeError),
]


@pytest.mark.parametrize(("module", "name", "base"), OLD_HOMES)
def test_each_type_lives_in_errors_keeps_its_base_and_its_old_import_path(module: str, name: str, base: type) -> None:
    cls = getattr(errors, name)
    assert getattr(importlib.import_module(module), name) is cls
    assert issubclass(cls, base)


def _save_error() -> errors.CheckpointSaveError:
    return errors.CheckpointSaveError("cannot write checkpoint x: [Errno 28]", path=Path("x"), errno=28)


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (errors.UsageError("u"), EXIT_USAGE),
        (errors.ConfigError("c"), EXIT_USAGE),
        (errors.DataError("d"), EXIT_USAGE),
        (errors.ModelError("m"), EXIT_USAGE),
        (errors.RunDirError("r"), EXIT_USAGE),
        (errors.CheckpointError("k"), EXIT_USAGE),
        (errors.ReportError("p"), EXIT_USAGE),
        (errors.NonFiniteLossError("n"), EXIT_NON_FINITE),
        (errors.StepOutOfMemoryError("s", step=1, epoch=0, per_device_batch=8, cause="c"), errors.EXIT_OUT_OF_MEMORY),
        (_save_error(), EXIT_IO_ERROR),
        (errors.RunFileError("cannot write the metrics file m: [Errno 30 EROFS]", path=Path("m"), errno=30), EXIT_IO_ERROR),
        (errors.Preempted("p"), EXIT_PREEMPTED),
        (KeyboardInterrupt(), EXIT_INTERRUPTED),
        (errors.ReplicaError(74, "largebatch: error: x"), 74),
        (ValueError("a bug"), None),
        (RuntimeError("a bug"), None),
        (OSError("a bug"), None),
        (SystemExit(1), None),
    ],
)
def test_exit_code(exc: BaseException, code: int | None) -> None:
    assert exit_code(exc) == code


def test_error_lines_are_one_line_with_the_cli_prefixes() -> None:
    assert error_line(errors.DataError("no images in /d")) == "largebatch: error: no images in /d"
    assert error_line(errors.Preempted("SIGTERM at step 3")) == "largebatch: preempted: SIGTERM at step 3"
    assert error_line(KeyboardInterrupt()) == "largebatch: interrupted"
    assert error_line(errors.ReplicaError(75, "largebatch: preempted: x")) == "largebatch: preempted: x"


def test_errors_imports_nothing_of_the_project() -> None:
    import ast

    tree = ast.parse(Path(errors.__file__).read_text(encoding="utf-8"))
    names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    names += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert not [n for n in names if n.startswith("largebatch")]


# --- the XLA launcher maps a replica's error through exit_code (no torch-xla needed here:
# ``run`` and ``torch_xla.launch`` are replaced; tests/xla runs the real launcher).

@pytest.mark.parametrize(
    ("exc", "code", "line"),
    [
        (_save_error(), 74, "largebatch: error: cannot write checkpoint"),
        (errors.RunFileError("cannot write the config c", path=Path("c"), errno=28), 74,
         "largebatch: error: cannot write the config c"),
        (errors.Preempted("SIGTERM at step 3; checkpoint saved"), 75, "largebatch: preempted: SIGTERM"),
        (errors.NonFiniteLossError("loss is nan at step 2 on rank 0"), 3, "largebatch: error: loss is nan"),
        (errors.DataError("no images"), 2, "largebatch: error: no images"),
    ],
)
def test_xla_launcher_maps_a_replicas_error_to_its_exit_code(
    exc: BaseException, code: int, line: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    import largebatch.launch.xla as launcher
    import largebatch.run

    def failing_run(cfg: object, raw: object) -> None:
        raise exc

    monkeypatch.setattr(largebatch.run, "run", failing_run)
    # torch_xla.launch would call fn(index, *args) on every local device; one device here.
    monkeypatch.setattr(launcher, "launch_replicas", lambda fn, args=(): fn(0, *args))
    assert launcher.main(["debug=smoke"]) == code
    err = capsys.readouterr().err.strip()
    assert err.startswith(line) and "\n" not in err and "Traceback" not in err


def test_xla_launcher_keeps_a_bugs_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    import largebatch.launch.xla as launcher
    import largebatch.run

    def buggy_run(cfg: object, raw: object) -> None:
        raise ValueError("a bug, not bad input")

    monkeypatch.setattr(largebatch.run, "run", buggy_run)
    monkeypatch.setattr(launcher, "launch_replicas", lambda fn, args=(): fn(0, *args))
    with pytest.raises(ValueError, match="a bug"):
        launcher.main(["debug=smoke"])


def test_an_os_error_without_a_file_name_is_named_by_the_caller() -> None:
    import errno

    err = OSError(errno.ENOSPC, "No space left on device")  # what a failed write() raises
    assert errors.os_error_text(err, Path("/r/config.yaml")) == "/r/config.yaml: [Errno 28 ENOSPC] No space left on device"
    named = OSError(errno.EROFS, "Read-only file system", "/r/summary.json")
    assert errors.os_error_text(named, Path("/elsewhere")) == "/r/summary.json: [Errno 30 EROFS] Read-only file system"
