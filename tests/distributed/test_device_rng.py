"""Each rank's device generator (CUDA: dropout, drop-path) is checkpointed and restored as its own.

Rank 0 once saved every device's CUDA state of its own process and every rank restored all of
them (issue 53): rank k's GPU got rank 0's never-used generator for GPU k, so dropout after a
resume differed from the uninterrupted run (and fewer visible GPUs than the writer's raised an
IndexError). Here 2 gloo ranks run the checkpoint's capture and restore with only CUDA's
generator calls stood in: each process sees 2 "GPUs" whose generators are CPU generators.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from tests.distributed.harness import run_ranks

GPUS = 2


class _StandInGenerators:
    """torch.cuda's generator calls over one CPU generator per visible "GPU"."""

    def __init__(self, seed: int) -> None:
        self.gens = [torch.Generator().manual_seed(seed) for _ in range(GPUS)]

    def get_rng_state(self, device: Any = "cuda") -> torch.Tensor:
        return self.gens[torch.device(device).index or 0].get_state()

    def set_rng_state(self, state: torch.Tensor, device: Any = "cuda") -> None:
        self.gens[torch.device(device).index or 0].set_state(state)

    def get_rng_state_all(self) -> list[torch.Tensor]:
        return [g.get_state() for g in self.gens]

    def set_rng_state_all(self, states: list[torch.Tensor]) -> None:
        for g, s in zip(self.gens, states):
            g.set_state(s)

    def draw(self, device: int, n: int) -> list[float]:
        return torch.rand(n, generator=self.gens[device]).tolist()

    def install(self, setattr: Any = setattr) -> None:
        """Stand in for torch.cuda's calls (pass ``monkeypatch.setattr`` inside a test process)."""
        for name in ("get_rng_state", "set_rng_state", "get_rng_state_all", "set_rng_state_all"):
            setattr(torch.cuda, name, getattr(self, name))
        setattr(torch.cuda, "is_available", lambda: True)
        setattr(torch.cuda, "is_initialized", lambda: True)


def _save_and_resume(rank: int, world: int, directory: str) -> dict[str, Any]:
    from largebatch.backends.torch_dist import TorchDistributedBackend
    from largebatch.engine.checkpoint import checkpoint_name, save_checkpoint
    from largebatch.engine.resume import load_latest
    from largebatch.engine.rng_state import capture_rng_state, restore_rng_state

    cuda = _StandInGenerators(seed=0)  # torch.manual_seed seeds every GPU alike
    cuda.install()
    backend = TorchDistributedBackend("cpu")
    backend.kind, backend.device = "cuda", torch.device("cuda", rank)  # rank k on GPU k
    cuda.draw(rank, 5 + 7 * rank)  # the ranks' dropout drew different amounts
    state = capture_rng_state(backend)  # every rank
    if rank == 0:
        save_checkpoint({"model": {}, "rng": state}, directory, checkpoint_name(0, 1))
    backend.barrier()
    expected = cuda.draw(rank, 4)  # what the uninterrupted run draws next
    cuda.draw(rank, 11)
    cuda.draw(1 - rank, 3)  # the other GPU's generator, which this rank never uses
    other = cuda.get_rng_state(torch.device("cuda", 1 - rank)).clone()
    restore_rng_state(load_latest(directory)[1]["rng"], backend)
    return {"expected": expected, "resumed": cuda.draw(rank, 4),
            "other_untouched": torch.equal(other, cuda.get_rng_state(torch.device("cuda", 1 - rank)))}


def test_each_rank_resumes_its_own_device_generator(tmp_path: Path) -> None:
    for rank, r in enumerate(run_ranks(_save_and_resume, 2, str(tmp_path))):
        assert r["resumed"] == r["expected"], f"rank {rank}'s device draws after the resume differ"
        assert r["other_untouched"], f"rank {rank} restored a generator of a GPU it does not use"

