"""Helpers of the XLA tests: a tiny ResNet, fixed data, CPU references, compile counts."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any, Optional, Sequence

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

ROOT = Path(__file__).resolve().parents[2]

# The upstream XLA:CPU crashes seen with threaded replicas, the only failures a multi-replica
# test may retry: "pure virtual method called" (about 1 run in 12), and a replica killed by a
# segmentation fault inside the runtime (CI, test_noise_scale_xla: the pool reported a replica
# "terminated abruptly", no Python error; 0 in 21 runs here, quiet or at load 4). Replicas run
# with faulthandler on, so such a death names its signal and every thread's Python stack.
UPSTREAM_CRASHES = ("pure virtual method called", "Fatal Python error: Segmentation fault")
MAX_CRASH_RETRIES = 2


def upstream_crash(output: str) -> Optional[str]:
    """The upstream crash ``output`` shows, if any (:data:`UPSTREAM_CRASHES`)."""
    return next((c for c in UPSTREAM_CRASHES if c in output), None)


def tiny_resnet(num_classes: int = 4, width: int = 8) -> nn.Module:
    """A ResNet (timm BasicBlocks): stem, one block per stage, two stages, global pool, fc."""
    from timm.models.resnet import BasicBlock

    torch.manual_seed(0)
    down = nn.Sequential(nn.Conv2d(width, 2 * width, 1, stride=2, bias=False), nn.BatchNorm2d(2 * width))
    model = nn.Sequential(
        nn.Conv2d(3, width, 3, padding=1, bias=False),
        nn.BatchNorm2d(width),
        nn.ReLU(inplace=True),
        BasicBlock(width, width),
        BasicBlock(width, 2 * width, stride=2, downsample=down),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(2 * width, num_classes),
    )
    for m in model.modules():  # non-trivial BN affine parameters
        if isinstance(m, nn.BatchNorm2d):
            with torch.no_grad():
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.2, 0.2)
    return model


def fixed_batches(n_batches: int, batch_size: int, size: int = 16, classes: int = 4, seed: int = 0):
    """``n_batches`` host batches ``(images, labels)`` from a private generator."""
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(batch_size, 3, size, size, generator=g), torch.randint(0, classes, (batch_size,), generator=g))
        for _ in range(n_batches)
    ]


class ListLoader:
    """A loader over a fixed list of batches (``len``, ``batch_size``, no-op ``set_epoch``)."""

    def __init__(self, batches: Sequence[Any]) -> None:
        self.batches = list(batches)
        self.batch_size = self.batches[0][0].shape[0] if self.batches else None

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self):
        return iter(self.batches)

    def set_epoch(self, epoch: int) -> None:
        pass


def exact_eval_loader(images: torch.Tensor, labels: torch.Tensor, *, rank: int, world_size: int, batch_size: int):
    """A val DataLoader over the tensors with the exact (no duplicate) shard sampler."""
    from largebatch.data.samplers import ExactShardSampler

    ds = TensorDataset(images, labels)
    sampler = ExactShardSampler(len(ds), rank=rank, world_size=world_size)
    return DataLoader(ds, batch_size=batch_size, sampler=sampler, drop_last=False)


def compile_count() -> int:
    """XLA graph compilations so far in this process (``CompileTime`` samples)."""
    import torch_xla.debug.metrics as met

    data = met.metric_data("CompileTime")
    return int(data[0]) if data else 0


def run_replicas(
    scenario: str, out_dir: Path, *, devices: int = 4, timeout: int = 240, module: str = "tests.xla.replicas",
    env: Optional[dict[str, str]] = None,
) -> tuple[subprocess.CompletedProcess, int]:
    """Run ``python -m MODULE SCENARIO OUT_DIR`` on ``devices`` XLA:CPU replicas.

    ``module`` defaults to the backend's scenarios (``tests.xla.replicas``); ``env`` adds
    variables. Retries only the known upstream crash (at most :data:`MAX_CRASH_RETRIES`
    times) and returns ``(completed process, retries)``; every other failure is returned as
    it is.
    """
    env = dict(os.environ, PJRT_DEVICE="CPU", CPU_NUM_DEVICES=str(devices), **(env or {}))
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("PYTHONFAULTHANDLER", "1")  # a replica killed by a signal names it (and the stacks)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    retries = 0
    while True:
        proc = subprocess.run(
            [sys.executable, "-m", module, scenario, str(out_dir)],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout,
        )
        crash = upstream_crash(proc.stderr + proc.stdout) if proc.returncode != 0 else None
        if crash is None or retries >= MAX_CRASH_RETRIES:
            break
        retries += 1
        warnings.warn(f"XLA:CPU upstream crash '{crash}' in scenario {scenario!r}; retry {retries}")
    if retries:
        log = ROOT / ".cache" / "xla_upstream_crashes.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("a") as f:
            f.write(f"{scenario}: {retries} retr{'y' if retries == 1 else 'ies'}, final rc {proc.returncode}\n")
    return proc, retries


def failure_text(proc: subprocess.CompletedProcess) -> str:
    """The last 40 lines of the output, after the lines naming a replica's fatal signal (which
    faulthandler prints before the stacks and the launcher's own traceback)."""
    lines = (proc.stdout + "\n" + proc.stderr).strip().splitlines()
    fatal = [line for line in lines[:-40] if line.startswith("Fatal Python error")]
    return f"replica subprocess exited with {proc.returncode}:\n" + "\n".join([*fatal, *lines[-40:]])


def max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.detach().double().cpu() - b.detach().double().cpu()).abs().max().item()


def strip_ansi(s: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", s)
