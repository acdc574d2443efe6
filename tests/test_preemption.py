"""SIGTERM during training: the step finishes, a checkpoint is saved, the CLI exits with
EXIT_PREEMPTED (75), and ``resume=auto`` on the same run directory finishes the run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from largebatch.cli import main
from largebatch.errors import EXIT_PREEMPTED
from largebatch.engine.checkpoint import list_checkpoints, load_checkpoint
from tests.signals import wait_for_checkpoint
from tests.smoke import smoke

FAST = smoke(
    "epochs=3",  # 4 steps per epoch: 12 steps
    "checkpoint.every_steps=1",
)


# SIGHUP (a closed terminal, a dropped ssh session) killed the run silently with 129 and lost
# the work since the last checkpoint (issue 43 case 2); it stops a run as SIGTERM does now
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
def test_sigterm_saves_exits_75_and_resume_finishes(tmp_path: Path, sig: signal.Signals) -> None:
    run = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "largebatch.train", *FAST, f"run_dir={run}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ),
    )
    wait_for_checkpoint(run / "checkpoints", proc)  # training is under way
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == EXIT_PREEMPTED == 75, (out, err)
    assert err.strip().startswith("largebatch: preempted:") and "\n" not in err.strip(), err
    assert "resume=auto" in err and "Traceback" not in err
    last = load_checkpoint(list_checkpoints(run / "checkpoints")[-1])
    stopped_at = last["train_state"]["step"]
    assert 1 <= stopped_at < 12
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == stopped_at and summary["stop_reason"].startswith(f"preempted ({sig.name})")

    assert main([*FAST, f"run_dir={run}", "resume=auto"]) == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 12 and summary["epochs"] == 3


def test_ctrl_c_twice_during_a_checkpoint_write_lets_the_write_finish(tmp_path: Path) -> None:
    """Both Ctrl-Cs land while a (ResNet-50 sized, slow) checkpoint is being written: the
    write completes, then the second Ctrl-C interrupts (exit 130), with no traceback."""
    from largebatch.errors import EXIT_INTERRUPTED

    run = tmp_path / "run"
    ckpts = run / "checkpoints"
    proc = subprocess.Popen(
        [sys.executable, "-c", "import signal, sys\n"
         "signal.signal(signal.SIGINT, signal.default_int_handler)  # background shells ignore it\n"
         "from largebatch.cli import main\nsys.exit(main(sys.argv[1:]))",
         *FAST, "model=resnet50", f"run_dir={run}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ),
    )
    deadline = time.time() + 240
    while not list(ckpts.glob(".*.tmp")):
        assert proc.poll() is None, f"training ended before it was signalled: {proc.communicate()}"
        assert time.time() < deadline, "no checkpoint write began"
        time.sleep(0.002)
    proc.send_signal(signal.SIGINT)
    time.sleep(0.1)  # two signals sent at once coalesce into one (the kernel keeps one pending)
    assert list(ckpts.glob(".*.tmp")), "the write ended before the second Ctrl-C"
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == EXIT_INTERRUPTED == 130, (out, err)
    assert "Traceback" not in err and "largebatch: interrupted" in err
    assert "arrived during a checkpoint write" in out + err
    assert not list(ckpts.glob(".*.tmp"))
    assert load_checkpoint(list_checkpoints(ckpts)[-1])["train_state"]["step"] >= 1


def test_after_a_stop_by_signal_the_handlers_ignore_it_delivered_again() -> None:
    """Under load torchrun's agent passed SIGINT on (as SIGTERM) after a rank had saved and put
    the handlers back: the start-up handler then replaced the rank's "checkpoint saved" line
    with "SIGTERM after the run's last checkpoint; nothing more to save". A hook that stopped
    for a signal leaves the stop signals ignored; one that did not puts the previous ones back."""
    from largebatch.engine.preemption import PreemptionHook

    def previous(signum: int, frame: object) -> None:
        raise AssertionError("the previous handler ran")

    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    try:
        for sig in saved:
            signal.signal(sig, previous)
        stopped = PreemptionHook()
        stopped.before_train()
        os.kill(os.getpid(), signal.SIGINT)
        assert stopped.signal_name == "SIGINT"
        stopped.uninstall()
        assert {signal.getsignal(sig) for sig in saved} == {signal.SIG_IGN}
        os.kill(os.getpid(), signal.SIGTERM)  # ignored: this test goes on
        quiet = PreemptionHook()
        for sig in saved:
            signal.signal(sig, previous)
        quiet.before_train()
        quiet.uninstall()
        assert {signal.getsignal(sig) for sig in saved} == {previous}
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


# issue 75 item 6a: largebatch-train run by itself (no launcher) and stopped in its first
# seconds exited 143 with nothing on stderr, where the launch scripts said 75 for the same moment
def test_a_single_process_stopped_as_it_starts_says_nothing_to_save_and_exits_75(tmp_path: Path) -> None:
    train = Path(sys.executable).with_name("largebatch-train")
    proc = subprocess.Popen([str(train), *FAST, f"run_dir={tmp_path / 'run'}"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(0.5)  # imports, well before the first step
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == EXIT_PREEMPTED == 75, (out, err)
    assert err.strip() == ("largebatch: preempted: SIGTERM before the first step; nothing to save yet: rerun the "
                           "same command (resume=auto)")
