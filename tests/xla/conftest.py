"""XLA:CPU set-up for the tests of this folder.

Only where torch-xla is installed (``.venv-xla``): the pytest process becomes one XLA:CPU
device (``PJRT_DEVICE=CPU``, a single device); multi-replica tests start their own
subprocess with ``CPU_NUM_DEVICES=4``. In the main environment nothing is changed, so the
other tests of a shared pytest run never see ``PJRT_DEVICE``.
"""

from __future__ import annotations

import importlib.util
import os

if importlib.util.find_spec("torch_xla") is not None:
    os.environ.setdefault("PJRT_DEVICE", "CPU")
    os.environ.pop("CPU_NUM_DEVICES", None)  # this process: one device
    # Start this process's XLA device before any test runs autograd on the CPU: the autograd
    # engine sizes its per-device queues on the first backward, and an XLA device that appears
    # later trips an internal assert (seen when the replica tests' CPU references ran first).
    import torch_xla

    torch_xla.device()
