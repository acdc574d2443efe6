"""Alpha-beta all-reduce model: formulas checked by hand at small n, trends at large n."""

from __future__ import annotations

import pytest

from largebatch.comm.cost_model import (
    H100_LINKS,
    RESNET50_GRAD_BYTES,
    Links,
    estimate_allreduce,
    flat_ring_allreduce,
    hierarchical_allreduce,
    ring_allreduce_seconds,
    torus2d_allreduce,
)

# round numbers: intra alpha 1 s, beta 1000 B/s; inter alpha 10 s, beta 100 B/s
LINKS = Links(intra_bandwidth=1000.0, intra_latency=1.0, inter_bandwidth=100.0, inter_latency=10.0)
S = 1000.0


def test_ring_formula() -> None:
    # 4 ranks: 6 steps of S/4
    assert ring_allreduce_seconds(4, S, 10.0, 100.0) == pytest.approx(6 * (10 + 250 / 100))
    assert ring_allreduce_seconds(1, S, 10.0, 100.0) == 0.0


def test_flat_2x2_by_hand() -> None:
    est = flat_ring_allreduce(ranks_per_node=2, nodes=2, message_bytes=S, links=LINKS)
    assert est.latency_steps == 6  # 2(n-1)
    assert est.latency_seconds == pytest.approx(6 * 10)  # the ring is as slow as its IB hop
    assert est.bandwidth_seconds == pytest.approx(6 * 250 / 100)
    assert est.seconds == pytest.approx(75)
    assert est.inter_node_bytes == pytest.approx(1500)  # 2(n-1)/n * S
    assert est.intra_node_bytes == pytest.approx(1500)


def test_flat_one_node_uses_intra_links() -> None:
    est = flat_ring_allreduce(ranks_per_node=4, nodes=1, message_bytes=S, links=LINKS)
    assert est.seconds == pytest.approx(6 * (1 + 250 / 1000))
    assert est.inter_node_bytes == 0


def test_hierarchical_2x2_by_hand() -> None:
    est = hierarchical_allreduce(ranks_per_node=2, nodes=2, message_bytes=S, links=LINKS)
    assert est.latency_steps == 4  # 2(L-1) + 2(N-1)
    # rows: 2 steps of S/2 on NVLink; columns: 2 steps of S/4 on IB
    assert est.latency_seconds == pytest.approx(2 * 1 + 2 * 10)
    assert est.bandwidth_seconds == pytest.approx(2 * 500 / 1000 + 2 * 250 / 100)
    assert est.inter_node_bytes == pytest.approx(500)  # 2(N-1)/N * S/L
    assert est.intra_node_bytes == pytest.approx(1000)  # 2(L-1)/L * S


def test_torus_default_shape_is_hierarchical() -> None:
    hier = hierarchical_allreduce(ranks_per_node=8, nodes=16, message_bytes=S, links=LINKS)
    torus = torus2d_allreduce(ranks_per_node=8, nodes=16, message_bytes=S, links=LINKS)
    assert (torus.seconds, torus.inter_node_bytes) == (hier.seconds, hier.inter_node_bytes)


def test_torus_rows_across_nodes_by_hand() -> None:
    # 4 x 1 on 2 nodes of 2: one ring of 4 crossing nodes, like flat
    est = torus2d_allreduce(ranks_per_node=2, nodes=2, message_bytes=S, links=LINKS, shape=(4, 1))
    flat = flat_ring_allreduce(ranks_per_node=2, nodes=2, message_bytes=S, links=LINKS)
    assert (est.latency_steps, est.seconds) == (flat.latency_steps, pytest.approx(flat.seconds))
    assert est.inter_node_bytes == pytest.approx(1500)
    # 4 x 2 on 4 nodes of 2: rows span 2 nodes (IB), columns IB
    est = torus2d_allreduce(ranks_per_node=2, nodes=4, message_bytes=S, links=LINKS, shape=(4, 2))
    assert est.latency_steps == 2 * 3 + 2 * 1
    assert est.seconds == pytest.approx(6 * (10 + 250 / 100) + 2 * (10 + 125 / 100))
    assert est.inter_node_bytes == pytest.approx(1500 + 250)


def test_torus_narrow_rows_by_hand() -> None:
    # 1 x 4 on 2 nodes of 2: one column = the flat ring
    est = torus2d_allreduce(ranks_per_node=2, nodes=2, message_bytes=S, links=LINKS, shape=(1, 4))
    flat = flat_ring_allreduce(ranks_per_node=2, nodes=2, message_bytes=S, links=LINKS)
    assert est.seconds == pytest.approx(flat.seconds)
    assert (est.inter_node_bytes, est.intra_node_bytes) == (1500, 1500)


def test_latency_steps_drop_at_scale() -> None:
    flat = flat_ring_allreduce(ranks_per_node=8, nodes=512, message_bytes=S, links=LINKS)
    hier = hierarchical_allreduce(ranks_per_node=8, nodes=512, message_bytes=S, links=LINKS)
    square = torus2d_allreduce(
        ranks_per_node=8, nodes=512, message_bytes=S, links=LINKS, shape=(64, 64)
    )
    assert flat.latency_steps == 2 * 4095
    assert hier.latency_steps == 2 * 7 + 2 * 511
    assert square.latency_steps == 2 * 63 + 2 * 63
    assert square.latency_seconds < hier.latency_seconds < flat.latency_seconds / 7
    # inter-node volume cut by ~ranks per node
    assert flat.inter_node_bytes / hier.inter_node_bytes == pytest.approx(8, rel=0.01)


@pytest.mark.parametrize("gpus", [64, 512, 4096])
def test_hierarchical_beats_flat_for_resnet50_on_h100(gpus: int) -> None:
    kw = dict(
        ranks_per_node=8, nodes=gpus // 8, message_bytes=RESNET50_GRAD_BYTES, links=H100_LINKS
    )
    flat, hier = estimate_allreduce("flat", **kw), estimate_allreduce("hierarchical", **kw)
    assert hier.seconds < flat.seconds


def test_bytes_scale_with_message() -> None:
    a = hierarchical_allreduce(ranks_per_node=4, nodes=3, message_bytes=S, links=LINKS)
    b = hierarchical_allreduce(ranks_per_node=4, nodes=3, message_bytes=2 * S, links=LINKS)
    assert b.inter_node_bytes == pytest.approx(2 * a.inter_node_bytes)
    assert b.latency_seconds == a.latency_seconds


def test_bad_inputs() -> None:
    with pytest.raises(ValueError, match="do not align"):
        torus2d_allreduce(ranks_per_node=2, nodes=3, message_bytes=S, links=LINKS, shape=(3, 2))
    with pytest.raises(ValueError, match="does not tile"):
        torus2d_allreduce(ranks_per_node=2, nodes=2, message_bytes=S, links=LINKS, shape=(2, 3))
    with pytest.raises(ValueError, match="unknown algorithm"):
        estimate_allreduce("tree", ranks_per_node=2, nodes=2, message_bytes=S, links=LINKS)
    with pytest.raises(ValueError, match="nodes >= 1"):
        flat_ring_allreduce(ranks_per_node=2, nodes=0, message_bytes=S, links=LINKS)
