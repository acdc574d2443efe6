"""A loader worker whose main process is killed mid-handshake prints nothing (CI of stop 81:
``test_a_rank_killed_by_sigkill_is_one_line_naming_it`` got 15 lines of ``resource_sharer``
traceback from the killed rank's worker above the one line naming the rank).

The worker side is run for real: ``multiprocessing``'s resource-sharer thread serving a file
descriptor, and a peer that resets the connection as a killed main process does."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from largebatch.data.worker_signals import _quiet_when_the_main_process_is_gone

_PROGRAM = textwrap.dedent("""
    import os, socket, struct, sys, time
    from multiprocessing import resource_sharer
    from largebatch.data.worker_signals import ignoring_stop_signals
    if sys.argv[1] == "worker":
        ignoring_stop_signals()(0)  # what the DataLoader runs in each worker
    resource_sharer.DupFd(os.open(os.devnull, os.O_RDONLY))  # a tensor's fd on offer: the thread serves
    peer = socket.socket(socket.AF_UNIX)
    peer.connect(resource_sharer._resource_sharer._address)
    time.sleep(0.2)  # the challenge arrives, unread
    peer.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    peer.close()  # a reset, as the kernel sends for a killed process
    time.sleep(0.5)
    print("served")
""")


@pytest.mark.parametrize("role", ["worker", "plain"])
def test_a_reset_by_a_killed_main_process_is_silent_in_a_worker(role: str) -> None:
    done = subprocess.run([sys.executable, "-c", _PROGRAM, role], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "served", done.stderr[-2000:]
    if role == "worker":
        assert done.stderr == "", done.stderr[-2000:]
    else:  # the traceback the hook removes (without it the test above could not fail)
        assert "resource_sharer.py" in done.stderr and "Error" in done.stderr, done.stderr[-2000:]


def test_other_errors_still_reach_the_previous_hook() -> None:
    seen = []
    try:
        raise ValueError("a bug")
    except ValueError as exc:
        _quiet_when_the_main_process_is_gone(lambda *a: seen.append(a[0]), type(exc), exc, exc.__traceback__)
        _quiet_when_the_main_process_is_gone(lambda *a: seen.append(a[0]), ConnectionResetError,
                                             ConnectionResetError(), exc.__traceback__)  # not the sharer's
    assert seen == [ValueError, ConnectionResetError]
