"""Gradient communication for data-parallel training at thousands of ranks.

At 1,000+ accelerators a ResNet-50 step lasts a few milliseconds and the gradient all-reduce,
mostly its latency, sets the pace. Jia et al. 2018 (arXiv 1807.11205: hierarchical all-reduce,
tensor fusion, fp16 gradients), Ying et al. 2018 (arXiv 1811.06992) and Mikami et al. 2018
(arXiv 1811.05233: 2-D torus all-reduce) won their records here. This package offers:

- ``ddp_hooks``: DDP communication hooks, ``comm.algorithm: flat | hierarchical | torus2d`` and
  ``comm.compress: none | fp16 | bf16`` (any pair), with per-rank counters of collectives and
  of bytes sent inside and across nodes. Entry point: :func:`register_comm_hook`.
- ``topology``: ranks per node (explicit or torchrun's ``LOCAL_WORLD_SIZE``) and the row /
  column rank groups of the ``X x Y`` grid.
- ``compress``: the wire dtype; the bucket is averaged before the cast and cast back after.
- ``cost_model``: alpha-beta times and inter-node bytes of the three algorithms.
- ``xla_cpu_threads``: the measures that keep XLA:CPU replicas which are threads of one
  process from deadlocking (thread pool, no aliasing, one launch lock); nowhere else.

Tensor fusion is DDP's bucketing: gradients are packed into buckets of ``comm.bucket_mb``
(``bucket_cap_mb``) and each bucket is one call of the hook. Larger buckets mean fewer, larger
messages, so the per-message latency term (``2(p-1) * alpha`` per collective) is paid fewer
times; but the first bucket fills only when backward has produced that many bytes of
gradients, so its all-reduce starts later and less communication overlaps the backward pass.
Small buckets overlap well and pay the latency many times; at a few ms per step and thousands
of ranks the latency term dominates, so large buckets (or one) plus a low-latency algorithm win.
"""

from largebatch.comm.cost_model import (
    H100_LINKS,
    RESNET50_GRAD_BYTES,
    AllReduceEstimate,
    Links,
    estimate_allreduce,
    flat_ring_allreduce,
    hierarchical_allreduce,
    torus2d_allreduce,
)
from largebatch.comm.ddp_hooks import (
    ALGORITHMS,
    CommState,
    SquaredNormTap,
    comm_hook,
    make_comm_state,
    register_comm_hook,
)
from largebatch.comm.compress import COMPRESSIONS
from largebatch.comm.topology import Topology, resolve_topology

__all__ = [
    "ALGORITHMS",
    "COMPRESSIONS",
    "AllReduceEstimate",
    "CommState",
    "H100_LINKS",
    "Links",
    "RESNET50_GRAD_BYTES",
    "SquaredNormTap",
    "Topology",
    "comm_hook",
    "estimate_allreduce",
    "flat_ring_allreduce",
    "hierarchical_allreduce",
    "make_comm_state",
    "register_comm_hook",
    "resolve_topology",
    "torus2d_allreduce",
]
