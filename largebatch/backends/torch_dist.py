"""torch.distributed backend: NCCL on CUDA GPUs, gloo on CPUs.

Rank and world come from the environment torchrun sets (RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE); without it the run is a single process and no process group is created.
"""

from __future__ import annotations

import datetime
import os
from typing import Any, Optional

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from largebatch.backends.base import Backend, WrappedModel
from largebatch.comm.reducers import destroy_process_groups, process_group_reducer

__all__ = ["TorchDistributedBackend", "cpu_computes_bf16"]


def cpu_computes_bf16() -> bool:
    """Whether this CPU computes bf16 in hardware: AVX-512 BF16 or AMX.

    Not ``torch.ops.mkldnn._is_mkldnn_bf16_supported()``: that is true on any AVX-512 CPU, where
    oneDNN runs bf16 by converting to fp32 and back: on an AVX-512 Xeon without AVX-512 BF16 the
    default run's resnet10t step (batch 64, 32 px, one thread) took 628-636 ms in bf16 against
    381-407 ms in fp32, so ``precision=auto`` picking bf16 there made the default run ~1.6x
    slower. ``torch.cpu``'s probes ask CPUID; where a torch lacks them, the kernel's flags do.
    """
    probes = [getattr(torch.cpu, name, None) for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")]
    answers = [bool(probe()) for probe in probes if callable(probe)]
    if len(answers) == len(probes):
        return any(answers)
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return int(value) if value not in (None, "") else default


def _attempt_store(timeout: datetime.timedelta) -> dict[str, Any]:
    """``init_process_group`` arguments that keep torchrun restarts apart (empty otherwise).

    torchrun's agent serves one TCPStore to every restart of the worker group, and the
    ``env://`` rendezvous does not prefix its keys per attempt; a restarted group can then
    read the previous attempt's keys and hang in process-group creation (seen with gloo,
    intermittently). Prefixing the store with the restart count gives each attempt its own
    keys.
    """
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    if attempt is None:
        return {}
    store, rank, world_size = next(dist.rendezvous("env://", timeout=timeout))
    store = dist.PrefixStore(f"largebatch/attempt_{attempt}", store)
    return {"store": store, "rank": rank, "world_size": world_size}


class TorchDistributedBackend(Backend):
    """Data parallelism with torch.distributed; ``kind`` is ``"cpu"`` (gloo) or ``"cuda"`` (NCCL)."""

    def __init__(self, kind: str, *, timeout_s: int = 1800) -> None:
        if kind not in ("cpu", "cuda"):
            raise ValueError(f"TorchDistributedBackend kind must be cpu or cuda, got {kind!r}")
        self.name = kind
        self.kind = kind
        self.timeout = datetime.timedelta(seconds=timeout_s)
        if dist.is_available() and dist.is_initialized():  # joined by the caller already
            self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        else:
            self.rank, self.world_size = _env_int("RANK", 0), _env_int("WORLD_SIZE", 1)
        self.local_rank = _env_int("LOCAL_RANK", 0)
        self.local_world_size = _env_int("LOCAL_WORLD_SIZE", self.world_size)
        if kind == "cuda":
            if not torch.cuda.is_available():
                raise RuntimeError("backend=cuda was asked for but no CUDA GPU is visible")
            self.device = torch.device("cuda", self.local_rank)  # gpu-only
        else:
            self.device = torch.device("cpu")
        self._reducers: dict[int, Any] = {}
        self._owns_group = False

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def start(self) -> None:
        if self.kind == "cuda":
            torch.cuda.set_device(self.device)  # gpu-only
        if self.distributed and not dist.is_initialized():
            # torch.distributed.nn.functional binds ``group.WORLD`` as a default argument of
            # its functions when first imported (DDP imports it); imported while a group
            # exists, it would keep that group alive until interpreter exit, and shutdown()
            # could never join its worker threads. Imported now, the defaults are None.
            # (imported under another name: a plain ``import torch.distributed...`` here would make
            # ``torch`` a local name of this method, unbound at the set_device call above)
            import torch.distributed.nn.functional as _dist_nn_functional  # noqa: F401

            dist.init_process_group(
                "nccl" if self.kind == "cuda" else "gloo",
                timeout=self.timeout,
                **_attempt_store(self.timeout),
                device_id=self.device if self.kind == "cuda" else None,
            )
            self._owns_group = True

    def shutdown(self) -> None:
        """Destroy the process groups this backend created, while Python is still alive.

        Drops the backend's own reducers, then :func:`destroy_process_groups` (which says why
        a gloo group must not live into interpreter exit). The caller releases its model and
        hooks first, as ``largebatch.run.run`` does.
        """
        if self._owns_group and dist.is_initialized():
            self._reducers.clear()
            destroy_process_groups()
            self._owns_group = False

    # -- collectives ---------------------------------------------------------------------
    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.distributed:
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor

    def barrier(self) -> None:
        if self.distributed:
            if self.kind == "cuda":
                dist.barrier(device_ids=[self.local_rank])  # gpu-only
            else:
                dist.barrier()

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        if not self.distributed:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=src)
        return box[0]

    def all_gather_object(self, obj: Any) -> list[Any]:
        if not self.distributed:
            return [obj]
        gathered: list[Any] = [None] * self.world_size
        dist.all_gather_object(gathered, obj)
        return gathered

    def device_rng_state(self) -> Optional[torch.Tensor]:
        if self.kind != "cuda":
            return None
        return torch.cuda.get_rng_state(self.device)  # gpu-only

    def set_device_rng_state(self, state: torch.Tensor) -> None:
        if self.kind != "cuda":
            raise NotImplementedError("backend=cpu has no device generator: the CPU one is restored with the run")
        torch.cuda.set_rng_state(state, self.device)  # gpu-only

    def bn_reducer(self, group_size: int) -> Any:
        if group_size not in self._reducers:
            self._reducers[group_size] = process_group_reducer(group_size)
        return self._reducers[group_size]

    # -- model ---------------------------------------------------------------------------
    def prepare_model(self, model: nn.Module, *, channels_last: bool = False) -> nn.Module:
        """Move the model to the device; on CPUs, avoid oneDNN's narrow-input bf16 conv bug.

        Strided convolutions become ``NarrowInputConv2d``: one whose input is narrower than
        its stride (a 1x1 map in layer4 of a ResNet on 16 px images) computes in fp32 under
        bf16 autocast, because oneDNN's bf16 weight gradient for it sometimes holds NaN
        (largebatch.nn.narrow_conv; benchmarks/onednn_bf16_narrow_conv_nan.py).
        """
        if self.kind == "cpu":
            from largebatch.nn.narrow_conv import convert_narrow_input_convs

            convert_narrow_input_convs(model)
        return super().prepare_model(model, channels_last=channels_last)

    def wrap_model(
        self,
        model: nn.Module,
        *,
        bucket_mb: float = 25.0,
        algorithm: str = "flat",
        compress: str = "none",
        ranks_per_node: Optional[int] = None,
        tap_local_norm: bool = False,
    ) -> WrappedModel:
        """DistributedDataParallel with gradient bucket views and the configured comm hook, its
        state returned as ``comm_state`` (wrapped by a :class:`~largebatch.comm.SquaredNormTap` with
        ``tap_local_norm``, returned as ``local_norm_tap``); one process: the model itself, no tap."""
        if not self.distributed:
            return WrappedModel(model)
        ddp = DistributedDataParallel(
            model,
            device_ids=[self.local_rank] if self.kind == "cuda" else None,
            bucket_cap_mb=bucket_mb,
            gradient_as_bucket_view=True,
        )
        if tap_local_norm:  # the noise scale's local gradient norm, around the same reduction
            from largebatch.comm.ddp_hooks import register_tapped_comm_hook

            tap, state = register_tapped_comm_hook(
                ddp, algorithm=algorithm, compress=compress, ranks_per_node=ranks_per_node or self.local_world_size,
            )
            return WrappedModel(ddp, tap, state)
        if algorithm != "flat" or compress != "none":
            from largebatch.comm import register_comm_hook

            state = register_comm_hook(
                ddp,
                algorithm=algorithm,
                compress=compress,
                ranks_per_node=ranks_per_node or self.local_world_size,
            )
            return WrappedModel(ddp, comm_state=state)
        return WrappedModel(ddp)

    def synchronize(self) -> None:
        if self.kind == "cuda":
            torch.cuda.synchronize(self.device)  # gpu-only

    def autotune_kernels(self, enabled: bool) -> None:
        if self.kind == "cuda":
            torch.backends.cudnn.benchmark = enabled  # gpu-only

    def supports_bf16(self) -> bool:
        if self.kind == "cuda":
            return torch.cuda.is_bf16_supported()  # gpu-only
        # bf16 where the CPU computes it (AVX-512 BF16, AMX); emulated, it is slower than fp32
        return cpu_computes_bf16()
