"""Every file a run writes fails well (issue 32 item 1): one line naming the file and the
errno, exit 74 (a run directory that cannot be written at the start: exit 2), no traceback,
and the checkpoints that can still be written are written.

Each failure is real: a tiny tmpfs (ENOSPC) or a read-only bind mount (EROFS) placed on
the one file or folder under test, so the checkpoints beside it stay writable. Mounting
needs CAP_SYS_ADMIN (root in most containers); without it the tests skip, saying so.
"""

from __future__ import annotations

import errno
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from largebatch.engine.checkpoint import checkpoint_step, list_checkpoints
from tests.smoke import smoke

RUN = smoke("model=resnet10t", "precision=fp32", "log_every=1", "checkpoint.keep=0")  # 4 steps per epoch, 2 epochs: 8 steps


def _sh(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), capture_output=True, text=True)


@pytest.fixture()
def mounts() -> Iterator[list[Path]]:
    made: list[Path] = []
    yield made
    for path in reversed(made):
        _sh("umount", "-l", str(path))


def _can_mount(tmp: Path) -> bool:
    probe = tmp / "mount-probe"
    probe.mkdir()
    ok = _sh("mount", "-t", "tmpfs", "-o", "size=4k", "tmpfs", str(probe)).returncode == 0
    if ok:
        _sh("umount", str(probe))
    return ok


def _tiny_tmpfs(tmp: Path, mounts: list[Path], *, free_pages: int) -> Path:
    """A tmpfs with ``free_pages`` 4 KiB pages left (a filler file takes the rest of 2)."""
    if not _can_mount(tmp):
        pytest.skip("cannot mount a tmpfs here (needs CAP_SYS_ADMIN); the failing writes need one")
    fs = tmp / "tinyfs"
    fs.mkdir()
    assert _sh("mount", "-t", "tmpfs", "-o", "size=8k", "tmpfs", str(fs)).returncode == 0
    mounts.append(fs)
    (fs / "filler").write_bytes(b"x" * 4096 * (2 - free_pages))
    return fs


def _bind(src: Path, dst: Path, mounts: list[Path], *, read_only: bool = False) -> None:
    assert _sh("mount", "--bind", str(src), str(dst)).returncode == 0
    mounts.append(dst)
    if read_only:
        assert _sh("mount", "-o", "remount,ro,bind", str(dst)).returncode == 0


def _train(tmp: Path, run: Path, *extra: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, LARGEBATCH_CACHE=str(tmp / "cache"))
    return subprocess.run([sys.executable, "-m", "largebatch.train", *smoke(f"run_dir={run}", *extra, base=RUN)],
                          capture_output=True, text=True, timeout=600, env=env)


def _one_line(proc: subprocess.CompletedProcess, code: int) -> str:
    err = proc.stderr.strip()
    assert proc.returncode == code, (proc.returncode, err[-3000:])
    assert "Traceback" not in proc.stdout + proc.stderr, (proc.stdout + proc.stderr)[-3000:]
    assert "\n" not in err and err.startswith("largebatch: error: "), err
    return err


def _file_on_tiny_fs(tmp: Path, run: Path, name: str, mounts: list[Path], *, free_pages: int, pad: int = 0) -> Path:
    """``run/name`` is a file of a tiny tmpfs (``pad`` bytes already in it)."""
    fs = _tiny_tmpfs(tmp, mounts, free_pages=free_pages)
    (fs / name).write_text(("{" + '"pad": "' + "x" * max(pad - 12, 0) + '"}\n') if pad else "")
    run.mkdir(parents=True, exist_ok=True)
    (run / name).touch()
    _bind(fs / name, run / name, mounts)
    return run / name


@pytest.mark.parametrize("name", ["metrics.jsonl", "mlperf_log.jsonl"])
def test_a_full_disk_under_a_log_stops_with_a_checkpoint_and_exit_74(
    tmp_path: Path, mounts: list[Path], name: str
) -> None:
    run = tmp_path / "run"
    path = _file_on_tiny_fs(tmp_path, run, name, mounts, free_pages=1, pad=3900)
    err = _one_line(_train(tmp_path, run, "tensorboard=false"), 74)
    assert f"{path}: [Errno {errno.ENOSPC} ENOSPC]" in err and "resume=auto" in err, err
    saved = list_checkpoints(run / "checkpoints")
    assert saved and 1 <= checkpoint_step(saved[-1]) < 8, saved  # stopped early, its step saved
    lines = path.read_text().splitlines()  # no half-written line: a resumed run appends whole ones
    assert len(lines) > 1 and all(isinstance(json.loads(line), dict) for line in lines), lines[-1][-200:]


def test_a_full_tensorboard_folder_turns_tensorboard_off_and_training_goes_on(tmp_path: Path, mounts: list[Path]) -> None:
    run = tmp_path / "run"
    fs = _tiny_tmpfs(tmp_path, mounts, free_pages=1)  # the events outgrow 4 KiB in the second epoch (step 27)
    (run / "tensorboard").mkdir(parents=True)
    _bind(fs, run / "tensorboard", mounts)
    proc = _train(tmp_path, run, "tensorboard=true", "data.synthetic.train_per_class=40")  # 20 steps an epoch
    err = _one_line(proc, 74)
    assert "cannot write TensorBoard events" in err and f"[Errno {errno.ENOSPC} ENOSPC]" in err, err
    assert str(run / "tensorboard") in err and "turned off" in err, err
    turned_off = re.findall(r"TensorBoard was turned off at step (\d+)", proc.stdout)
    assert len(turned_off) == 1 and 0 < int(turned_off[0]) < 40, proc.stdout[-3000:]  # mid-run, logged once
    assert [checkpoint_step(p) for p in list_checkpoints(run / "checkpoints")] == [20, 40]
    assert (run / "summary.json").is_file()


def test_a_read_only_summary_file_exits_74_after_the_last_checkpoint(tmp_path: Path, mounts: list[Path]) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "summary.json").write_text("{}\n")
    _bind(run / "summary.json", run / "summary.json", mounts, read_only=True)
    if _sh("sh", "-c", f": > {run / 'summary.json'}").returncode == 0:
        pytest.skip("a read-only bind mount does not stop writes here")
    err = _one_line(_train(tmp_path, run, "tensorboard=false"), 74)
    assert f"{run / 'summary.json'}: [Errno {errno.EROFS} EROFS]" in err, err
    assert [checkpoint_step(p) for p in list_checkpoints(run / "checkpoints")] == [4, 8]


def test_a_full_disk_under_config_yaml_exits_74_naming_it(tmp_path: Path, mounts: list[Path]) -> None:
    run = tmp_path / "run"
    path = _file_on_tiny_fs(tmp_path, run, "config.yaml", mounts, free_pages=0)
    err = _one_line(_train(tmp_path, run, "tensorboard=false"), 74)
    assert f"cannot write the config {path}: [Errno {errno.ENOSPC} ENOSPC]" in err, err


def test_a_full_disk_under_the_run_directory_names_the_file(tmp_path: Path, mounts: list[Path]) -> None:
    fs = _tiny_tmpfs(tmp_path, mounts, free_pages=0)
    err = _one_line(_train(tmp_path, fs / "run", "tensorboard=false"), 2)
    assert "None" not in err and f"{fs / 'run' / '.write-test'}: [Errno {errno.ENOSPC} ENOSPC]" in err, err


def test_a_full_disk_under_train_log_turns_it_off_with_one_line(tmp_path: Path, mounts: list[Path]) -> None:
    run = tmp_path / "run"
    path = _file_on_tiny_fs(tmp_path, run, "train.log", mounts, free_pages=1, pad=3900)
    proc = _train(tmp_path, run, "tensorboard=false")
    assert proc.returncode == 0 and "Logging error" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.stdout.count(f"cannot write the run log {path}: [Errno {errno.ENOSPC} ENOSPC]") == 1, proc.stdout[-3000:]
    assert [checkpoint_step(p) for p in list_checkpoints(run / "checkpoints")] == [4, 8]


@pytest.mark.parametrize("where", ["under_a_file", "read_only"])
def test_an_unwritable_cache_on_the_first_run_exits_74_naming_it(tmp_path: Path, mounts: list[Path], where: str) -> None:
    """Issue 54 item 5a: the embedded data set is written into ``LARGEBATCH_CACHE`` on the first
    run; a cache there is no writing into was an OSError traceback and exit 1. Root writes
    through permissions, so the cache is under a file (ENOTDIR) or on a read-only bind mount
    (EROFS: what the issue's user met)."""
    if where == "under_a_file":
        (tmp_path / "a-file").write_text("")
        cache, code, detail = tmp_path / "a-file" / "cache", errno.ENOTDIR, f" ({tmp_path / 'a-file'} is a file)"
    else:
        cache, code, detail = tmp_path / "ro-cache", errno.EROFS, ""
        cache.mkdir()
        if not _can_mount(tmp_path):
            pytest.skip("cannot bind-mount here (needs CAP_SYS_ADMIN)")
        _bind(cache, cache, mounts, read_only=True)
        if _sh("mkdir", str(cache / "probe")).returncode == 0:
            pytest.skip("a read-only bind mount does not stop writes here")
    run = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "largebatch.train", *smoke(f"run_dir={run}", base=RUN)],
                          capture_output=True, text=True, timeout=600, env=dict(os.environ, LARGEBATCH_CACHE=str(cache)))
    err = _one_line(proc, 74)
    name = errno.errorcode[code]
    assert f"cannot write the embedded data set to {cache}/synthetic-" in err, err
    assert f"(LARGEBATCH_CACHE={cache}): [Errno {code} {name}] " in err and detail in err, err
    assert "set LARGEBATCH_CACHE to a writable folder, or data.root=" in err, err
    assert not run.exists()  # the data comes before the run directory
