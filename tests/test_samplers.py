"""ShardedSampler (training: each rank's part, resume) and ExactShardSampler (exact evaluation)."""

from __future__ import annotations

import pytest

from largebatch.data.samplers import ExactShardSampler, ShardedSampler, exact_part_bounds


def _parts(n: int, world: int, epoch: int = 0, **kw) -> list[list[int]]:
    out = []
    for rank in range(world):
        s = ShardedSampler(n, rank=rank, world_size=world, **kw)
        s.set_epoch(epoch)
        out.append(list(s))
    return out


@pytest.mark.parametrize("n,world", [(103, 4), (100, 1), (7, 3), (64, 8)])
def test_sharded_disjoint_equal_length(n: int, world: int) -> None:
    parts = _parts(n, world)
    flat = [i for s in parts for i in s]
    assert len(set(flat)) == len(flat)  # disjoint, no duplicate inside a part
    assert {len(s) for s in parts} == {n // world}
    assert set(flat) <= set(range(n))


def test_sharded_whole_batches_when_batch_size_given() -> None:
    parts = _parts(1000, 3, batch_size=32)
    assert {len(s) for s in parts} == {320}  # 333 per rank, trimmed to 10 batches of 32


def test_sharded_too_small_for_one_batch_is_an_error() -> None:
    with pytest.raises(ValueError, match="no full batch"):
        ShardedSampler(10, rank=0, world_size=4, batch_size=8)


def test_sharded_reshuffles_per_epoch_and_is_reproducible() -> None:
    e0, e1 = _parts(50, 2, epoch=0), _parts(50, 2, epoch=1)
    assert e0 != e1
    assert e0 == _parts(50, 2, epoch=0)
    assert _parts(50, 2, seed=1) != e0


def test_sharded_no_shuffle_is_strided() -> None:
    assert _parts(10, 2, shuffle=False) == [[0, 2, 4, 6, 8], [1, 3, 5, 7, 9]]


def test_sharded_no_drop_last_pads_and_covers() -> None:
    parts = _parts(10, 4, drop_last=False)
    assert {len(s) for s in parts} == {3}
    assert {i for s in parts for i in s} == set(range(10))


def test_sharded_resume_skips_start_of_part() -> None:
    s = ShardedSampler(100, rank=1, world_size=2, batch_size=10)
    s.set_epoch(3)
    full = list(s)
    s.set_start(20)
    assert list(s) == full[20:] and len(s) == 30
    s.set_epoch(3)  # the same epoch keeps the skip
    assert len(s) == 30
    s.set_epoch(4)  # a new epoch clears it
    assert len(s) == 50 and s.start_index == 0

    fresh = ShardedSampler(100, rank=1, world_size=2, batch_size=10)
    fresh.load_state_dict({"epoch": 3, "start_index": 20})
    assert list(fresh) == full[20:]
    with pytest.raises(ValueError):
        s.set_start(51)


def test_sharded_bad_rank() -> None:
    with pytest.raises(ValueError):
        ShardedSampler(10, rank=2, world_size=2)


@pytest.mark.parametrize("n", [0, 1, 2, 3, 5, 1001])
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_exact_parts_cover_every_index_once(n: int, world: int) -> None:
    parts = [list(ExactShardSampler(n, rank=r, world_size=world)) for r in range(world)]
    assert [i for s in parts for i in s] == list(range(n))  # contiguous, in rank order
    lengths = [len(s) for s in parts]
    assert max(lengths) - min(lengths) <= 1 if n else lengths == [0] * world


def test_exact_part_sizes() -> None:
    assert [len(ExactShardSampler(1001, rank=r, world_size=4)) for r in range(4)] == [251, 250, 250, 250]
    assert [len(ExactShardSampler(2, rank=r, world_size=4)) for r in range(4)] == [1, 1, 0, 0]
    assert exact_part_bounds(1001, 1, 4) == (251, 501)


def test_with_epoch_yields_index_epoch_pairs_for_per_sample_seeds() -> None:
    plain = ShardedSampler(20, rank=1, world_size=2, batch_size=3, seed=5)
    keyed = ShardedSampler(20, rank=1, world_size=2, batch_size=3, seed=5, with_epoch=True)
    for s in (plain, keyed):
        s.set_epoch(3)
        s.set_start(3)
    assert list(keyed) == [(i, 3) for i in plain] and len(keyed) == len(plain) == 6
