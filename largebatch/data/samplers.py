"""Samplers that split a data set between ranks: each rank reads its part (training, exact evaluation).

``ShardedSampler`` gives each rank a disjoint, equally long part of one permutation per
epoch (the same seed on every rank), with a mid-epoch start for resume. ``ExactShardSampler``
gives each rank a contiguous block so that every validation image is counted exactly once at
any world size (Wongpanich et al. 2020, distributed evaluation; the MLPerf rule), with no
padding duplicates: unlike ``torch.utils.data.DistributedSampler``, a rank may get fewer
images than another, or none.

(The class names keep the older word "shard", being public; everywhere else a rank's share is
its *part*, and a shard is a packed tar file, :mod:`largebatch.data.contract`.)
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Sequence

import torch
from torch.utils.data import Sampler

from largebatch.errors import TooFewSamplesError

__all__ = ["EpochExactSampler", "ExactShardSampler", "ShardedSampler", "exact_part_bounds", "sample_seed"]


def _check_rank(rank: int, world_size: int) -> None:
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in 0..{world_size - 1}, got {rank}")


_MASK64 = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    """One SplitMix64 output step (Steele et al. 2014): a well-mixed 64-bit hash of ``x``."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def sample_seed(seed: int, epoch: int, index: int) -> int:
    """Seed of one training sample's augmentation: a hash of (seed, epoch, index), < 2**63.

    SplitMix64 chained over the three (a few microseconds; numpy's SeedSequence costs ~60).
    The torchvision loader keys each sample's augmentation on it (its data set seeds torch's CPU
    generator with it); the nvjpeg and decoded loaders key each batch's (``index`` = the batch's
    place among all ranks' batches of the epoch, one generator for the batch's crops and flips);
    so their crops depend on no worker or stop. DALI does not: its operators draw from one
    generator per pipeline (seeded per rank and epoch, ``dali_graph._aug_seed``), so its crops
    differ from the other loaders'.
    """
    h = _splitmix64(seed & _MASK64)
    h = _splitmix64(h ^ (epoch & _MASK64))
    h = _splitmix64(h ^ (index & _MASK64))
    return h >> 1


class ShardedSampler(Sampler[int]):
    """Training sampler: rank ``r`` of ``w`` reads ``perm[r::w]`` of this epoch's permutation.

    Args:
        dataset_len: number of samples in the data set.
        rank: this process's rank.
        world_size: number of ranks.
        batch_size: per-rank batch size; with ``drop_last`` the part is also trimmed to
            whole batches, so every rank runs the same number of full steps. None: no
            trimming beyond equal lengths.
        shuffle: permute (seeded by ``seed + epoch``, identical on all ranks) or keep order.
        seed: base seed of the permutation.
        drop_last: True: drop the permutation's tail so it divides evenly (each sample at most
            once per epoch). False: pad by repeating its head (every sample at least once).
        with_epoch: yield ``(index, epoch)`` pairs instead of indices, so the data set can draw
            the sample's augmentation from a generator seeded by (seed, epoch, index): then the
            crops depend neither on the number of loader workers nor on where a run stopped.

    Resume mid-epoch: ``set_epoch(e)`` then ``set_start(k)`` skips the first ``k`` samples of
    this rank's part of epoch ``e`` (``k`` = batches already done x ``batch_size``);
    ``len()`` then counts what is left. The skip belongs to that epoch: ``set_epoch`` with
    another epoch clears it. ``state_dict()``/``load_state_dict()`` carry both.
    """

    def __init__(
        self,
        dataset_len: int,
        *,
        rank: int,
        world_size: int,
        batch_size: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = True,
        with_epoch: bool = False,
    ) -> None:
        _check_rank(rank, world_size)
        if dataset_len < 0:
            raise ValueError(f"dataset_len must be >= 0, got {dataset_len}")
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.dataset_len = dataset_len
        self.rank = rank
        self.world_size = world_size
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.with_epoch = with_epoch
        self.epoch = 0
        self.start_index = 0
        if drop_last:
            per_rank = dataset_len // world_size
            if batch_size is not None:
                per_rank -= per_rank % batch_size
        else:
            per_rank = -(-dataset_len // world_size)
        self.part_len = per_rank  # samples per rank per epoch, before any start skip
        if self.part_len == 0 and dataset_len > 0:
            raise TooFewSamplesError(
                f"{dataset_len} samples on {world_size} ranks give no full batch of "
                f"{batch_size} per rank; lower the batch size or add data", num_samples=dataset_len,
            )

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch's permutation; a pending ``set_start`` of another epoch is cleared."""
        if epoch != self.epoch:
            self.start_index = 0
        self.epoch = epoch

    def set_start(self, start_index: int) -> None:
        """Skip this rank's first ``start_index`` samples of the current epoch (resume)."""
        if not 0 <= start_index <= self.part_len:
            raise ValueError(f"start_index must be in 0..{self.part_len}, got {start_index}")
        self.start_index = start_index

    def part(self) -> list[int]:
        """This rank's whole part of the current epoch (ignoring ``start_index``)."""
        n = self.dataset_len
        if self.shuffle:
            gen = torch.Generator().manual_seed(self.seed + self.epoch)
            order = torch.randperm(n, generator=gen).tolist()
        else:
            order = list(range(n))
        total = self.part_len * self.world_size
        if total > n:  # pad by repeating the head (drop_last=False)
            order += (order * (total // max(n, 1) + 1))[: total - n]
        order = order[:total]
        return order[self.rank :: self.world_size]

    def __iter__(self) -> Iterator[Any]:
        rest = self.part()[self.start_index :]
        if self.with_epoch:
            return iter([(i, self.epoch) for i in rest])
        return iter(rest)

    def __len__(self) -> int:
        return self.part_len - self.start_index

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "start_index": self.start_index}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch = int(state["epoch"])
        self.set_start(int(state["start_index"]))


def exact_part_bounds(dataset_len: int, rank: int, world_size: int) -> tuple[int, int]:
    """``[begin, end)`` of rank's contiguous block; the first ``len % world`` ranks get one more."""
    _check_rank(rank, world_size)
    base, extra = divmod(dataset_len, world_size)
    begin = rank * base + min(rank, extra)
    return begin, begin + base + (1 if rank < extra else 0)


class ExactShardSampler(Sampler[int]):
    """Evaluation sampler: contiguous, disjoint blocks covering every index exactly once.

    1,001 images on 4 ranks give 251/250/250/250; 2 images on 4 ranks give 1/1/0/0. Sum the
    per-rank (correct, count) pairs with an all-reduce to get the exact accuracy.

    Args:
        dataset_len: number of samples in the data set.
        rank: this process's rank.
        world_size: number of ranks.
        order: the indices in the order to read them (a permutation of ``range(dataset_len)``);
            None: ``range(dataset_len)``.
        whole_batches: blocks are whole batches of this many samples of ``order`` (a rank
            batching its block by the same size gets the batches of the whole order, the last
            one short; rectangular validation gives each batch a shape); None: blocks of samples.
    """

    def __init__(self, dataset_len: int, *, rank: int, world_size: int, order: Sequence[int] | None = None,
                 whole_batches: int | None = None) -> None:
        if dataset_len < 0:
            raise ValueError(f"dataset_len must be >= 0, got {dataset_len}")
        if order is not None and sorted(order) != list(range(dataset_len)):
            raise ValueError(f"order must be a permutation of range({dataset_len})")
        if whole_batches is not None and whole_batches < 1:
            raise ValueError(f"whole_batches must be >= 1, got {whole_batches}")
        self.dataset_len = dataset_len
        self.rank = rank
        self.world_size = world_size
        self.order = None if order is None else list(order)
        if whole_batches is None:
            self.begin, self.end = exact_part_bounds(dataset_len, rank, world_size)
        else:
            first, last = exact_part_bounds(-(-dataset_len // whole_batches), rank, world_size)
            self.begin, self.end = (min(b * whole_batches, dataset_len) for b in (first, last))

    def set_epoch(self, epoch: int) -> None:
        """No-op (the order is fixed); present so callers can treat both samplers alike."""

    def __iter__(self) -> Iterator[int]:
        if self.order is None:
            return iter(range(self.begin, self.end))
        return iter(self.order[self.begin:self.end])

    def __len__(self) -> int:
        return self.end - self.begin


class EpochExactSampler(ExactShardSampler):
    """Evaluation whose order changes with the epoch (rectangular validation from an epoch on,
    an evaluation side per phase): ``sampler_of(epoch)`` is the epoch's
    :class:`ExactShardSampler`, picked by :meth:`set_epoch`; it yields ``(index, epoch)`` keys
    so that the data set crops each sample for that epoch. Every index once over all ranks, as
    its base."""

    def __init__(self, sampler_of: Callable[[int], ExactShardSampler]) -> None:
        self.sampler_of = sampler_of
        self.set_epoch(0)

    def set_epoch(self, epoch: int) -> None:
        """Read epoch ``epoch``'s order (the evaluation after training epoch ``epoch``)."""
        self.epoch, self.current = epoch, self.sampler_of(epoch)
        self.dataset_len, self.rank, self.world_size = (self.current.dataset_len, self.current.rank,
                                                        self.current.world_size)
        self.order, self.begin, self.end = self.current.order, self.current.begin, self.current.end

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        return iter([(index, self.epoch) for index in self.current])
