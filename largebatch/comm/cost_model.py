"""Alpha-beta cost model of flat ring, hierarchical and 2-D torus all-reduce.

A ring collective over ``p`` ranks runs in steps; in each step every rank sends one chunk to
its successor, and the step costs ``alpha + chunk / beta`` of the slowest link in the ring
(an inter-node hop makes the whole ring inter-node). For a message of ``S`` bytes:

- all-reduce (reduce-scatter + all-gather): ``2(p-1)`` steps of ``S/p``; ``2(p-1)/p * S``
  bytes sent per rank; ``T = 2(p-1) * (alpha + S / (p * beta))``.
- reduce-scatter, all-gather: half of that each, ``(p-1)`` steps.

Algorithms on ``n = L * N`` ranks (``L`` ranks per node, ``N`` nodes):

- flat ring: one all-reduce over ``n``: ``2(n-1)`` steps, inter-node whenever ``N > 1``;
  the rank before each node boundary sends all its ``2(n-1)/n * S`` over the network.
- 2-D torus ``X x Y`` (Mikami et al. 2018, arXiv 1811.05233; Ying et al. 2018,
  arXiv 1811.06992): reduce-scatter along rows (``X-1`` steps of ``S/X``), all-reduce of the
  ``S/X`` shard along columns (``2(Y-1)`` steps of ``S/(XY)``), all-gather along rows:
  ``2(X-1) + 2(Y-1)`` steps, ``T = 2(X-1)(alpha_r + S/(X beta_r)) + 2(Y-1)(alpha_c +
  S/(XY beta_c))``. Rows must align with nodes (``L % X == 0`` or ``X % L == 0``).
- hierarchical (Jia et al. 2018, arXiv 1807.11205): the torus with ``X = L``, ``Y = N``: rows
  on NVLink, columns on the network; inter-node bytes per rank ``2(N-1)/N * S/L``, i.e. the
  flat ring's ``2(n-1)/n * S`` cut by about ``L``; latency steps ``2(L-1) + 2(N-1)``
  instead of ``2(n-1)``.

Assumed: one ring per collective, phases run back to back, each GPU has its own NIC (rail
optimised) so concurrent rings do not share links, no compute/communication overlap. Byte
figures are per rank, at the busiest rank (the one whose successor is on another node).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "Links",
    "AllReduceEstimate",
    "H100_LINKS",
    "RESNET50_GRAD_BYTES",
    "ring_allreduce_seconds",
    "flat_ring_allreduce",
    "torus2d_allreduce",
    "hierarchical_allreduce",
    "estimate_allreduce",
]


@dataclass(frozen=True)
class Links:
    """Per-rank link speeds: bandwidth in bytes/s (one direction), latency in s per ring step."""

    intra_bandwidth: float
    intra_latency: float
    inter_bandwidth: float
    inter_latency: float


# H100 SXM: NVLink ~370 GB/s effective per GPU; one 400 Gb/s InfiniBand NIC per GPU (50 GB/s).
# Per-step latencies are assumptions of the same order as NCCL's own tuning tables: ~2 us per
# NVLink ring step, ~5 us per network hop (RDMA + proxy thread + kernel step).
H100_LINKS = Links(
    intra_bandwidth=370e9, intra_latency=2e-6, inter_bandwidth=50e9, inter_latency=5e-6
)

# ResNet-50 v1.5: 25,557,032 parameters, fp32 gradients.
RESNET50_GRAD_BYTES = 25_557_032 * 4


@dataclass(frozen=True)
class AllReduceEstimate:
    """Predicted cost of one all-reduce of ``message_bytes``."""

    algorithm: str
    ranks: int
    message_bytes: float
    latency_steps: int
    latency_seconds: float  # sum of alpha over the steps
    bandwidth_seconds: float  # sum of chunk / beta over the steps
    inter_node_bytes: float  # sent over the network by the busiest rank
    intra_node_bytes: float  # sent inside a node by the busiest rank

    @property
    def seconds(self) -> float:
        return self.latency_seconds + self.bandwidth_seconds


def ring_allreduce_seconds(p: int, message_bytes: float, latency: float, bandwidth: float) -> float:
    """``2(p-1) * (latency + S / (p * bandwidth))``: one ring all-reduce over ``p`` ranks."""
    return 2 * (p - 1) * (latency + message_bytes / (p * bandwidth))


def _check(ranks_per_node: int, nodes: int, message_bytes: float) -> None:
    if ranks_per_node < 1 or nodes < 1:
        raise ValueError(f"need ranks_per_node >= 1 and nodes >= 1, got {ranks_per_node}, {nodes}")
    if message_bytes < 0:
        raise ValueError(f"message_bytes must be >= 0, got {message_bytes}")


def flat_ring_allreduce(
    *, ranks_per_node: int, nodes: int, message_bytes: float, links: Links
) -> AllReduceEstimate:
    """One ring over all ``n = L * N`` ranks.

    ``2(n-1)`` steps of ``S/n`` at the inter-node link when ``N > 1``;
    ``T = 2(n-1)(alpha + S/(n beta))``; the rank before a node boundary sends
    ``2(n-1)/n * S`` over the network, the others the same inside their node.
    """
    _check(ranks_per_node, nodes, message_bytes)
    n = ranks_per_node * nodes
    alpha, beta = (
        (links.inter_latency, links.inter_bandwidth)
        if nodes > 1
        else (links.intra_latency, links.intra_bandwidth)
    )
    steps = 2 * (n - 1)
    sent = steps * message_bytes / n
    return AllReduceEstimate(
        algorithm="flat",
        ranks=n,
        message_bytes=message_bytes,
        latency_steps=steps,
        latency_seconds=steps * alpha,
        bandwidth_seconds=steps * message_bytes / (n * beta),
        inter_node_bytes=sent if nodes > 1 else 0.0,
        intra_node_bytes=sent if ranks_per_node > 1 else 0.0,
    )


def torus2d_allreduce(
    *,
    ranks_per_node: int,
    nodes: int,
    message_bytes: float,
    links: Links,
    shape: tuple[int, int] | None = None,
    algorithm: str = "torus2d",
) -> AllReduceEstimate:
    """Reduce-scatter along rows, all-reduce along columns, all-gather along rows.

    On an ``X x Y`` grid (default ``X = L``, ``Y = N``): ``2(X-1) + 2(Y-1)`` steps;
    rows send ``2(X-1)/X * S`` per rank, columns ``2(Y-1)/Y * S/X``. Rows inside a node
    (``L % X == 0``) use NVLink, rows spanning nodes (``X % L == 0``, ``X > L``) the network;
    columns use the network whenever ``N > 1``.
    """
    _check(ranks_per_node, nodes, message_bytes)
    L, N = ranks_per_node, nodes
    x, y = shape if shape is not None else (L, N)
    if x < 1 or y < 1 or x * y != L * N:
        raise ValueError(f"torus shape {x} x {y} does not tile {L * N} ranks")
    if L % x and x % L:
        raise ValueError(f"torus rows of {x} ranks do not align with nodes of {L} ranks")
    rows_span_nodes = x > L
    row_alpha, row_beta = (
        (links.inter_latency, links.inter_bandwidth)
        if rows_span_nodes
        else (links.intra_latency, links.intra_bandwidth)
    )
    col_alpha, col_beta = (
        (links.inter_latency, links.inter_bandwidth)
        if N > 1
        else (links.intra_latency, links.intra_bandwidth)
    )
    row_steps, col_steps = 2 * (x - 1), 2 * (y - 1)
    row_bytes = row_steps * message_bytes / x
    col_bytes = col_steps * message_bytes / (x * y)

    if N == 1:
        inter, intra = 0.0, row_bytes + col_bytes
    elif not rows_span_nodes:
        # Every column leaves the node after L/X members; when X < L some column hops stay.
        inter = col_bytes
        intra = row_bytes + (col_bytes if x < L else 0.0)
    else:
        # The last rank of each node in a row sends its row traffic out, and all column hops
        # (stride X >= L) cross nodes.
        inter = row_bytes + col_bytes
        intra = row_bytes if L > 1 else 0.0
    return AllReduceEstimate(
        algorithm=algorithm,
        ranks=L * N,
        message_bytes=message_bytes,
        latency_steps=row_steps + col_steps,
        latency_seconds=row_steps * row_alpha + col_steps * col_alpha,
        bandwidth_seconds=row_steps * message_bytes / (x * row_beta)
        + col_steps * message_bytes / (x * y * col_beta),
        inter_node_bytes=inter,
        intra_node_bytes=intra,
    )


def hierarchical_allreduce(
    *, ranks_per_node: int, nodes: int, message_bytes: float, links: Links
) -> AllReduceEstimate:
    """Reduce-scatter in the node, all-reduce across nodes, all-gather in the node.

    The torus with ``X = L``, ``Y = N``: ``2(L-1) + 2(N-1)`` steps,
    ``T = 2(L-1)(alpha_intra + S/(L beta_intra)) + 2(N-1)(alpha_inter + S/(L N beta_inter))``,
    inter-node bytes per rank ``2(N-1)/N * S/L``.
    """
    return torus2d_allreduce(
        ranks_per_node=ranks_per_node,
        nodes=nodes,
        message_bytes=message_bytes,
        links=links,
        shape=(ranks_per_node, nodes),
        algorithm="hierarchical",
    )


def estimate_allreduce(
    algorithm: str,
    *,
    ranks_per_node: int,
    nodes: int,
    message_bytes: float,
    links: Links,
    torus_shape: tuple[int, int] | None = None,
) -> AllReduceEstimate:
    """Dispatch on ``algorithm`` (``flat``, ``hierarchical``, ``torus2d``)."""
    kw = dict(ranks_per_node=ranks_per_node, nodes=nodes, message_bytes=message_bytes, links=links)
    if algorithm == "flat":
        return flat_ring_allreduce(**kw)
    if algorithm == "hierarchical":
        return hierarchical_allreduce(**kw)
    if algorithm == "torus2d":
        return torus2d_allreduce(**kw, shape=torus_shape)
    raise ValueError(f"unknown algorithm {algorithm!r}; expected flat, hierarchical or torus2d")
