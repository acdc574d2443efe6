"""The DDP hooks' NCCL collectives and the CUDA backend's NCCL calls, run on a CPU.

On CUDA tensors the hierarchical / torus schedule hands NCCL a reduce-scatter into a new shard
and an all-gather from it; CPU tensors go to gloo as all_to_all + broadcasts instead
(largebatch/comm/ddp_hooks.py says why). A process group of one rank is never handed to a
collective, so the NCCL branch needs two ranks or more, and spawned ranks are not measured by
tests/test_gpu_lines_gate.py: here each rank is a thread of this process. Its bucket is a CPU
tensor that says it is on CUDA (``_OnCuda``: the hook's one question about the device, stood
in; its values are real), and NCCL's collectives are stood in by an exchange between the
threads (``_StandInNccl``). The gloo path has its real multi-process test in
tests/distributed/test_comm_hooks.py.
"""

from __future__ import annotations

import datetime
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pytest
import torch
import torch.distributed as dist

from largebatch.backends.torch_dist import TorchDistributedBackend
from largebatch.comm import ddp_hooks

CUDA = torch.device("cuda", 0)


class _OnCuda(torch.Tensor):
    """A CPU tensor that answers ``cuda:0`` when asked its device (tensors made from it too)."""

    @property
    def device(self) -> torch.device:  # type: ignore[override]
        return CUDA


@dataclass(frozen=True)
class _Group:
    ranks: tuple[int, ...]


class _Work:
    def __init__(self, result: Any) -> None:
        self.future: torch.futures.Future = torch.futures.Future()
        self.future.set_result(result)

    def get_future(self) -> torch.futures.Future:
        return self.future


def nccl_checks(collective: str, output: torch.Tensor, input: torch.Tensor, group_size: int) -> None:
    """What ``ProcessGroupNCCL`` refuses before it calls NCCL (torch/csrc/distributed/c10d/
    ProcessGroupNCCL.cpp: ``check_gpu_single_tensor``, ``_reduce_scatter_base``, ``_allgather_base``),
    with its messages: a tensor not on CUDA or not contiguous, an output and input of different
    dtypes, sizes that are not the group's multiple. Without these a stand-in passes what the
    card aborts (an fp32 shard into a bf16 wire's reduce-scatter)."""
    for tensor in (output, input):
        if tensor.device.type != "cuda":
            raise ValueError("Tensors must be CUDA and dense")
        if not tensor.is_contiguous():
            raise ValueError("Tensors must be contiguous")
    if collective == "reduce_scatter":
        if input.dtype != output.dtype:
            raise TypeError("input tensor must be the same type as the output tensor.")
        if input.numel() != output.numel() * group_size:
            raise ValueError("input tensor must be the same size as output size times world size")
    elif collective == "all_gather":
        if input.dtype != output.dtype:
            raise TypeError("output tensor must have the same type as input tensor")
        if input.numel() * group_size != output.numel():
            raise ValueError("output tensor size must be equal to world_size times input tensor size")


class _StandInNccl:
    """NCCL's collectives between rank threads: each call waits for every member of its group.

    ``log`` holds ``(collective, rank, group ranks, output, input)`` per call, the tensors
    themselves, so a test asserts which tensors went where.
    """

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self.log: list[tuple[Any, ...]] = []
        self.lock = threading.Lock()
        self.me = threading.local()
        self._slots: dict[tuple[int, ...], list[Any]] = {}
        self._barriers: dict[tuple[int, ...], threading.Barrier] = {}

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        for name, value in [("is_available", lambda: True), ("is_initialized", lambda: True),
                            ("get_world_size", lambda group=None: self.world_size),
                            ("get_rank", lambda group=None: self.me.rank),
                            ("get_backend", lambda group=None: "nccl"),
                            ("new_group", lambda ranks, **_: _Group(tuple(ranks))),
                            ("all_reduce", self.all_reduce),
                            ("all_to_all_single", self._gloo_only), ("broadcast", self._gloo_only)]:
            monkeypatch.setattr(dist, name, value)
        monkeypatch.setattr(ddp_hooks, "_reduce_scatter_single", self.reduce_scatter)
        monkeypatch.setattr(ddp_hooks, "_all_gather_single", self.all_gather)

    def _gloo_only(self, *args: Any, **kwargs: Any) -> None:
        raise AssertionError("a CUDA bucket went to gloo's collectives")

    def _exchange(self, group: _Group, tensor: torch.Tensor) -> tuple[int, list[torch.Tensor]]:
        """This rank's position in ``group`` and every member's ``tensor``, in group order."""
        with self.lock:
            barrier = self._barriers.setdefault(group.ranks, threading.Barrier(len(group.ranks), timeout=60))
            slots = self._slots.setdefault(group.ranks, [None] * len(group.ranks))
        me = group.ranks.index(self.me.rank)
        slots[me] = tensor.as_subclass(torch.Tensor).clone()
        barrier.wait()
        everyone = list(slots)
        barrier.wait()  # no member overwrites its slot before all have read them
        return me, everyone

    def _record(self, *entry: Any) -> None:
        with self.lock:
            self.log.append(entry)

    def reduce_scatter(self, output: torch.Tensor, input: torch.Tensor, *, group: _Group) -> None:
        nccl_checks("reduce_scatter", output, input, len(group.ranks))
        self._record("reduce_scatter", self.me.rank, group.ranks, output, input)
        me, inputs = self._exchange(group, input)
        output.copy_(torch.stack([x.view(len(inputs), -1)[me] for x in inputs]).sum(0))

    def all_gather(self, output: torch.Tensor, input: torch.Tensor, *, group: _Group, async_op: bool) -> _Work:
        nccl_checks("all_gather", output, input, len(group.ranks))
        self._record("all_gather", self.me.rank, group.ranks, output, input)
        assert async_op, "the all-gather is the future the hook hands DDP"
        output.copy_(torch.cat(self._exchange(group, input)[1]))
        return _Work([output])

    def all_reduce(self, tensor: torch.Tensor, *, group: _Group, async_op: bool) -> _Work:
        nccl_checks("all_reduce", tensor, tensor, 1)
        self._record("all_reduce", self.me.rank, group.ranks, tensor, tensor)
        tensor.copy_(torch.stack(self._exchange(group, tensor)[1]).sum(0))
        return _Work([tensor])

    def calls(self, rank: int) -> list[tuple[Any, ...]]:
        return [entry for entry in self.log if entry[1] == rank]


def _buckets(world_size: int, numel: int) -> list[torch.Tensor]:
    """Integer-valued gradients: their mean over a power-of-two world is exact in fp32 and bf16."""
    gen = torch.Generator().manual_seed(world_size)
    return [torch.randint(-64, 64, (numel,), generator=gen).float() * world_size for _ in range(world_size)]


@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("compress,numel", [("none", 12), ("bf16", 12), ("none", 11)])
def test_a_cuda_bucket_is_reduce_scattered_and_all_gathered_by_nccl_and_averaged(
    monkeypatch: pytest.MonkeyPatch, world_size: int, compress: str, numel: int
) -> None:
    """2 ranks: one node (the columns are groups of one); 4: 2 nodes x 2, the column
    all-reduce between. The reduce-scatter writes a new shard of the wire, the all-gather
    fills the wire from that shard, asynchronously; every rank's bucket is the mean."""
    nccl = _StandInNccl(world_size)
    nccl.install(monkeypatch)
    futures: list[tuple[Any, ...]] = []
    monkeypatch.setattr(ddp_hooks, "Future", lambda devices=None: futures.append(devices) or torch.futures.Future())
    buckets = _buckets(world_size, numel)

    def rank_main(rank: int) -> tuple[ddp_hooks.CommState, torch.Tensor, torch.Tensor]:
        nccl.me.rank = rank
        state = ddp_hooks.make_comm_state(algorithm="hierarchical", compress=compress, ranks_per_node=2)
        bucket = buckets[rank].clone().as_subclass(_OnCuda)
        return state, bucket, state.allreduce(bucket, bucket_index=0).wait()

    with ThreadPoolExecutor(world_size) as pool:
        ranks = list(pool.map(rank_main, range(world_size)))
    mean = torch.stack(buckets).mean(0)
    for rank, (state, bucket, result) in enumerate(ranks):
        assert state.backend == "nccl" and result is bucket and torch.equal(result.as_subclass(torch.Tensor), mean)
        row = (0, 1) if rank < 2 else (2, 3)
        calls = nccl.calls(rank)
        assert [(c[0], c[2]) for c in calls] == [
            ("reduce_scatter", row), *([("all_reduce", (rank % 2, rank % 2 + 2))] if world_size == 4 else []),
            ("all_gather", row)]
        (_, _, _, shard, wire), *_, (_, _, _, gathered, gathered_from) = calls
        assert gathered is wire and gathered_from is shard  # the shard goes back into its wire
        assert wire.dtype == {"none": torch.float32, "bf16": torch.bfloat16}[compress]
        assert wire.numel() == -(-numel // world_size) * world_size and shard.numel() == wire.numel() // 2
        assert (wire is bucket) == (compress == "none" and numel % world_size == 0)  # in place when it can be
        if world_size == 4:
            assert calls[1][3] is shard  # the column all-reduce sums the shard in place
        assert state.counters()["collectives"] == (3 if world_size == 4 else 2)
    # the blocking column all-reduce (of a group of one at 2 ranks) gives a completed future naming the GPU
    assert futures == [[CUDA]] * world_size


# -- the CUDA backend's NCCL calls ----------------------------------------------------------------


def _cuda_world(monkeypatch: pytest.MonkeyPatch, *, rank: int, local_rank: int) -> TorchDistributedBackend:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for name, value in (("RANK", rank), ("WORLD_SIZE", 4), ("LOCAL_RANK", local_rank), ("LOCAL_WORLD_SIZE", 2)):
        monkeypatch.setenv(name, str(value))
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
    return TorchDistributedBackend("cuda", timeout_s=90)


def test_a_cuda_rank_joins_an_nccl_group_bound_to_its_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    backend = _cuda_world(monkeypatch, rank=3, local_rank=1)
    calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
    selected: list[torch.device] = []
    monkeypatch.setattr(torch.cuda, "set_device", selected.append)
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda *a, **k: calls.append((a, k)))
    backend.start()
    TorchDistributedBackend("cpu", timeout_s=90).start()  # the gloo group names no device (None: torch's default)
    assert selected == [torch.device("cuda", 1)]
    timeout = datetime.timedelta(seconds=90)
    assert calls == [(("nccl",), {"timeout": timeout, "device_id": torch.device("cuda", 1)}),
                     (("gloo",), {"timeout": timeout, "device_id": None})]
    assert backend._owns_group


def test_a_cuda_barrier_names_the_ranks_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """NCCL's barrier runs on a GPU; without ``device_ids`` it guesses one from the rank."""
    backend = _cuda_world(monkeypatch, rank=3, local_rank=1)
    barriers: list[dict[str, Any]] = []
    monkeypatch.setattr(dist, "barrier", lambda **k: barriers.append(k))
    backend.barrier()
    TorchDistributedBackend("cpu").barrier()
    assert barriers == [{"device_ids": [1]}, {}]


# -- the stand-in refuses what NCCL refuses --------------------------------------------------------


def _cuda(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.as_subclass(_OnCuda)


MISUSES = {  # (collective, output, input, group size) -> what ProcessGroupNCCL raises
    "an fp32 shard of a bf16 wire": (("reduce_scatter", _cuda(torch.zeros(4)), _cuda(torch.zeros(8, dtype=torch.bfloat16)), 2),
                                     TypeError),
    "a shard not 1/p of its wire": (("reduce_scatter", _cuda(torch.zeros(3)), _cuda(torch.zeros(8)), 2), ValueError),
    "a bf16 wire gathered from an fp32 shard": (("all_gather", _cuda(torch.zeros(8, dtype=torch.bfloat16)),
                                                 _cuda(torch.zeros(4)), 2), TypeError),
    "a wire not p shards long": (("all_gather", _cuda(torch.zeros(6)), _cuda(torch.zeros(4)), 2), ValueError),
    "a strided shard": (("reduce_scatter", _cuda(torch.zeros(8))[::2], _cuda(torch.zeros(8)), 2), ValueError),
    "a CPU tensor": (("all_reduce", torch.zeros(4), torch.zeros(4), 1), ValueError),
}


@pytest.mark.parametrize("case", list(MISUSES))
def test_the_stand_in_refuses_what_nccl_refuses(case: str) -> None:
    (collective, output, input, size), error = MISUSES[case]
    with pytest.raises(error):
        nccl_checks(collective, output, input, size)


# one rank of gloo: (collective, output, input), each wrong as the case says for a group of one
GLOO_CASES = {
    "an fp32 shard of a bf16 wire": ("reduce_scatter", torch.zeros(4), torch.zeros(4, dtype=torch.bfloat16)),
    "a shard not 1/p of its wire": ("reduce_scatter", torch.zeros(4), torch.zeros(5)),
    "a bf16 wire gathered from an fp32 shard": ("all_gather", torch.zeros(4, dtype=torch.bfloat16), torch.zeros(4)),
    "a wire not p shards long": ("all_gather", torch.zeros(4), torch.zeros(3)),
}


@pytest.mark.parametrize("case", list(GLOO_CASES))
def test_gloo_refuses_the_same_dtype_and_size_misuses(case: str) -> None:
    """A real process group (gloo, one rank, CPU tensors) checks dtypes and sizes as NCCL does:
    the stand-in's checks are a process group's, not ours; the well-formed call goes through."""
    collective, output, input = GLOO_CASES[case]
    group = dist.ProcessGroupGloo(dist.HashStore(), 0, 1)
    call = group._reduce_scatter_base if collective == "reduce_scatter" else group._allgather_base
    with pytest.raises(RuntimeError):
        call(output, input).wait()
    call(output, torch.zeros_like(output)).wait()
