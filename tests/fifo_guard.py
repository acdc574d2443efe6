"""A FIFO planted in a data set, and a guard that counts every attempt to open it.

Opening a FIFO for reading waits for a writer, forever: code under test that opens one would
hang the suite. :func:`watched_fifo` makes the FIFO and, while the block runs, a thread opens
its write end whenever a reader is waiting (a non-blocking open succeeds only then), which
releases the reader at once with an empty read. So the code that opens it finishes (it sees an
empty file) and the test fails on ``opens`` instead of hanging.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from pathlib import Path
from typing import Iterator


class FifoOpens:
    """``count``: how often the guard found a reader holding or waiting on the FIFO (0: never opened)."""

    count = 0


@contextlib.contextmanager
def watched_fifo(path: Path, poll_s: float = 0.01) -> Iterator[FifoOpens]:
    os.mkfifo(path)
    opens = FifoOpens()
    done = threading.Event()

    def release_readers() -> None:
        while not done.is_set():
            try:
                fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)  # ENXIO: no reader waiting
            except OSError:
                time.sleep(poll_s)
                continue
            opens.count += 1
            os.close(fd)  # the reader reads 0 bytes: end of file

    watcher = threading.Thread(target=release_readers, name="fifo-guard", daemon=True)
    watcher.start()
    try:
        yield opens
    finally:
        done.set()
        watcher.join(timeout=5)
