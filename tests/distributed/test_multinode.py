"""Two torchrun "nodes" on this machine meet in a c10d rendezvous and train as one job.

Each node is ``launch/torchrun_multinode.sh`` (NNODES=2, NODE_RANK=0/1, one gloo process per
node, rendezvous on 127.0.0.1:<free port>) running the 2-step smoke job; the job must finish
on both nodes with exactly one run directory, written by rank 0 of a world of 2.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "launch" / "torchrun_multinode.sh"
TIMEOUT_S = 300  # both nodes together; a healthy run takes ~30 s on 2 idle cores


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun() -> str:
    """torchrun of the interpreter running the tests (the launch script word-splits it)."""
    script = Path(sys.executable).with_name("torchrun")
    return str(script) if script.is_file() else f"{sys.executable} -m torch.distributed.run"


def _kill_group(proc: subprocess.Popen) -> None:
    """Kill a node's whole process group (torchrun, which the script execs, and its workers)."""
    if proc.poll() is None or proc.returncode != 0:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait(timeout=30)


def _tail(path: Path, n: int = 3000) -> str:
    text = path.read_text(errors="replace") if path.exists() else ""
    return text[-n:]


def test_two_nodes_train_into_one_run_dir(tmp_path: Path) -> None:
    port = _free_port()
    output_root = tmp_path / "runs"
    env = {
        **os.environ,
        "NNODES": "2",
        "NPROC_PER_NODE": "1",
        "RDZV_ENDPOINT": f"127.0.0.1:{port}",
        "RDZV_ID": f"test-{port}",
        "TORCHRUN": _torchrun(),
        "LARGEBATCH_CACHE": str(tmp_path / "cache"),
        "OMP_NUM_THREADS": "1",
    }
    overrides = [
        "backend=cpu",
        "debug=smoke",
        "max_steps=2",
        "epochs=1",
        f"output_root={output_root}",
        "log_every=1",
        "progress=false",
        "tensorboard=false",
    ]
    nodes: list[subprocess.Popen] = []
    logs = [tmp_path / f"node{rank}.log" for rank in range(2)]
    try:
        for rank, log in enumerate(logs):
            with open(log, "wb") as out:
                nodes.append(
                    subprocess.Popen(
                        ["bash", str(SCRIPT), *overrides],
                        env={**env, "NODE_RANK": str(rank)},
                        cwd=tmp_path,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,  # its own process group, killed as one
                    )
                )
        deadline = time.monotonic() + TIMEOUT_S
        while any(p.poll() is None for p in nodes):
            # One node failing leaves the other waiting in the rendezvous: stop early.
            if any(p.returncode not in (None, 0) for p in nodes) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
    finally:
        for p in nodes:
            _kill_group(p)
    report = "\n".join(
        f"--- node {rank} (exit {p.returncode}) ---\n{_tail(logs[rank])}" for rank, p in enumerate(nodes)
    )
    assert [p.returncode for p in nodes] == [0, 0], report

    run_dirs = [d for d in output_root.iterdir() if d.is_dir()]
    assert len(run_dirs) == 1, f"expected one run directory, got {run_dirs}\n{report}"
    run_dir = run_dirs[0]
    assert (run_dir / "config.yaml").is_file(), report
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["kind"] == "train"] == [1, 2], records
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["world_size"] == 2
    assert summary["steps"] == 2
