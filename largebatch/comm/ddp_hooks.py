"""DDP communication hooks: flat, hierarchical and 2-D torus all-reduce, with optional fp16/bf16
compression, and counters of what each rank sends.

- ``flat``: one all-reduce over all ranks (what DDP does without a hook; the ring of NCCL).
- ``hierarchical`` (Jia et al. 2018, arXiv 1807.11205): reduce-scatter inside each node,
  all-reduce of each shard across nodes among the ranks with the same local rank, all-gather
  inside the node. Every rank's NIC carries ``1/ranks_per_node`` of the bucket, and the ring
  latency steps drop from ``2(n-1)`` to ``2(L-1) + 2(N-1)``.
- ``torus2d`` (Mikami et al. 2018, arXiv 1811.05233; Ying et al. 2018, arXiv 1811.06992):
  reduce-scatter along the rows of an ``X x Y`` grid of ranks, all-reduce along the columns,
  all-gather along the rows. With the default ``X = ranks_per_node`` the grid rows are the
  nodes and it is the hierarchical schedule; other shapes trade row (bandwidth) steps for
  column (latency) steps, see ``cost_model.py``.

Each bucket is divided by the world size first, cast to the wire dtype, padded to a multiple
of the world size (so every reduce-scatter shard and ring chunk is whole), reduced, then cast
back into the bucket. Process groups are created once, by every rank in the same order, when
the hook is registered.

Byte counters follow the ring schedule of each collective issued: over a group of ``p``, a
reduce-scatter or all-gather of ``S`` bytes sends ``(p-1)/p * S`` and an all-reduce
``2(p-1)/p * S``, all to the rank's successor in the group; the bytes count as inter-node when
that successor is on another node. For groups that lie inside one node or hold one rank per
node (the hierarchical and default torus groups) the split is the same for any schedule.
"""

# No `from __future__ import annotations`: DDP compares the hook's annotations with
# dist.GradBucket and torch.futures.Future[torch.Tensor] at registration.
from dataclasses import dataclass

import torch
import torch.distributed as dist

from largebatch.comm.compress import COMPRESSIONS, pack, padded_numel, unpack, wire_dtype
from largebatch.comm.topology import (
    Topology,
    column_groups,
    grid_shape,
    resolve_topology,
    row_groups,
)
from largebatch.errors import UsageError

__all__ = [
    "ALGORITHMS",
    "CommState",
    "SquaredNormTap",
    "comm_hook",
    "make_comm_state",
    "register_comm_hook",
    "register_tapped_comm_hook",
    "tapped_comm_hook",
]

ALGORITHMS = ("flat", "hierarchical", "torus2d")

# torch 2.14 renamed the single-tensor collectives; keep working on older releases.
_reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor

Future = torch.futures.Future  # of a Tensor


@dataclass(frozen=True)
class _Ring:
    """One process group as this rank sees it: global ranks in order, and its handle."""

    ranks: tuple[int, ...]
    handle: dist.ProcessGroup | None  # None: a group of one, nothing to send
    index: int  # this rank's position in ``ranks``

    @property
    def successor(self) -> int:
        """The global rank this rank sends to in a ring schedule."""
        return self.ranks[(self.index + 1) % len(self.ranks)]

    @property
    def size(self) -> int:
        return len(self.ranks)


def _done(value: torch.Tensor) -> Future:
    """A completed future holding ``value``."""
    if value.device.type == "cpu":
        fut: Future = Future()
    else:  # a future holding CUDA tensors names the device, so that waiting on it orders the streams
        fut = Future(devices=[value.device])  # gpu-only
    fut.set_result(value)
    return fut


class CommState:
    """What the hook needs (groups, topology, wire format) and what it has sent.

    Counters (per rank, since creation or :meth:`reset_counters`): ``buckets`` (hook calls),
    ``collectives`` issued (reduce-scatter, all-reduce, all-gather; groups of one rank are
    skipped), ``payload_bytes`` (padded, compressed bucket bytes handed to the algorithm),
    ``intra_node_bytes`` and ``inter_node_bytes`` sent by this rank (ring accounting, see the
    module docstring).
    """

    def __init__(
        self,
        *,
        algorithm: str,
        compress: str,
        topology: Topology,
        shape: tuple[int, int],
        rank: int,
        backend: str,
        rings: dict[str, _Ring],
    ) -> None:
        self.algorithm = algorithm
        self.compress = compress
        self.topology = topology
        self.shape = shape
        self.rank = rank
        self.backend = backend
        self._rings = rings
        # CPU scratch, reused: a fresh 100 MB CPU tensor costs more in page faults than the
        # exchange itself (CUDA's caching allocator already recycles). gloo's all_to_all
        # receive buffer is used synchronously, so one per dtype serves every bucket; a wire
        # buffer lives until its bucket's future completes, so there is one per bucket.
        self._received: dict[torch.dtype, torch.Tensor] = {}
        self._wires: dict[int, torch.Tensor] = {}
        self.reset_counters()

    def reset_counters(self) -> None:
        self.buckets = 0
        self.collectives = 0
        self.payload_bytes = 0
        self.intra_node_bytes = 0
        self.inter_node_bytes = 0

    def counters(self) -> dict[str, int]:
        return {
            "buckets": self.buckets,
            "collectives": self.collectives,
            "payload_bytes": self.payload_bytes,
            "intra_node_bytes": self.intra_node_bytes,
            "inter_node_bytes": self.inter_node_bytes,
        }

    # -- the algorithms ---------------------------------------------------------------------

    def allreduce(self, buffer: torch.Tensor, *, bucket_index: int | None = None) -> Future:
        """Average the flat ``buffer`` over all ranks; the future yields ``buffer`` itself.

        ``bucket_index`` (DDP's) lets a CPU run reuse the bucket's wire buffer across steps;
        the call for a given index must not start before the previous one completed.
        """
        self.buckets += 1
        world = self.topology.world_size
        dtype = wire_dtype(self.compress, buffer.dtype)
        numel = padded_numel(buffer.numel(), world)
        out = None  # None: pack works in place, or allocates
        in_place = numel == buffer.numel() and dtype == buffer.dtype
        if bucket_index is not None and buffer.device.type == "cpu" and not in_place:
            out = self._wires.get(bucket_index)
            if out is None or out.numel() != numel or out.dtype != dtype:
                out = self._wires[bucket_index] = buffer.new_empty(numel, dtype=dtype)
        wire = pack(buffer, divisor=world, dtype=dtype, multiple=world, out=out)
        self.payload_bytes += wire.numel() * wire.element_size()
        if self.algorithm == "flat":
            fut = self._all_reduce(wire, self._rings["world"], async_op=True)
        else:
            # Reduce-scatter and the column all-reduce are issued and waited on here, in the
            # thread DDP calls the hook from (in bucket order, the same on every rank). Chaining
            # them with Future.then would issue the later phases from gloo's worker threads,
            # whose order across ranks is not fixed: two buckets' collectives on one group could
            # then pair up wrongly. On NCCL the waits only order streams; the host goes on.
            rows, columns = self._rings["rows"], self._rings["columns"]
            shard = self._reduce_scatter(wire, rows)
            self._all_reduce(shard, columns, async_op=False)
            fut = self._all_gather(wire, shard, rows)
        return fut.then(lambda _: unpack(buffer, wire))

    # -- collectives, each counted ------------------------------------------------------------

    def _count(self, ring: _Ring, sent_bytes: int) -> None:
        self.collectives += 1
        if self.topology.node_of(ring.successor) == self.topology.node_of(self.rank):
            self.intra_node_bytes += sent_bytes
        else:
            self.inter_node_bytes += sent_bytes

    def _all_reduce(self, tensor: torch.Tensor, ring: _Ring, *, async_op: bool) -> Future:
        if ring.handle is None:
            return _done(tensor)
        self._count(ring, 2 * (ring.size - 1) * _nbytes(tensor) // ring.size)
        if not async_op:
            dist.all_reduce(tensor, group=ring.handle, async_op=False)
            return _done(tensor)
        return dist.all_reduce(tensor, group=ring.handle, async_op=True).get_future()

    def _reduce_scatter(self, tensor: torch.Tensor, ring: _Ring) -> torch.Tensor:
        """This rank's ``1/p`` chunk of the sum of ``tensor`` over ``ring`` (blocking).

        On CPU (gloo) the chunk is computed in place, as a view of ``tensor``.
        """
        p = ring.size
        if ring.handle is None:
            return tensor
        self._count(ring, (p - 1) * _nbytes(tensor) // p)
        if tensor.device.type != "cpu":
            shard = tensor.new_empty(tensor.numel() // p)  # gpu-only
            _reduce_scatter_single(shard, tensor, group=ring.handle)  # gpu-only
            return shard  # gpu-only
        # CPU tensors go to gloo. torch 2.14's gloo accepts reduce_scatter_single, but libtorch
        # links no gloo reduce-scatter algorithm (only allreduce, allgather, alltoall, reduce,
        # broadcast, ...): it is emulated, and measured 2-5x slower than an all_reduce of the
        # whole buffer. all_to_all_single moves exactly what a reduce-scatter moves, (p-1)/p of
        # the buffer per rank, chunk j to rank j; the owner then sums its p chunks. The sum
        # may overwrite this rank's own chunk: all_to_all has already sent it.
        received = self._receive_buffer(tensor)
        dist.all_to_all_single(received, tensor, group=ring.handle)
        shard = tensor.view(p, -1)[ring.index]
        torch.sum(received.view(p, -1), dim=0, out=shard)
        return shard

    def _all_gather(self, out: torch.Tensor, shard: torch.Tensor, ring: _Ring) -> Future:
        """Gather every rank's ``shard`` into ``out`` (chunk ``j`` from rank ``j``), async."""
        p = ring.size
        if ring.handle is None:
            return _done(out)
        self._count(ring, (p - 1) * _nbytes(shard))
        if out.device.type != "cpu":
            return _all_gather_single(out, shard, group=ring.handle, async_op=True).get_future()  # gpu-only
        # gloo: the shard already sits in its chunk of ``out`` (see _reduce_scatter). Each
        # rank broadcasts its chunk in place, which measured 4x faster than gloo's allgather
        # (39 vs 161 ms for 102 MB over 2 ranks) and needs no staging copy.
        chunks = out.view(p, -1)
        futures = [
            dist.broadcast(chunks[j], src=src, group=ring.handle, async_op=True).get_future()
            for j, src in enumerate(ring.ranks)
        ]
        return torch.futures.collect_all(futures)

    def _receive_buffer(self, like: torch.Tensor) -> torch.Tensor:
        cached = self._received.get(like.dtype)
        if cached is None or cached.numel() < like.numel():
            cached = self._received[like.dtype] = torch.empty_like(like)
        return cached[: like.numel()]


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def _ring(ranks: list[int], handle: dist.ProcessGroup | None, rank: int) -> _Ring:
    return _Ring(tuple(ranks), handle, ranks.index(rank))


def _member_ring(groups: list[list[int]], rank: int) -> _Ring:
    """Create a process group per rank list (all ranks, same order); keep this rank's."""
    mine: _Ring | None = None
    for ranks in groups:
        handle = dist.new_group(ranks) if len(ranks) > 1 else None
        if rank in ranks:
            # new_group hands non-members the int NON_GROUP_MEMBER; a member gets its group
            assert not isinstance(handle, int), f"rank {rank} got no group of its own for {ranks}"
            mine = _ring(ranks, handle, rank)
    assert mine is not None, f"rank {rank} is in no group of {groups}"
    return mine


def make_comm_state(
    *,
    algorithm: str,
    compress: str = "none",
    ranks_per_node: int | None = None,
    torus_shape: tuple[int, int] | None = None,
) -> CommState:
    """Validate the choice and create the process groups (collective: call on every rank).

    Needs an initialised default process group; usable without DDP (``state.allreduce``).
    """
    if algorithm not in ALGORITHMS:
        raise UsageError(f"unknown comm.algorithm {algorithm!r}; expected one of {ALGORITHMS}")
    if compress not in COMPRESSIONS:
        raise UsageError(
            f"unknown comm.compress {compress!r}; expected one of {sorted(COMPRESSIONS)}"
        )
    if torus_shape is not None and algorithm != "torus2d":
        raise UsageError(f"torus_shape is only used by comm.algorithm 'torus2d', not {algorithm!r}")
    if not dist.is_available() or not dist.is_initialized():
        raise ValueError("comm hooks need an initialised torch.distributed process group")
    world_size, rank = dist.get_world_size(), dist.get_rank()
    needs_nodes = algorithm == "hierarchical" or (algorithm == "torus2d" and torus_shape is None)
    topology = resolve_topology(world_size, ranks_per_node, required=needs_nodes)
    shape = grid_shape(topology, torus_shape if algorithm == "torus2d" else None)

    world = list(range(world_size))
    rings = {"world": _ring(world, dist.group.WORLD if world_size > 1 else None, rank)}
    if algorithm != "flat":
        rings["rows"] = _member_ring(row_groups(shape), rank)
        rings["columns"] = _member_ring(column_groups(shape), rank)
    return CommState(
        algorithm=algorithm,
        compress=compress,
        topology=topology,
        shape=shape,
        rank=rank,
        backend=str(dist.get_backend()),
        rings=rings,
    )


def comm_hook(state: CommState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: average ``bucket`` with ``state``'s algorithm and compression."""
    return state.allreduce(bucket.buffer(), bucket_index=bucket.index())


def register_comm_hook(
    ddp_model: torch.nn.parallel.DistributedDataParallel,
    *,
    algorithm: str,
    compress: str = "none",
    ranks_per_node: int | None = None,
    torus_shape: tuple[int, int] | None = None,
) -> CommState:
    """Register :func:`comm_hook` on ``ddp_model``; return its state (with the counters).

    Args:
        ddp_model: a ``DistributedDataParallel`` over the default (world) process group.
        algorithm: ``flat``, ``hierarchical`` or ``torus2d``.
        compress: ``none``, ``fp16`` or ``bf16`` (wire dtype; the result is cast back).
        ranks_per_node: ranks on each node; default torchrun's ``LOCAL_WORLD_SIZE``.
        torus_shape: ``(X, Y)`` grid for ``torus2d``; default ``(ranks_per_node, nodes)``.
    """
    if dist.get_world_size(ddp_model.process_group) != dist.get_world_size():
        raise ValueError("comm hooks need DDP over the default (world) process group")
    state = make_comm_state(
        algorithm=algorithm,
        compress=compress,
        ranks_per_node=ranks_per_node,
        torus_shape=torus_shape,
    )
    ddp_model.register_comm_hook(state, comm_hook)
    return state


class SquaredNormTap:
    """Wraps a DDP comm hook and sums ``|bucket|²`` over the buckets this rank hands to it.

    A bucket's buffer, before the hook divides and reduces it, holds this rank's own gradient
    (accumulated over its micro-batches, as DDP reduces only after the last one): the sum over
    the buckets of a backward is the squared norm of the rank's local gradient, which the
    gradient noise scale (``largebatch.engine.noise_scale_hook``) needs beside the reduced one
    and which is gone once the all-reduce has written the average into the same buffer. One
    ``vector_norm`` per bucket, accumulated in float32 on the device: no host read, no
    collective. ``inner_state``/``inner_hook``: the hook that reduces (``comm_hook`` with a
    :class:`CommState`, or torch's ``allreduce_hook`` with None for the ``flat`` default).
    ``reduces_in_optimizer_step`` is False: the reduced gradient is in ``.grad`` after the last
    backward (the XLA backend's tap says True).
    """

    reduces_in_optimizer_step = False

    def __init__(self, inner_state: object, inner_hook: object) -> None:
        self.inner_state = inner_state
        self.inner_hook = inner_hook
        self._sum: torch.Tensor | None = None

    def add(self, buffer: torch.Tensor) -> None:
        sq = torch.linalg.vector_norm(buffer, dtype=torch.float32).square()
        self._sum = sq if self._sum is None else self._sum + sq

    def take(self) -> torch.Tensor | None:
        """The local squared norm summed since the last call (None: no bucket was reduced)."""
        value, self._sum = self._sum, None
        return value


def tapped_comm_hook(tap: SquaredNormTap, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: record the bucket's local squared norm, then reduce it with the inner hook."""
    tap.add(bucket.buffer())
    return tap.inner_hook(tap.inner_state, bucket)  # type: ignore[operator]


def register_tapped_comm_hook(
    ddp_model: torch.nn.parallel.DistributedDataParallel,
    *,
    algorithm: str,
    compress: str = "none",
    ranks_per_node: int | None = None,
) -> tuple[SquaredNormTap, CommState | None]:
    """Register :func:`tapped_comm_hook` around the configured reduction; return the tap and the
    :class:`CommState` (None for ``flat`` without compression, which keeps torch's own all-reduce
    hook, the one DDP runs when no hook is registered)."""
    if algorithm == "flat" and compress == "none":
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        tap = SquaredNormTap(None, allreduce_hook)  # its state: the process group (None: the world)
        state = None
    else:
        if dist.get_world_size(ddp_model.process_group) != dist.get_world_size():
            raise ValueError("comm hooks need DDP over the default (world) process group")
        state = make_comm_state(algorithm=algorithm, compress=compress, ranks_per_node=ranks_per_node)
        tap = SquaredNormTap(state, comm_hook)
    ddp_model.register_comm_hook(tap, tapped_comm_hook)
    return tap, state
