"""The random generators a checkpoint saves, and puts back on resume.

Part of what is saved (the record: :mod:`largebatch.engine.checkpoint_format`, its ``rng``
part): Python's, NumPy's and torch's CPU generators, and each rank's device generator where
the backend has one. The backend reads and sets the device generator
(``Backend.device_rng_state``): this module names no vendor. Captured by the checkpoint hook
(:mod:`largebatch.engine.hooks`), written by :mod:`largebatch.engine.checkpoint`, restored by
:mod:`largebatch.engine.resume`.
"""

from __future__ import annotations

import logging
import random
from typing import TYPE_CHECKING, Any, Optional

import numpy as np
import torch

if TYPE_CHECKING:
    from largebatch.backends.base import Backend

__all__ = ["capture_rng_state", "restore_rng_state"]

log = logging.getLogger(__name__)


def capture_rng_state(backend: Optional[Backend] = None) -> dict[str, Any]:
    """Python, NumPy and torch CPU generator states, and every rank's device generator, as plain data.

    A collective where the backend has a device generator (CUDA): every rank must call it.
    The host generators are rank 0's, which are every rank's (every rank seeds the same and
    draws from them in step); a device generator is each rank's own (``device``: one state per
    rank, in rank order), since rank k's dropout draws from its own GPU's generator. NumPy's
    key array is stored as a tensor, Python's state as a tuple of ints: what
    ``torch.load(weights_only=True)`` reads back.
    """
    # the dict form holds what the legacy tuple (kind, keys, pos, has_gauss, cached) holds;
    # numpy's stubs type the tuple form as a dict-or-tuple union
    np_state = np.random.get_state(legacy=False)
    mt19937 = np_state["state"]
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": {"kind": np_state["bit_generator"], "keys": torch.from_numpy(mt19937["key"].astype(np.int64)),
                  "pos": int(mt19937["pos"]), "has_gauss": int(np_state["has_gauss"]),
                  "cached_gaussian": float(np_state["gauss"])},
        "torch": torch.get_rng_state(),
    }
    device = backend.device_rng_state() if backend is not None else None
    if backend is not None and device is not None:  # device implies backend (for mypy)
        state["device"] = backend.all_gather_object(device.cpu())  # gpu-only
    return state


def restore_rng_state(state: dict[str, Any], backend: Optional[Backend] = None) -> None:
    """Restore what :func:`capture_rng_state` captured; each rank takes its own device state.

    At another world size than the writer's, rank k takes state ``k % writers`` (the run is
    not the same run then; a warning says so). Checkpoints written before device states were
    kept per rank hold rank 0's list of all its devices (``cuda``): rank 0 takes its device's
    entry, the others keep their seeded generators (the list never held their states).
    """
    random.setstate(state["python"])
    npst = state["numpy"]
    np.random.set_state((npst["kind"], npst["keys"].numpy().astype(np.uint32), npst["pos"],
                         npst["has_gauss"], npst["cached_gaussian"]))
    torch.set_rng_state(state["torch"])
    if backend is None or backend.device_rng_state() is None:
        return
    if "device" in state:  # gpu-only
        states = state["device"]  # gpu-only
        if len(states) != backend.world_size and backend.is_main:  # gpu-only
            log.warning("the checkpoint holds the device generators of %d ranks, this run has %d: "  # gpu-only
                        "rank k takes rank k %% %d's; dropout draws differ from the writer's run",
                        len(states), backend.world_size, len(states))
        backend.set_device_rng_state(states[backend.rank % len(states)])  # gpu-only
    elif "cuda" in state and backend.rank == 0 and backend.device.index is not None:  # gpu-only
        legacy = state["cuda"]  # gpu-only
        if backend.device.index < len(legacy):  # gpu-only
            backend.set_device_rng_state(legacy[backend.device.index])  # gpu-only
