"""Group reducers: the one collective grouped BN needs, on every runtime, as a small protocol.

:class:`GroupReducer` is the contract (``size`` and ``all_reduce_sum(tensor)``); this module
holds its implementations and the runtime detection that picks one:

* :class:`LocalReducer`: a group of one rank (local BN, a single process);
* :class:`ProcessGroupReducer`: a ``torch.distributed`` group (gloo, NCCL), with
  :func:`rank_subgroup` creating the groups of consecutive ranks;
* :class:`XlaGroupReducer`: an in-graph ``xm.all_reduce`` over XLA replica groups;
* :func:`default_group_reducer`: whichever the running program has (torch.distributed
  world, XLA replicas, or one rank).

Both ``largebatch.nn`` (the BN layer) and ``largebatch.backends`` (which hand the layer their
reducer) import this leaf module; it imports neither. ``torch_xla`` is imported only inside
calls made where an XLA program is already running.
"""

from __future__ import annotations

import gc
import sys
from typing import Any, Optional, Protocol, cast, runtime_checkable

import torch
import torch.distributed as dist
from torch import Tensor

from largebatch.errors import UsageError

__all__ = [
    "GroupReducer",
    "LocalReducer",
    "ProcessGroupReducer",
    "XlaGroupReducer",
    "default_group_reducer",
    "destroy_process_groups",
    "process_group_reducer",
    "rank_subgroup",
    "release_subgroups",
    "replica_groups",
    "resolve_group_size",
    "running_xla_world_size",
    "xla_all_reduce_sum",
    "xla_group_reducer",
]


@runtime_checkable
class GroupReducer(Protocol):
    """Sum all-reduce over the ranks of one BN group: the only collective grouped BN needs.

    ``size`` is the number of ranks in the group (1: no communication). ``all_reduce_sum``
    returns the element-wise sum of ``tensor`` over the group, with the same shape and dtype,
    on every rank of the group. It may reduce in place; callers use the returned tensor only.
    Every rank of the group calls it the same number of times, in the same order.
    """

    size: int

    def all_reduce_sum(self, tensor: Tensor) -> Tensor: ...


class LocalReducer:
    """Group of one rank: the identity (local BN, or a single-process run)."""

    size = 1

    def all_reduce_sum(self, tensor: Tensor) -> Tensor:
        return tensor


class ProcessGroupReducer:
    """:class:`GroupReducer` over a ``torch.distributed`` process group (gloo, NCCL, ...).

    Args:
        process_group: the group to reduce over; ``None`` is the default (whole world) group.
    """

    def __init__(self, process_group: Optional[dist.ProcessGroup] = None) -> None:
        self.process_group = process_group
        self.size = dist.get_world_size(process_group)

    def all_reduce_sum(self, tensor: Tensor) -> Tensor:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=self.process_group)
        return tensor

    def __deepcopy__(self, memo: dict) -> "ProcessGroupReducer":
        # A process group is a handle, not state: copies of a model (EMA) share it.
        return self

    def __repr__(self) -> str:
        return f"ProcessGroupReducer(size={self.size})"


def resolve_group_size(group_size: int, world_size: int) -> int:
    """Return the group size, with -1 or 0 meaning the whole world; check it divides it."""
    if group_size in (-1, 0):
        return world_size
    if group_size < 0:
        raise UsageError(f"group_size must be positive, or -1/0 for the whole world; got {group_size}")
    if world_size % group_size != 0:
        raise UsageError(
            f"BN group_size {group_size} does not divide the world size {world_size}; "
            f"choose a divisor of {world_size} (or -1 for the whole world)"
        )
    return group_size


# Subgroups must be created by every rank, once: cache them per group size, for the current
# default group (a re-initialized world gets new ones).
_subgroup_cache: dict[int, Optional[dist.ProcessGroup]] = {}
_subgroup_cache_world: list[object] = [None]


def rank_subgroup(group_size: int) -> Optional[dist.ProcessGroup]:
    """Return this rank's process group of ``group_size`` consecutive ranks.

    On first use for a given size, every rank creates every subgroup (a torch.distributed
    requirement), so all ranks must call this with the same sizes in the same order. The
    whole-world size returns ``None`` (the default group). Raises ``UsageError`` (a ValueError) if
    ``group_size`` does not divide the world size.
    """
    world_size = dist.get_world_size()
    group_size = resolve_group_size(group_size, world_size)
    if group_size == world_size:
        return None
    if _subgroup_cache_world[0] is not dist.group.WORLD:
        _subgroup_cache.clear()
        _subgroup_cache_world[0] = dist.group.WORLD
    if group_size not in _subgroup_cache:
        rank, mine = dist.get_rank(), None
        for start in range(0, world_size, group_size):
            ranks = list(range(start, start + group_size))
            group = dist.new_group(ranks)
            if rank in ranks:  # a member gets its group; NON_GROUP_MEMBER (-100) is the others' answer
                mine = cast(dist.ProcessGroup, group)
        _subgroup_cache[group_size] = mine
    return _subgroup_cache[group_size]


def release_subgroups() -> None:
    """Forget the cached subgroups (and the world they belong to) before the world is destroyed.

    A cached group outlives ``destroy_process_group`` and keeps its gloo worker threads alive
    into interpreter exit (see ``TorchDistributedBackend.shutdown``).
    """
    _subgroup_cache.clear()
    _subgroup_cache_world[0] = None


def destroy_process_groups() -> None:
    """Destroy every torch.distributed group, joining their worker threads, while Python lives.

    ``dist.destroy_process_group`` only forgets the groups; each one lives on while anything
    references it (DDP's reducer, the subgroup cache, a model in a reference cycle). A gloo
    group left alive into interpreter exit races it: the worker thread that ran the last
    collective frees that work's tensors just after the caller's ``wait()`` returned, which
    needs the GIL; if the interpreter is finalizing by then the thread is force-exited inside
    a noexcept destructor and the process dies with ``terminate called without an active
    exception`` (SIGABRT) after a finished run (measured: about 1 run in 6 of a 2-rank gloo job on a CPU).
    So forget the cached subgroups, collect the cycles the caller's model and hooks leave
    behind (drop your own references first), then destroy: the last reference goes and
    ``~ProcessGroupGloo`` joins the threads before this returns. Call it instead of
    ``dist.destroy_process_group()`` at the end of a program; a no-op when not initialized.
    """
    release_subgroups()
    if not (dist.is_available() and dist.is_initialized()):
        return
    gc.collect()
    dist.destroy_process_group()
    gc.collect()


def process_group_reducer(group_size: int) -> GroupReducer:
    """Reducer over this rank's group of ``group_size`` ranks in the initialized world.

    World size 1 (or torch.distributed not initialized) and ``group_size=1`` give a
    :class:`LocalReducer`. See :func:`rank_subgroup` for the collective creation rule.
    """
    initialized = dist.is_available() and dist.is_initialized()
    world_size = dist.get_world_size() if initialized else 1
    if resolve_group_size(group_size, world_size) == 1:
        return LocalReducer()
    return ProcessGroupReducer(rank_subgroup(group_size))


def default_group_reducer(group_size: int) -> GroupReducer:
    """Reducer over this rank's group of ``group_size`` ranks of the running program.

    * torch.distributed initialized (torchrun + ``init_process_group``, gloo or NCCL): its
      world, as :func:`process_group_reducer`;
    * otherwise, inside a torch-xla program (``torch_xla.launch`` / ``xmp.spawn``, or a
      torch.distributed world of the ``xla`` backend): the XLA replicas, with an in-graph
      ``xm.all_reduce`` over replica groups (:func:`xla_group_reducer`);
    * otherwise one rank: ``group_size`` 1, -1 or 0 give a :class:`LocalReducer`, any other
      size raises ``ValueError``.

    ``torch_xla`` is looked at only when the program has already imported it.
    """
    initialized = dist.is_available() and dist.is_initialized()
    if _xla_running() and (not initialized or dist.get_backend() == "xla"):
        return xla_group_reducer(group_size)
    if not initialized and group_size > 1:
        raise UsageError(
            f"BN group_size {group_size} needs several ranks, but this program is a single one (world size 1): "
            "initialize torch.distributed first (torchrun + init_process_group), or call this inside "
            "torch_xla.launch(...) on several XLA devices; or use group_size=1"
        )
    return process_group_reducer(group_size)


def _xla_running() -> bool:
    return running_xla_world_size() > 0  # never imports torch_xla


# --------------------------------------------------------------------------- XLA replicas
def replica_groups(group_size: int, world_size: int) -> list[list[int]]:
    """Consecutive replica groups: ``replica_groups(2, 4) == [[0, 1], [2, 3]]``."""
    return [list(range(start, start + group_size)) for start in range(0, world_size, group_size)]


def xla_all_reduce_sum(tensor: Any, groups: list[list[int]]) -> Any:
    """Sum all-reduce of a tensor (returns a new one) or, in place, of a list of tensors.

    Always with explicit groups: ``xm.all_reduce`` lowers a plain whole-world sum through
    another op than a grouped one, and one graph must not mix the two (XLA rejects a module
    with layout-pinned and unpinned all-reduces).
    """
    import torch_xla.core.xla_model as xm

    return xm.all_reduce(xm.REDUCE_SUM, tensor, groups=groups, pin_layout=True)


class XlaGroupReducer:
    """:class:`GroupReducer` over consecutive XLA replica groups.

    ``group_size=2`` on 4 replicas sums over replicas ``[[0, 1], [2, 3]]``. The collective is
    part of the step graph (no host sync), the same graph on every replica.

    Args:
        group_size: replicas per group (divides ``world_size``).
        world_size: number of replicas.
    """

    def __init__(self, group_size: int, world_size: int) -> None:
        if group_size < 1 or world_size % group_size:
            raise UsageError(f"group_size {group_size} must divide the world size {world_size}")
        self.size = group_size
        self.groups = replica_groups(group_size, world_size)

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.size == 1:
            return tensor
        return xla_all_reduce_sum(tensor, self.groups)

    def __deepcopy__(self, memo: dict) -> "XlaGroupReducer":
        return self  # a description of groups, shared by model copies (EMA)

    def __repr__(self) -> str:
        return f"XlaGroupReducer(size={self.size}, groups={self.groups})"


def running_xla_world_size() -> int:
    """Replicas of the XLA program this code runs in, or 0 where none is running.

    A program started by ``torch_xla.launch`` / ``xmp.spawn`` (or any that has used an XLA
    device) has an initialized runtime; then this is ``torch_xla.runtime.world_size()``.
    0 when ``torch_xla`` has not been imported or its runtime has not started: this never
    imports ``torch_xla`` nor starts the runtime itself.
    """
    torch_xla = sys.modules.get("torch_xla")
    if torch_xla is None or not torch_xla._XLAC._xla_runtime_is_initialized():
        return 0
    import torch_xla.runtime as xr

    return xr.world_size()


def xla_group_reducer(group_size: int) -> Any:
    """The grouped-BN reducer of a plain torch-xla program: groups of ``group_size`` replicas.

    For ``largebatch.nn.convert_group_sync_batchnorm`` called inside ``torch_xla.launch``
    without a torch.distributed process group. ``group_size`` -1 or 0 is every replica; 1
    (or a single replica) is local BN. Raises ``ValueError`` if no XLA replicas are running
    or ``group_size`` does not divide their number.
    """
    world_size = running_xla_world_size()
    if world_size == 0:
        raise UsageError("no XLA runtime is running: call this inside torch_xla.launch(...) (or xmp.spawn)")
    size = resolve_group_size(group_size, world_size)
    if size == 1:
        return LocalReducer()
    from largebatch.comm.xla_cpu_threads import serialise_threaded_cpu_syncs

    serialise_threaded_cpu_syncs()
    return XlaGroupReducer(size, world_size)
