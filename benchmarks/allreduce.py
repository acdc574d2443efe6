"""All-reduce of ResNet-50-sized gradients: measured on local gloo ranks, predicted at scale.

Run:  .venv/bin/python benchmarks/allreduce.py            (4 gloo ranks as 2 nodes x 2)
      .venv/bin/python benchmarks/allreduce.py --no-measure   (cost model only, instant)

Table 1 times ``CommState.allreduce`` (the body of the DDP hook) on one fused buffer of
25,557,032 fp32 values (102 MB) for every algorithm and compression, on spawned gloo ranks
of this machine (shared memory, CPU: it measures the code path and the CPU cost of casts and
local sums, not a network), with the bytes the busiest rank sent across "nodes" beside the
cost model's figure. Table 2 is the alpha-beta model for ResNet-50 on H100-class nodes of 8
GPUs (``largebatch.comm.cost_model.H100_LINKS``) next to MLPerf step-time anchors.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from largebatch.comm import H100_LINKS, RESNET50_GRAD_BYTES, estimate_allreduce, make_comm_state
from largebatch.comm.reducers import destroy_process_groups

RESNET50_PARAMS = RESNET50_GRAD_BYTES // 4
CASES = [(a, c) for a in ("flat", "hierarchical", "torus2d") for c in ("none", "bf16", "fp16")]
# MLPerf Training ResNet-50 on H100 (NVIDIA submissions): step time at the scale named.
ANCHORS = {8: (56.0, "MLPerf 8 x H100"), 3584: (5.7, "MLPerf 3,584 x H100")}


def _rank(rank: int, world: int, ranks_per_node: int, numel: int, reps: int, workdir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{workdir}/rendezvous", rank=rank, world_size=world
    )
    try:
        grads = torch.randn(numel, generator=torch.Generator().manual_seed(rank))
        rows = []
        for label, run in [("dist.all_reduce (no hook)", None)] + [
            (f"{a} / {c}", (a, c)) for a, c in CASES
        ]:
            state = None
            if run is not None:
                state = make_comm_state(
                    algorithm=run[0], compress=run[1], ranks_per_node=ranks_per_node
                )
            times = []
            for i in range(reps + 1):  # first call warms up
                buf = grads.clone()
                if state is not None:
                    state.reset_counters()
                dist.barrier()
                t0 = time.perf_counter()
                if state is None:
                    dist.all_reduce(buf.div_(world))
                else:
                    state.allreduce(buf, bucket_index=0).wait()  # as DDP's hook calls it
                elapsed = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
                dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the slowest rank sets the pace
                if i:
                    times.append(elapsed.item())
            inter = torch.tensor([state.inter_node_bytes if state else 0], dtype=torch.float64)
            dist.all_reduce(inter, op=dist.ReduceOp.MAX)
            payload = state.payload_bytes if state else numel * 4
            rows.append((label, run, statistics.median(times), min(times), inter.item(), payload))
        if rank == 0:
            _print_measured(rows, world, ranks_per_node, numel, reps)
    finally:
        destroy_process_groups()


def _print_measured(rows, world: int, ranks_per_node: int, numel: int, reps: int) -> None:
    nodes = world // ranks_per_node
    print(
        f"\nMeasured: all-reduce of {numel:,} fp32 ({numel * 4 / 1e6:.1f} MB), {world} gloo ranks "
        f"as {nodes} nodes x {ranks_per_node}, median / min of {reps}\n"
    )
    print(
        f"| {'algorithm / compress':26s} | median ms | min ms "
        "| inter-node MB (busiest rank) | model MB |"
    )
    print(f"|{'-' * 28}|-----------|--------|------------------------------|----------|")
    for label, run, median, best, inter, payload in rows:
        if run is None:
            model = "-"
            inter_s = "-"
        else:
            est = estimate_allreduce(
                run[0], ranks_per_node=ranks_per_node, nodes=nodes, message_bytes=payload,
                links=H100_LINKS,
            )
            model, inter_s = f"{est.inter_node_bytes / 1e6:.2f}", f"{inter / 1e6:.2f}"
        print(
            f"| {label:26s} | {median * 1e3:9.0f} | {best * 1e3:6.0f} "
            f"| {inter_s:>28s} | {model:>8s} |"
        )


def _square_grid(gpus: int, per_node: int) -> tuple[int, int]:
    """The X x Y grid nearest to square whose rows align with nodes (X divides or is a
    multiple of ``per_node``)."""
    options = [
        x for x in range(1, gpus + 1)
        if gpus % x == 0 and (per_node % x == 0 or x % per_node == 0)
    ]
    x = min(options, key=lambda v: (v + gpus // v, v))
    return x, gpus // x


def print_model(per_node: int = 8, gpu_counts=(8, 64, 512, 3584, 4096)) -> None:
    links = H100_LINKS
    print(
        f"\nModel: ResNet-50 gradients ({RESNET50_GRAD_BYTES / 1e6:.1f} MB fp32) as one message, "
        f"{per_node} GPUs per node; NVLink {links.intra_bandwidth / 1e9:.0f} GB/s + "
        f"{links.intra_latency * 1e6:.0f} us per step, IB {links.inter_bandwidth / 1e9:.0f} GB/s "
        f"(400 Gb/s per GPU) + {links.inter_latency * 1e6:.0f} us per step; one ring per "
        "collective\n"
    )
    print(
        "| GPUs | algorithm    | grid   | wire | steps | latency ms | bandwidth ms | total ms "
        "| inter-node MB/rank |\n"
        "|-----:|--------------|--------|------|------:|-----------:|-------------:|---------:"
        "|-------------------:|"
    )
    best: dict[int, dict[str, tuple[float, str]]] = {}
    for gpus in gpu_counts:
        nodes = max(gpus // per_node, 1)
        per = min(per_node, gpus)
        square = _square_grid(gpus, per)
        for alg, shape in [("flat", None), ("hierarchical", (per, nodes)), ("torus2d", square)]:
            if alg == "torus2d" and square == (per, nodes):
                continue  # same as hierarchical
            for wire, nbytes in (("fp32", RESNET50_GRAD_BYTES), ("bf16", RESNET50_GRAD_BYTES / 2)):
                est = estimate_allreduce(
                    alg, ranks_per_node=per, nodes=nodes, message_bytes=nbytes, links=links,
                    torus_shape=shape if alg == "torus2d" else None,
                )
                grid = "-" if shape is None else f"{shape[0]}x{shape[1]}"
                label = f"{alg} {grid} {wire}".replace(" - ", " ")
                best.setdefault(gpus, {})[label] = (est.seconds, label)
                print(
                    f"| {gpus:4d} | {alg:12s} | {grid:6s} | {wire} | {est.latency_steps:5d} | "
                    f"{est.latency_seconds * 1e3:10.2f} | {est.bandwidth_seconds * 1e3:12.2f} | "
                    f"{est.seconds * 1e3:8.2f} | {est.inter_node_bytes / 1e6:18.2f} |"
                )
    print("\nAgainst measured MLPerf ResNet-50 step times (H100):")
    for gpus, (step_ms, source) in ANCHORS.items():
        if gpus not in best:
            continue
        flat = best[gpus]["flat fp32"][0] * 1e3
        hier_label = f"hierarchical {min(per_node, gpus)}x{max(gpus // per_node, 1)} fp32"
        hier = best[gpus][hier_label][0] * 1e3
        fastest_s, fastest = min(best[gpus].values())
        print(
            f"- {gpus:,} GPUs, {source} step ~{step_ms:g} ms: flat ring {flat:.2f} ms "
            f"({flat / step_ms:.1%} of the step), hierarchical {hier:.2f} ms "
            f"({hier / step_ms:.1%}), fastest modelled {fastest} {fastest_s * 1e3:.2f} ms "
            f"({fastest_s * 1e3 / step_ms:.1%})"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--ranks-per-node", type=int, default=2)
    parser.add_argument("--numel", type=int, default=RESNET50_PARAMS)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--no-measure", action="store_true", help="print the cost model only")
    args = parser.parse_args()
    if not args.no_measure:
        with tempfile.TemporaryDirectory(prefix="lb_allreduce_") as workdir:
            os.environ.setdefault("OMP_NUM_THREADS", "1")
            mp.start_processes(
                _rank,
                args=(args.ranks, args.ranks_per_node, args.numel, args.reps, workdir),
                nprocs=args.ranks,
                join=True,
                start_method="spawn",
            )
    print_model()


if __name__ == "__main__":
    main()
