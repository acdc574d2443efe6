"""XLA:CPU replicas that are threads of one process: the measures that keep them from deadlocking.

``PJRT_DEVICE=CPU CPU_NUM_DEVICES=n`` (the multi-replica tests, a laptop try-out) runs the n
replicas as threads of one process, and XLA:CPU collectives abort ("Termination timeout ...
of 10 seconds") unless every replica launches the same graph shortly after the others. The
measures, taken only there (never on TPU, GPU or a single device):

* ``XLA_THREAD_POOL_SIZE`` at least :data:`MIN_CPU_THREAD_POOL` and
  ``XLA_ENABLE_PARAM_ALIASING=0`` (:func:`prepare_xla_environment`, before the runtime starts;
  the launcher and ``XlaBackend`` call it);
* every graph launch (``torch_xla.sync()``: step end, loader step, host collectives) takes
  :func:`launch_turn`: wait for the device's previous graph, then hold one process-wide lock,
  so replicas compile one at a time and the later ones hit the compilation cache;
* a plain torch-xla program (no largebatch backend) gets the same for its own
  ``torch_xla.sync()`` calls through a wrapped step marker
  (:func:`serialise_threaded_cpu_syncs`, applied by the grouped-BN reducer it asks for).

Measured with torch-xla 2.9.0 on XLA:CPU; see ``tests/xla/test_cpu_thread_measures.py``.
This module imports ``torch_xla`` lazily, and only where a caller already runs XLA.
"""

from __future__ import annotations

import contextlib
import os
import threading
from typing import Any, Iterator

__all__ = [
    "MIN_CPU_THREAD_POOL",
    "launch_turn",
    "prepare_xla_environment",
    "serialise_threaded_cpu_syncs",
    "threaded_cpu_replicas",
]

# Replicas of XLA:CPU share one process: their collectives need at least this many runtime
# threads (4 replicas deadlock with the default pool).
MIN_CPU_THREAD_POOL = 16

# One lock per process around graph launches of threaded XLA:CPU replicas (see above).
_SYNC_LOCK = threading.RLock()


def _cpu_device_count() -> int:
    try:
        return max(1, int(os.environ.get("CPU_NUM_DEVICES", "1") or 1))
    except ValueError:
        return 1


def prepare_xla_environment() -> None:
    """Set what the XLA runtime reads when it starts; call before ``torch_xla`` initialises.

    On XLA:CPU with several devices (``PJRT_DEVICE=CPU``, ``CPU_NUM_DEVICES>1``) raise
    ``XLA_THREAD_POOL_SIZE`` to at least :data:`MIN_CPU_THREAD_POOL`. A no-op elsewhere.
    """
    if os.environ.get("PJRT_DEVICE", "").upper() != "CPU" or _cpu_device_count() < 2:
        return
    want = max(MIN_CPU_THREAD_POOL, 4 * _cpu_device_count())
    try:
        have = int(os.environ.get("XLA_THREAD_POOL_SIZE", "0") or 0)
    except ValueError:
        have = 0
    if have < want:
        os.environ["XLA_THREAD_POOL_SIZE"] = str(want)
    # With input/output buffer aliasing (donation) a graph that updates tensors in place (BN
    # running statistics, optimizer state) executes inside torch_xla.sync(), under the sync
    # lock, so its all-reduce waits for replicas that cannot launch theirs: the rendezvous
    # aborts after 10 s. Without aliasing the launch returns at once. (Measured here with
    # torch-xla 2.9.0; costs only memory, and only on XLA:CPU test replicas.)
    os.environ["XLA_ENABLE_PARAM_ALIASING"] = "0"


_threaded: list[bool] = []  # the answer, once the runtime has given it (it cannot change)


def threaded_cpu_replicas() -> bool:
    """Replicas are threads of this process on XLA:CPU (``CPU_NUM_DEVICES>1``): never on TPU."""
    if not _threaded:
        import torch_xla.runtime as xr

        _threaded.append((xr.device_type() or "").upper() == "CPU" and xr.addressable_device_count() > 1)
    return _threaded[0]


_real_devices: dict[str, str] = {}


def _wait_for_previous_graph(device: Any) -> None:
    import torch_xla.core.xla_model as xm

    key = str(device)
    if key not in _real_devices:
        _real_devices[key] = xm.xla_real_devices([device])[0]
    xm.wait_device_ops([_real_devices[key]])


@contextlib.contextmanager
def launch_turn(device: Any) -> Iterator[None]:
    """Hold this replica's turn to launch a graph on ``device``; a no-op unless replicas are threads.

    torch-xla launches a graph only after the device's previous one finished. That wait
    happens before taking the lock: the previous graph's all-reduce waits for the other
    replicas, which could not launch theirs while this one held the lock.
    """
    if not threaded_cpu_replicas():
        yield
        return
    _wait_for_previous_graph(device)
    with _SYNC_LOCK:
        yield


_step_marker_patched = [False]


def serialise_threaded_cpu_syncs() -> None:
    """In a plain torch-xla program on threaded XLA:CPU, take the backend's measures itself.

    The user's ``torch_xla.sync()`` (also ``xm.mark_step()``, ``MpDeviceLoader``) goes through
    ``torch_xla._XLAC._xla_step_marker``; wrapped here, once per process, it launches in
    :func:`launch_turn`, and buffer aliasing is turned off (module docstring). Without this,
    4 replicas compile at once and the first graph's all-reduce aborts after 10 s. Nothing
    is changed anywhere else (TPU, GPU, one CPU device).
    """
    if not threaded_cpu_replicas():
        return
    os.environ["XLA_ENABLE_PARAM_ALIASING"] = "0"
    with _SYNC_LOCK:
        if _step_marker_patched[0]:
            return
        import torch_xla

        launch = torch_xla._XLAC._xla_step_marker

        def serialised_step_marker(device: str, *args: Any, **kwargs: Any) -> Any:
            with launch_turn(device):
                return launch(device, *args, **kwargs)

        torch_xla._XLAC._xla_step_marker = serialised_step_marker
        _step_marker_patched[0] = True
