"""The run directory: one live run at a time (a lock naming the owner), stale locks taken
over, orphaned checkpoint temp files removed, ``resume=auto`` without ``run_dir`` explained."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from largebatch.cli import main
from tests.smoke import smoke

FAST = smoke("max_steps=1")

_HOLDER = """
import os, sys, time
from pathlib import Path
from largebatch.engine.run_dir import RunDirLock
lock = RunDirLock(Path(sys.argv[1]))
if sys.argv[2] == "fork" and os.fork() == 0:  # a child like a DataLoader worker, outliving it
    time.sleep(30)
    os._exit(0)
print("locked", flush=True)
time.sleep(120)
"""


def _hold_lock(run: Path, fork: bool = False) -> subprocess.Popen:
    run.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER, str(run), "fork" if fork else "-"],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_a_second_live_run_on_the_same_directory_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run = tmp_path / "run"
    holder = _hold_lock(run)
    try:
        assert main([*FAST, f"run_dir={run}"]) == 2
    finally:
        holder.kill()
        holder.wait()
    err = capsys.readouterr().err.strip()
    assert err.startswith("largebatch: error:") and "\n" not in err and "Traceback" not in err
    assert f"in use by a live run (host {socket.gethostname()}, pid {holder.pid})" in err
    assert not (run / "config.yaml").exists() and not (run / "checkpoints").exists()


def test_a_stale_lock_is_taken_over_and_released_at_the_end(tmp_path: Path) -> None:
    """The holder dies (SIGKILL) while a forked child of it (a loader worker) still lives."""
    run = tmp_path / "run"
    holder = _hold_lock(run, fork=True)
    os.kill(holder.pid, signal.SIGKILL)  # dies holding the lock: its owner line stays
    holder.wait()
    assert json.loads((run / ".lock").read_text())["pid"] == holder.pid
    assert main([*FAST, f"run_dir={run}"]) == 0
    log = (run / "train.log").read_text()
    assert f"pid {holder.pid} was stale (that process is gone); taken over" in log
    assert (run / ".lock").read_text() == ""  # released: the next run starts without a note
    assert main([*FAST, f"run_dir={run}", "resume=auto", "max_steps=2"]) == 0
    assert (run / "train.log").read_text().count("was stale") == 1


def test_orphaned_checkpoint_temp_files_are_removed_at_start(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    for i in range(5):
        (run / "checkpoints" / f".ckpt-e0000-s00000000{i}.pt.abc{i}.tmp").write_bytes(b"\0" * 2**20)
    assert main([*FAST, f"run_dir={run}"]) == 0
    assert not list((run / "checkpoints").glob(".*.tmp"))
    assert "removed 5 temporary file(s) (5.0 MiB) of interrupted checkpoint writes" in (run / "train.log").read_text()


def test_a_bare_resume_auto_continues_the_newest_unfinished_run_of_this_config(tmp_path: Path) -> None:
    """Issue 90 case 2: a run stopped early in runs/rn50 (a name the docs suggest) beside an older
    finished one: a bare resume=auto continued neither before (a new run, naming the finished one
    by its folder-name pattern); now it continues runs/rn50 and says so in one line."""
    import json

    from largebatch.engine.checkpoint import checkpoint_step, list_checkpoints

    out = tmp_path / "runs"
    assert main([*FAST, f"output_root={out}", "max_steps=null"]) == 0  # finished: <time>-resnet10t
    (finished,) = list(out.iterdir())
    assert main([*FAST, f"output_root={out}", "seed=1", f"run_dir={out / 'other'}", "max_steps=1"]) == 0
    assert main([*FAST, f"output_root={out}", f"run_dir={out / 'rn50'}", "max_steps=2"]) == 0  # stopped early
    before = {p.name for p in out.iterdir()}
    assert main([*FAST, f"output_root={out}", "resume=auto", "max_steps=null"]) == 0
    assert {p.name for p in out.iterdir()} == before  # no new run directory
    log = (out / "rn50" / "train.log").read_text()
    assert f"resume=auto: continuing {(out / 'rn50').resolve()}, the newest unfinished run of this configuration" in log
    assert "resumed from" in log and json.loads((out / "rn50" / "summary.json").read_text())["stop_reason"] is None
    assert checkpoint_step(list_checkpoints(out / "rn50" / "checkpoints")[-1]) > 2
    assert "resume=auto" not in (finished / "train.log").read_text()
    # now every run of this config is finished: a new run, and the line says one of another config waits
    assert main([*FAST, f"output_root={out}", "resume=auto", "max_steps=null"]) == 0
    (new,) = [p for p in out.iterdir() if p.name not in before]
    log = (new / "train.log").read_text()
    assert f"resume=auto: no unfinished run of this configuration under {out}: a new run in {new.resolve()}" in log
    assert "1 unfinished run(s) there have another configuration" in log


class _OneRank:
    is_main = True

    @staticmethod
    def broadcast_object(obj: object) -> object:
        return obj


def test_a_root_owned_mount_is_explained(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """docker run -v "$PWD/runs:/workspace/runs" without runs/: Docker creates it owned by root and
    the job (uid 1000) cannot write it. The error says so and gives the command that works (issue 37)."""
    from largebatch.engine.run_dir import RunDirError, make_run_dir

    def denied(self: Path, *args: object, **kwargs: object) -> None:
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "mkdir", denied)
    with pytest.raises(RunDirError) as raised:
        make_run_dir(run_dir=str(tmp_path / "runs" / "r"), output_root="runs", model_name="m", resume=None,
                     backend=_OneRank())
    text = str(raised.value)
    assert "cannot write the run directory (" in text and "EACCES] Permission denied" in text
    assert "mkdir -p runs" in text and '--user "$(id -u):$(id -g)"' in text
