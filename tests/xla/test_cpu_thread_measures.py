"""The XLA:CPU test-replica measures stay out of every other XLA program (TPU, one device).

Buffer aliasing off, a larger runtime thread pool and the process-wide sync lock exist only
because threaded XLA:CPU replicas (``PJRT_DEVICE=CPU``, ``CPU_NUM_DEVICES>1``) abort a
collective whose replicas do not all arrive within 10 s; a TPU program must run as torch-xla
runs it. Also: the public BN conversion sees a running XLA program (here: one device).
"""

from __future__ import annotations

import pytest
from torch import nn

pytestmark = pytest.mark.xla

MEASURED = ("XLA_ENABLE_PARAM_ALIASING", "XLA_THREAD_POOL_SIZE")


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    pytest.importorskip("torch_xla")
    for name in MEASURED:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.mark.parametrize("device, count", [("TPU", None), ("TPU", "4"), ("CPU", None), ("CPU", "1")])
def test_environment_untouched_outside_threaded_cpu(env: pytest.MonkeyPatch, device: str, count) -> None:
    import os

    from largebatch.comm.xla_cpu_threads import prepare_xla_environment

    env.setenv("PJRT_DEVICE", device)
    if count is None:
        env.delenv("CPU_NUM_DEVICES", raising=False)
    else:
        env.setenv("CPU_NUM_DEVICES", count)
    prepare_xla_environment()
    assert all(name not in os.environ for name in MEASURED), f"{device} x {count}: measures applied"


def test_environment_set_for_threaded_cpu_replicas(env: pytest.MonkeyPatch) -> None:
    import os

    from largebatch.comm.xla_cpu_threads import MIN_CPU_THREAD_POOL, prepare_xla_environment

    env.setenv("PJRT_DEVICE", "CPU")
    env.setenv("CPU_NUM_DEVICES", "4")
    prepare_xla_environment()
    assert os.environ["XLA_ENABLE_PARAM_ALIASING"] == "0"
    assert int(os.environ["XLA_THREAD_POOL_SIZE"]) >= MIN_CPU_THREAD_POOL


def test_one_device_gets_no_lock_and_an_untouched_step_marker() -> None:
    """In this process (one XLA:CPU device) the public conversion sees XLA, a world of 1."""
    torch_xla = pytest.importorskip("torch_xla")
    from largebatch.backends.xla import XlaBackend, running_xla_world_size
    from largebatch.comm import xla_cpu_threads
    from largebatch.nn import LocalReducer, convert_group_sync_batchnorm, default_group_reducer

    marker = torch_xla._XLAC._xla_step_marker
    assert running_xla_world_size() == 1
    assert not xla_cpu_threads.threaded_cpu_replicas()
    backend = XlaBackend()
    backend.barrier()  # a launch through launch_turn: no lock taken
    assert xla_cpu_threads._SYNC_LOCK.acquire(blocking=False), "launch_turn left the lock held"
    xla_cpu_threads._SYNC_LOCK.release()
    assert isinstance(default_group_reducer(-1), LocalReducer)
    model = nn.Sequential(nn.BatchNorm2d(3))
    assert convert_group_sync_batchnorm(model, group_size=-1) is model
    with pytest.raises(ValueError, match="does not divide the world size 1"):
        convert_group_sync_batchnorm(model, group_size=2)
    assert torch_xla._XLAC._xla_step_marker is marker, "the step marker was wrapped outside threaded XLA:CPU"
