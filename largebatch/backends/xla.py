"""torch-xla backend: TPU pods (Ying et al. 2018; Wongpanich et al. 2020), and XLA:CPU for tests.

One replica per XLA device, started by :func:`largebatch.launch.xla.launch_replicas`
(``torch_xla.launch``); rank and world come from ``torch_xla.runtime``. The XLA idioms:

* no DistributedDataParallel: the model stays unwrapped and ``optimizer_step`` all-reduces
  the gradients (mean over replicas) with ``xm.optimizer_step`` just before the update;
* data arrives through ``MpDeviceLoader`` (background host-to-device upload); evaluation
  batches are padded to a fixed size with weight-0 samples, so every step has static shapes
  and every image is still counted exactly once;
* ``mark_step`` cuts and runs the step graph (``torch_xla.sync()``) once per optimizer step;
  nothing in the step reads a tensor back to the host, so after warm-up no step compiles;
* bf16 autocast (``torch.autocast('xla')``), no fp16 and no loss scaling;
* the gradient noise scale's local norm (``wrap_model(tap_local_norm=True)``, world > 1, returns
  it): :class:`XlaLocalNormTap` reads ``.grad`` before ``optimizer_step`` reduces it, so the
  noise-scale hook takes the reduced norm in the optimizer's step pre-hook, after the
  reduction; both are device values of the step graph (no host read, no new graph);
* grouped BN sums over replica groups with ``xm.all_reduce(groups=[[0, 1], [2, 3], ...])``.

XLA:CPU with ``CPU_NUM_DEVICES=n`` (the multi-replica tests) runs the n replicas as threads
of one process; the measures that keep their collectives from aborting live in
``largebatch.comm.xla_cpu_threads`` (every graph launch here takes its ``launch_turn``, a
no-op elsewhere). Graphs are identical on every replica: rank-dependent values enter as device
data (the broadcast masks), host collectives materialise their inputs first, and every
explicit collective names its replica groups (one all-reduce lowering, layout pinned).

A plain torch-xla program (``torch_xla.launch``, no largebatch backend) gets its grouped-BN
reducer from ``largebatch.comm.reducers.xla_group_reducer``, which
``largebatch.nn.convert_group_sync_batchnorm`` calls when the XLA runtime is running.

``torch_xla`` is imported lazily; the other modules that import it are listed by the vendor rule
(``largebatch/backends/__init__.py``).
"""

from __future__ import annotations

import contextlib
import logging
import math
import pickle
from typing import TYPE_CHECKING, Any, ContextManager, Iterable, Iterator, Optional, TypeGuard

import torch
from torch import nn

from largebatch.backends.base import Backend, WrappedModel
from largebatch.comm.reducers import (  # noqa: F401  (the last two: importable from here as before)
    LocalReducer, XlaGroupReducer, resolve_group_size, xla_all_reduce_sum, running_xla_world_size, xla_group_reducer,
)
from largebatch.comm.xla_cpu_threads import (  # noqa: F401  (the first two: importable from here as before)
    MIN_CPU_THREAD_POOL, launch_turn, prepare_xla_environment,
)
from largebatch.errors import UsageError

if TYPE_CHECKING:  # the annotations' types; run time imports them where it uses them (below)
    from torch.utils.data import DataLoader

    from largebatch.data.contract import Loader

__all__ = [
    "XlaBackend",
    "XlaGroupReducer",
    "XlaLocalNormTap",
    "prepare_xla_environment",
    "running_xla_world_size",
    "xla_group_reducer",
    "MIN_CPU_THREAD_POOL",
]

log = logging.getLogger(__name__)


class XlaLocalNormTap:
    """The squared norm of this replica's local gradient, for the gradient noise scale.

    On XLA the gradients stay local in ``.grad`` until :meth:`XlaBackend.optimizer_step`
    all-reduces them (``xm.reduce_gradients``) just before ``optimizer.step()``: :meth:`take`,
    asked after the step's last backward, is the local gradient's squared norm (accumulated
    over the step's micro-batches), and the reduced gradient is in ``.grad`` in the optimizer's
    step pre-hooks (``reduces_in_optimizer_step``). One ``torch._foreach_norm`` in the step
    graph: no host read, no collective.
    """

    reduces_in_optimizer_step = True

    def __init__(self, model: nn.Module) -> None:
        self._params = [p for p in model.parameters() if p.requires_grad]

    def take(self) -> Optional[torch.Tensor]:
        """``|local gradient|²`` now (None: no gradient yet); a 0-dim float32 device tensor."""
        from largebatch.diagnostics.noise_scale import squared_norm

        grads = [p.grad for p in self._params if p.grad is not None]
        return squared_norm(grads) if grads else None


class XlaBackend(Backend):
    """Data parallelism over XLA replicas (TPU cores/chips, or XLA:CPU devices)."""

    name = "xla"

    def __init__(self, *, timeout_s: int = 1800) -> None:
        prepare_xla_environment()  # in case the runtime has not started yet
        import torch_xla
        import torch_xla.runtime as xr

        self.timeout_s = timeout_s  # XLA collectives have no user timeout; kept for the contract
        self.device = torch_xla.device()
        self.device_type = xr.device_type() or "CPU"
        self.rank = xr.global_ordinal()
        self.world_size = xr.world_size()
        self.local_rank = xr.local_ordinal()
        self.local_world_size = xr.local_device_count() if self.world_size > 1 else 1
        self._all_ranks = [list(range(self.world_size))]
        self._reducers: dict[int, Any] = {}

    def _sync(self) -> None:
        import torch_xla

        with launch_turn(self.device):  # threaded XLA:CPU replicas launch one at a time
            torch_xla.sync()

    # -- collectives (host level: they end with a sync; not for use inside a step) -------
    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.world_size == 1:
            return tensor
        self._sync()  # inputs become device data: the collective graph is the same everywhere
        out = xla_all_reduce_sum(tensor, self._all_ranks)
        self._sync()
        return out

    def barrier(self) -> None:
        if self.world_size > 1:
            self.all_reduce_sum(torch.zeros(1, device=self.device)).cpu()

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        """Rank ``src``'s pickled ``obj`` as bytes summed with zeros from the other ranks."""
        if self.world_size == 1:
            return obj
        payload = pickle.dumps(obj) if self.rank == src else b""
        size = int(self.all_reduce_sum(torch.tensor([len(payload)], dtype=torch.int32).to(self.device)).item())
        capacity = 1 << max(6, math.ceil(math.log2(max(size, 1))))  # few distinct shapes
        buf = torch.zeros(capacity, dtype=torch.int32)
        if payload:
            buf[: len(payload)] = torch.frombuffer(bytearray(payload), dtype=torch.uint8).to(torch.int32)
        data = self.all_reduce_sum(buf.to(self.device)).cpu()
        return pickle.loads(data[:size].to(torch.uint8).numpy().tobytes())

    def bn_reducer(self, group_size: int) -> Any:
        size = resolve_group_size(group_size, self.world_size)
        if size not in self._reducers:
            self._reducers[size] = LocalReducer() if size == 1 else XlaGroupReducer(size, self.world_size)
        return self._reducers[size]

    def broadcast_tensors(self, tensors: list[torch.Tensor], src: int = 0) -> None:
        """Overwrite ``tensors`` (on the device) in place with rank ``src``'s values."""
        if self.world_size == 1 or not tensors:
            return
        with torch.no_grad():
            self._sync()
            masks: dict[torch.dtype, torch.Tensor] = {}
            for t in tensors:
                if t.dtype not in masks:
                    # Device data of shape [1], reshaped on the device: a 0-dim upload would be
                    # shared with an equal scalar already in the graph (torch-xla caches scalar
                    # device data by value), giving rank 0 (mask 1) a different graph.
                    mask = torch.tensor([int(self.rank == src)], dtype=t.dtype).to(self.device)
                    masks[t.dtype] = mask.reshape(())
                t.mul_(masks[t.dtype])
            xla_all_reduce_sum(list(tensors), self._all_ranks)
            self._sync()

    # -- model, optimizer, data ----------------------------------------------------------
    def prepare_model(self, model: nn.Module, *, channels_last: bool = False) -> nn.Module:
        """Move to the device and start every replica from rank 0's weights.

        ``channels_last`` is ignored: XLA chooses memory layouts itself. Replicas that are
        threads of one process draw initial weights from one shared generator, so without the
        broadcast they would differ.
        """
        model = model.to(self.device)
        self.broadcast_tensors([*model.parameters(), *model.buffers()])
        return model

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
        """The model itself: gradients are all-reduced in :meth:`optimizer_step`, not by DDP.

        ``bucket_mb`` and ``ranks_per_node`` do not apply (no DDP buckets; XLA's all-reduce).
        ``tap_local_norm`` (world > 1): the result's ``local_norm_tap`` is an :class:`XlaLocalNormTap`
        over the model's parameters; with one replica there is no reduction to tap (None).
        """
        if algorithm != "flat" or compress != "none":
            log.warning(
                "comm.algorithm=%s comm.compress=%s do not apply on XLA (the compiler's all-reduce "
                "runs over the TPU torus); using the plain gradient all-reduce", algorithm, compress
            )
        return WrappedModel(model, XlaLocalNormTap(model) if tap_local_norm and self.world_size > 1 else None)

    def optimizer_step(self, optimizer: torch.optim.Optimizer, scaler: Optional[Any]) -> None:
        """All-reduce the gradients (mean over replicas) and step, inside the step graph."""
        if scaler is not None:
            raise UsageError("loss scaling (precision=fp16) is not supported on XLA; use precision=bf16")
        import torch_xla.core.xla_model as xm

        # reduce_gradients (sum x 1/world over all replicas, explicit groups) + step(); the
        # step's pre-hooks see the reduced .grad (XlaLocalNormTap, the noise scale's big norm).
        xm.optimizer_step(optimizer, groups=self._all_ranks, pin_layout=True)

    def wrap_loader(
        self, loader: Iterable, *, channels_last: bool = False, evaluation: Optional[bool] = None
    ) -> Iterable:
        """Batches uploaded by ``MpDeviceLoader``; evaluation batches padded to a fixed size.

        Args:
            loader: yields ``(images, labels, ...)`` on the host.
            channels_last: ignored on XLA (the compiler chooses layouts).
            evaluation: pad the batches to ``loader.batch_size`` with weight-0 samples and
                yield ``(images, labels, weight)``, the same number of batches on every rank.
                ``None``: a largebatch loader's ``evaluation`` (the loader contract,
                ``largebatch.data.contract.Loader``); a plain ``DataLoader`` is one when its
                sampler is the exact ``ExactShardSampler``.
        """
        if evaluation is None:
            evaluation = _is_evaluation(loader)
        return _XlaLoader(loader, self, evaluation)

    def mark_step(self) -> None:
        self._sync()

    def synchronize(self) -> None:
        import torch_xla.core.xla_model as xm

        xm.wait_device_ops()

    # -- precision -----------------------------------------------------------------------
    def autocast(self, dtype: Optional[torch.dtype]) -> ContextManager:
        if dtype is None:
            return contextlib.nullcontext()
        if dtype != torch.bfloat16:
            raise UsageError(f"XLA autocast supports bfloat16 only, not {dtype}; use precision=bf16")
        return torch.autocast("xla", dtype=torch.bfloat16)

    def supports_bf16(self) -> bool:
        # TPUs (and GPUs) compute bf16 natively; XLA:CPU emulates it, so `auto` keeps fp32.
        return self.device_type in ("TPU", "CUDA")

    def grad_scaler(self, enabled: bool, init_scale: float, growth_interval: int) -> Any:
        if enabled:
            raise UsageError("loss scaling (precision=fp16) is not supported on XLA; use precision=bf16")
        return None

    def describe(self) -> str:
        return f"{super().describe()} [{self.device_type}]"


# ---------------------------------------------------------------------------------------
# data


def _exact_data_loader(loader: Iterable) -> TypeGuard[DataLoader]:
    """A plain ``DataLoader`` reading with the exact evaluation sampler."""
    from torch.utils.data import DataLoader

    from largebatch.data.samplers import ExactShardSampler

    return isinstance(loader, DataLoader) and isinstance(loader.sampler, ExactShardSampler)


def _is_evaluation(loader: Iterable) -> bool:
    from largebatch.data.contract import Loader

    if isinstance(loader, Loader):
        return loader.evaluation
    return _exact_data_loader(loader)


def _eval_batch_count(loader: Loader | Iterable, batch_size: int, world_size: int) -> int:
    """Batches every rank runs: those of the largest exact part (same on all ranks)."""
    from largebatch.data.contract import Loader

    if isinstance(loader, Loader):
        n = loader.total_samples
    elif _exact_data_loader(loader):
        n = loader.sampler.dataset_len
    else:
        return len(loader)
    return math.ceil(math.ceil(n / world_size) / batch_size)


def _template_sample(loader: Loader | Iterable) -> Optional[tuple[torch.Tensor, Any]]:
    """One readable sample of the data set (shapes for the pad batches of an empty part)."""
    dataset = getattr(loader, "dataset", None)
    if dataset is None:
        return None
    for i in range(min(len(dataset), 16)):
        item = dataset[i]
        if item is not None and isinstance(item[0], torch.Tensor):
            return item[0], item[1]
    return None


def padded_eval_batches(loader: Iterable, batch_size: int, num_batches: int) -> Iterator[tuple[torch.Tensor, ...]]:
    """Yield ``(images, labels, weight)`` host batches of exactly ``batch_size`` samples.

    Real samples have weight 1; a short batch is filled up with zero images of label 0 and
    weight 0, and whole weight-0 batches follow until ``num_batches`` were yielded, so every
    rank runs the same static-shape evaluation step the same number of times.
    """
    template: Optional[tuple[torch.Tensor, torch.Tensor]] = None
    done = 0
    for batch in loader:
        images, labels = batch[0], batch[1]
        k = images.shape[0]
        weight = torch.ones(k, dtype=torch.float32)
        if template is None:
            template = (images[:1], labels[:1])
        if k < batch_size:
            pad = batch_size - k
            images = torch.cat([images, images.new_zeros((pad, *images.shape[1:]))])
            labels = torch.cat([labels, labels.new_zeros(pad)])
            weight = torch.cat([weight, weight.new_zeros(pad)])
        done += 1
        yield images, labels, weight
    if done >= num_batches:
        return
    if template is None:
        sample = _template_sample(loader)
        if sample is None:
            return
        template = (sample[0].unsqueeze(0), torch.as_tensor([sample[1]], dtype=torch.int64))
    images = template[0].new_zeros((batch_size, *template[0].shape[1:]))
    labels = template[1].new_zeros(batch_size)
    weight = torch.zeros(batch_size, dtype=torch.float32)
    for _ in range(num_batches - done):
        yield images, labels, weight


class _HostBatches:
    """The host-side iterable handed to ``MpDeviceLoader`` (keeps ``len``)."""

    def __init__(self, loader: Loader | Iterable, evaluation: bool, world_size: int) -> None:
        self.loader = loader
        self.evaluation = evaluation
        self.world_size = world_size
        self.batch_size = getattr(loader, "batch_size", None)

    def __len__(self) -> int:
        if self.evaluation and self.batch_size:
            return _eval_batch_count(self.loader, self.batch_size, self.world_size)
        return len(self.loader)

    def __iter__(self) -> Iterator:
        if self.evaluation and self.batch_size:
            return padded_eval_batches(self.loader, self.batch_size, len(self))
        return iter(self.loader)


class _XlaLoader:
    """Device batches through ``MpDeviceLoader``; forwards ``set_epoch``, ``sampler``, ... ."""

    def __init__(self, loader: Loader | Iterable, backend: XlaBackend, evaluation: bool) -> None:
        self.loader = loader
        self.backend = backend
        self.evaluation = evaluation
        self._host = _HostBatches(loader, evaluation, backend.world_size)

    def __len__(self) -> int:
        return len(self._host)

    def __iter__(self) -> Iterator:
        from torch_xla.distributed.parallel_loader import ParallelLoader

        # One ParallelLoader per pass (what MpDeviceLoader does), closed when the pass ends
        # or is abandoned, so no upload thread outlives its pass.
        parallel = ParallelLoader(self._host, [self.backend.device])
        batches = parallel.per_device_loader(self.backend.device)
        try:
            while True:
                with launch_turn(self.backend.device):  # next() runs torch_xla.sync()
                    try:
                        batch = next(batches)
                    except StopIteration:
                        return
                yield batch
        finally:
            parallel.close()

    def __getattr__(self, name: str) -> Any:
        if name in ("loader", "backend", "evaluation", "_host"):
            raise AttributeError(name)
        return getattr(self.loader, name)
