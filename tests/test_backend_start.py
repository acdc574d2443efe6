"""The CUDA backend's start, run on a CPU machine with CUDA's two calls stood in for.

``start()`` once imported ``torch.distributed.nn.functional`` with a plain ``import``, which
made ``torch`` a local name of the method: on a GPU, ``torch.cuda.set_device`` raised
``UnboundLocalError`` before anything ran (caught by ruff's F823, never by a CPU test).
"""

from __future__ import annotations

import pytest
import torch

from largebatch.backends.torch_dist import TorchDistributedBackend


def test_a_single_process_cuda_backend_starts_on_its_device(monkeypatch: pytest.MonkeyPatch) -> None:
    chosen: list[torch.device] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    backend = TorchDistributedBackend("cuda")
    backend.start()  # one process: no process group to make
    try:
        assert chosen == [torch.device("cuda", 0)] and not backend.distributed
    finally:
        backend.shutdown()
