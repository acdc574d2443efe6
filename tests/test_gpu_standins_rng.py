"""The device generator's restore at one rank (issue 53), with CUDA's generator calls stood in.

A checkpoint of more ranks than this run has gives rank k the state of rank k % writers (the
old restore raised IndexError past the visible GPUs); one of the old form (rank 0's list of
all its GPUs) restores rank 0's own GPU only. Several ranks: tests/distributed/test_device_rng.py.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.distributed.test_device_rng import _StandInGenerators


def _one_rank_on_gpu_0(monkeypatch: pytest.MonkeyPatch) -> tuple[_StandInGenerators, Any]:
    from largebatch.backends.torch_dist import TorchDistributedBackend

    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    cuda = _StandInGenerators(seed=0)
    cuda.install(monkeypatch.setattr)
    backend = TorchDistributedBackend("cpu")
    backend.kind, backend.device = "cuda", torch.device("cuda", 0)
    return cuda, backend


def test_fewer_ranks_than_the_writer_take_rank_k_mod_writers(monkeypatch: pytest.MonkeyPatch, caplog: Any) -> None:
    from largebatch.engine.rng_state import capture_rng_state, restore_rng_state

    cuda, backend = _one_rank_on_gpu_0(monkeypatch)
    writers = [torch.Generator().manual_seed(s).get_state() for s in (5, 6)]
    state = capture_rng_state() | {"device": writers}
    restore_rng_state(state, backend)  # the old restore raised IndexError past the visible GPUs
    assert torch.equal(cuda.get_rng_state(backend.device), writers[0])
    assert "the device generators of 2 ranks, this run has 1" in caplog.text


def test_a_checkpoint_of_the_old_form_restores_rank_0s_gpu_only(monkeypatch: pytest.MonkeyPatch) -> None:
    from largebatch.engine.rng_state import capture_rng_state, restore_rng_state

    cuda, backend = _one_rank_on_gpu_0(monkeypatch)
    old = [torch.Generator().manual_seed(s).get_state() for s in (5, 6)]  # rank 0's get_rng_state_all()
    restore_rng_state(capture_rng_state() | {"cuda": old}, backend)
    assert torch.equal(cuda.get_rng_state(0), old[0]) and not torch.equal(cuda.get_rng_state(1), old[1])


def test_a_cuda_rank_captures_its_own_gpus_generator_and_resumes_from_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from largebatch.engine.rng_state import capture_rng_state, restore_rng_state

    cuda, backend = _one_rank_on_gpu_0(monkeypatch)
    cuda.draw(0, 3)  # GPU 0's generator has moved on from the seed
    state = capture_rng_state(backend)
    assert len(state["device"]) == 1 and torch.equal(state["device"][0], cuda.get_rng_state(0))
    expected = cuda.draw(0, 4)
    cuda.draw(0, 5)
    restore_rng_state(state, backend)
    assert cuda.draw(0, 4) == expected
