"""Where ranks live (node of each rank) and the rank groups of the hierarchical and 2-D torus
all-reduce.

Ranks are numbered node-major, as torchrun numbers them: node ``k`` holds ranks
``k * ranks_per_node ... (k + 1) * ranks_per_node - 1``. The 2-D torus puts rank ``r`` at
column ``x = r % X`` of row ``y = r // X`` on an ``X x Y`` grid (Mikami et al. 2018,
arXiv 1811.05233; Ying et al. 2018, arXiv 1811.06992). The hierarchical all-reduce of Jia et
al. 2018 (arXiv 1807.11205) is that grid with ``X = ranks_per_node``: rows are nodes, columns
are the ranks that share a local rank.

Everything here is pure (no process group needed); :func:`build_groups` in ``hooks.py`` turns
the rank lists into process groups.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from largebatch.errors import UsageError

__all__ = ["Topology", "resolve_topology", "grid_shape", "row_groups", "column_groups"]


@dataclass(frozen=True)
class Topology:
    """``world_size`` ranks on ``world_size // ranks_per_node`` nodes, numbered node-major."""

    world_size: int
    ranks_per_node: int

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise UsageError(f"world_size must be >= 1, got {self.world_size}")
        if self.ranks_per_node < 1:
            raise UsageError(f"ranks_per_node must be >= 1, got {self.ranks_per_node}")
        if self.world_size % self.ranks_per_node:
            raise UsageError(
                f"world size {self.world_size} is not divisible by ranks_per_node "
                f"{self.ranks_per_node}: every node must run the same number of ranks"
            )

    @property
    def nodes(self) -> int:
        return self.world_size // self.ranks_per_node

    def node_of(self, rank: int) -> int:
        return rank // self.ranks_per_node


def resolve_topology(world_size: int, ranks_per_node: int | None, *, required: bool) -> Topology:
    """Topology from an explicit ``ranks_per_node``, else torchrun's ``LOCAL_WORLD_SIZE``.

    The explicit value wins, so one machine can simulate several nodes (4 local ranks as
    2 nodes x 2). With neither, all ranks are taken to share one node when ``required`` is
    false (flat all-reduce: only the byte counters depend on it); when ``required`` is true
    (an algorithm whose groups follow nodes) that is a configuration error.
    """
    if ranks_per_node is None:
        env = os.environ.get("LOCAL_WORLD_SIZE")
        if env is not None:
            try:
                ranks_per_node = int(env)
            except ValueError:
                raise UsageError(f"LOCAL_WORLD_SIZE={env!r} is not an integer") from None
        elif required:
            raise UsageError(
                "ranks per node is unknown: pass comm.ranks_per_node or launch with torchrun "
                "(which sets LOCAL_WORLD_SIZE)"
            )
        else:
            ranks_per_node = world_size
    return Topology(world_size=world_size, ranks_per_node=ranks_per_node)


def grid_shape(topology: Topology, torus_shape: tuple[int, int] | None = None) -> tuple[int, int]:
    """The ``(X, Y)`` torus grid: ``torus_shape`` if given, else ``(ranks_per_node, nodes)``."""
    if torus_shape is None:
        return topology.ranks_per_node, topology.nodes
    if len(torus_shape) != 2:
        raise UsageError(f"torus_shape must be (X, Y), got {torus_shape!r}")
    x, y = (int(v) for v in torus_shape)
    if x < 1 or y < 1 or x * y != topology.world_size:
        raise UsageError(
            f"torus_shape {x} x {y} does not tile the world of {topology.world_size} ranks "
            "(need X * Y == world size, both >= 1)"
        )
    return x, y


def row_groups(shape: tuple[int, int]) -> list[list[int]]:
    """The ``Y`` rows of an ``X x Y`` grid: ``[y*X, ..., y*X + X - 1]``."""
    x, y = shape
    return [[row * x + col for col in range(x)] for row in range(y)]


def column_groups(shape: tuple[int, int]) -> list[list[int]]:
    """The ``X`` columns of an ``X x Y`` grid: ``[x, x + X, ..., x + (Y-1)*X]``."""
    x, y = shape
    return [[row * x + col for row in range(y)] for col in range(x)]
