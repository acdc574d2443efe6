"""Backends: the device and communication stacks behind one contract, :class:`Backend`.

The vendor rule (``tests/test_vendor_boundary.py`` holds it). The vendor modules ``torch.cuda``,
``torch.backends``, ``torch.accelerator``, ``torch.mps``, ``torch.xpu``, ``torch.mtia``,
``torch.distributed``, ``torch_xla`` and ``nvidia`` (DALI) are named in ``backends/``, and
outside it only where the job is the vendor's, in these modules:

* ``comm/reducers.py`` (torch.distributed, torch_xla): grouped BN's one collective on each runtime;
* ``comm/ddp_hooks.py`` (torch.distributed): DDP's communication hooks;
* ``comm/xla_cpu_threads.py`` (torch_xla): XLA:CPU replicas that are threads of one process;
* ``nn/sync_bn.py`` (torch.distributed): the ``ProcessGroup`` torch's SyncBatchNorm takes;
* ``engine/ema.py`` (torch.distributed): that ``ProcessGroup`` set aside while the model is copied;
* ``launch/xla.py`` (torch_xla): it starts ``torch_xla.launch``;
* ``launch/torchrun.py`` (torch.distributed): it is torchrun;
* ``data/background.py`` (torch.cuda): host-to-GPU copies on a side stream, the current GPU's index;
* ``data/pipelines/nvjpeg.py`` (torch.cuda): GPU decode, an event on nvJPEG's stream;
* ``data/pipelines/dali_graph.py``, ``dali_files.py``, ``dali_shards.py`` (nvidia): DALI's decode.

Everything else reaches the device through :class:`Backend` (device, collectives, the device
generator's state, kernel autotuning, ...). Device-type strings (``device.type == "cuda"``) are
data, not calls into a stack, and are outside the rule.
"""

from __future__ import annotations

import os

import torch

from largebatch.backends.base import Backend
from largebatch.errors import UsageError

__all__ = ["Backend", "build_backend", "resolve_backend_name"]


def resolve_backend_name(name: str) -> str:
    """``auto`` -> ``xla`` when PJRT_DEVICE is set, ``cuda`` when a GPU is visible, else ``cpu``."""
    if name != "auto":
        return name
    if os.environ.get("PJRT_DEVICE"):
        return "xla"
    return "cuda" if torch.cuda.is_available() else "cpu"


def build_backend(name: str = "auto", *, timeout_s: int = 1800) -> Backend:
    """Create (not start) the backend named ``auto|cpu|cuda|xla``."""
    name = resolve_backend_name(name)
    if name in ("cpu", "cuda"):
        from largebatch.backends.torch_dist import TorchDistributedBackend

        return TorchDistributedBackend(name, timeout_s=timeout_s)
    if name == "xla":
        from largebatch.backends.xla import XlaBackend

        return XlaBackend(timeout_s=timeout_s)
    raise UsageError(f"unknown backend {name!r}; choose auto, cpu, cuda or xla")
