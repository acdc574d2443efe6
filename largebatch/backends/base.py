"""The backend contract: everything the training loop needs from a device/communication stack.

A backend knows its rank, world size and device; it all-reduces, wraps the model for data
parallelism, steps the optimizer (where the stack needs a say, as XLA does), moves batches
to the device and opens the precision context. The training loop talks only to this
contract, so the same loop runs on one CPU process, N gloo processes, N GPUs under NCCL and
N TPU/XLA replicas. Which other modules may name CUDA, process groups or torch_xla, and why:
the vendor rule in ``largebatch/backends/__init__.py``.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, ContextManager, Iterable, Iterator, NamedTuple, Optional

import torch
from torch import nn

if TYPE_CHECKING:
    from largebatch.comm.ddp_hooks import CommState
    from largebatch.diagnostics.noise_scale import LocalNormTap

__all__ = ["Backend", "WrappedModel"]


class WrappedModel(NamedTuple):
    """What :meth:`Backend.wrap_model` makes: the model as the loop calls it, the local
    gradient norm's tap for the gradient noise scale (None unless asked for and available), and
    the DDP comm hook's state, its byte and collective counters (None where no hook of ours
    reduces the gradients)."""

    model: nn.Module
    local_norm_tap: Optional[LocalNormTap] = None
    comm_state: Optional[CommState] = None


class Backend(ABC):
    """Rank, world, device and collectives of one training process (or XLA replica)."""

    name: str = "base"
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        """True on the rank that writes logs, TensorBoard and checkpoints (rank 0)."""
        return self.rank == 0

    # -- life cycle ----------------------------------------------------------------------
    def start(self) -> None:  # noqa: B027 - optional hook
        """Join the process group (or runtime); a no-op at world size 1."""

    def shutdown(self) -> None:  # noqa: B027 - optional hook
        """Leave the process group."""

    # -- collectives ---------------------------------------------------------------------
    @abstractmethod
    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """Return the sum of ``tensor`` over all ranks (the input may be reused)."""

    @abstractmethod
    def barrier(self) -> None:
        """Wait until every rank gets here."""

    @abstractmethod
    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        """Return rank ``src``'s ``obj`` on every rank (small picklable objects only)."""

    def all_gather_object(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order, on every rank (small picklable objects only)."""
        if self.world_size == 1:
            return [obj]
        raise NotImplementedError(f"the {self.name} backend gathers no objects")

    # -- device generator ----------------------------------------------------------------
    def device_rng_state(self) -> Optional[torch.Tensor]:
        """This rank's device generator state (dropout, drop-path on the device), or None
        where the device draws from the CPU generator (CPU, and XLA here)."""
        return None

    def set_device_rng_state(self, state: torch.Tensor) -> None:
        """Restore what :meth:`device_rng_state` returned, on this rank's device."""
        raise NotImplementedError(f"the {self.name} backend has no device generator")

    @abstractmethod
    def bn_reducer(self, group_size: int) -> Any:
        """The ``GroupReducer`` of this rank's BN group of ``group_size`` ranks."""

    # -- model, optimizer, data ----------------------------------------------------------
    def prepare_model(self, model: nn.Module, *, channels_last: bool = False) -> nn.Module:
        """Move the model to the device (and memory format)."""
        model = model.to(self.device)
        if channels_last:
            model = model.to(memory_format=torch.channels_last)
        return model

    @abstractmethod
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
        """Wrap for data parallelism (DDP where the stack uses it).

        The keywords are the ``comm`` config (``largebatch.config.schema``): gradient bucket
        size in MiB, all-reduce algorithm, wire compression and ranks per node (None: the
        launcher's ``LOCAL_WORLD_SIZE``). A backend ignores those its stack has no use for.
        ``tap_local_norm``: also record the squared norm of each rank's local gradient before it
        is reduced, for the gradient noise scale, and return the tap that gives it as the result's
        ``local_norm_tap`` (a :class:`~largebatch.diagnostics.noise_scale.LocalNormTap`:
        ``largebatch.comm.SquaredNormTap`` under DDP, ``largebatch.backends.xla.XlaLocalNormTap``
        on XLA replicas). A backend that cannot (or has one rank) returns None there. Where a comm
        hook of ours reduces the gradients, its state (``largebatch.comm.CommState``, the byte and
        collective counters) is the result's ``comm_state``.
        """

    def no_sync(self, model: nn.Module) -> ContextManager:
        """Context in which backward does not communicate (inner accumulation micro-steps)."""
        sync_off = getattr(model, "no_sync", None)
        return sync_off() if callable(sync_off) else contextlib.nullcontext()

    def optimizer_step(self, optimizer: torch.optim.Optimizer, scaler: Optional[Any]) -> None:
        """Step the optimizer (through the loss scaler when there is one)."""
        if scaler is not None:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()

    def to_device(self, batch: Any, *, channels_last: bool = False) -> Any:
        """Move a batch (tensor or tuple of tensors) to the device."""
        non_blocking = self.device.type != "cpu"

        def move(t: Any) -> Any:
            if not isinstance(t, torch.Tensor):
                return t
            t = t.to(self.device, non_blocking=non_blocking)
            if channels_last and t.dim() == 4:
                t = t.contiguous(memory_format=torch.channels_last)
            return t

        if isinstance(batch, (tuple, list)):
            return type(batch)(move(t) for t in batch)
        return move(batch)

    def wrap_loader(self, loader: Iterable, *, channels_last: bool = False) -> Iterable:
        """Iterate a loader with batches delivered on the device."""
        return _DeviceLoader(loader, self, channels_last)

    def mark_step(self) -> None:  # noqa: B027 - optional hook
        """End of one training step (XLA cuts and runs its graph here)."""

    def synchronize(self) -> None:  # noqa: B027 - optional hook
        """Wait for queued device work (for wall-clock timing only)."""

    def autotune_kernels(self, enabled: bool) -> None:  # noqa: B027 - optional hook
        """Let the device library time its kernels and keep the fastest per input shape
        (cuDNN's ``benchmark``: the ``backend.cudnn_benchmark`` setting); a stack without
        such a switch ignores it."""

    # -- precision -----------------------------------------------------------------------
    def autocast(self, dtype: Optional[torch.dtype]) -> ContextManager:
        """Autocast context for ``dtype`` (None: full fp32)."""
        if dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=dtype)

    def supports_bf16(self) -> bool:
        return False

    def grad_scaler(self, enabled: bool, init_scale: float, growth_interval: int) -> Any:
        """A dynamic loss scaler for fp16 (None when disabled)."""
        if not enabled:
            return None
        return torch.amp.GradScaler(
            self.device.type, init_scale=init_scale, growth_interval=growth_interval
        )

    def describe(self) -> str:
        return (
            f"{self.name} rank {self.rank}/{self.world_size} "
            f"(local {self.local_rank}/{self.local_world_size}) on {self.device}"
        )


class _DeviceLoader:
    """Wraps a loader so each batch arrives on the backend's device; keeps ``len``."""

    def __init__(self, loader: Iterable, backend: Backend, channels_last: bool) -> None:
        self.loader = loader
        self.backend = backend
        self.channels_last = channels_last

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator:
        for batch in self.loader:
            yield self.backend.to_device(batch, channels_last=self.channels_last)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loader, name)
