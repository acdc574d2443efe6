"""The training CLI on a CUDA GPU: fp16 with dynamic loss scaling, bf16, channels_last, DDP."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from largebatch.cli import main
from largebatch.engine.checkpoint import list_checkpoints, load_checkpoint

pytestmark = pytest.mark.gpu

TINY = ["debug=smoke", "progress=false", "data.workers=2", "backend=cuda", "epochs=1"]


def _run_dir(root: Path) -> Path:
    (run,) = [p for p in root.iterdir() if p.is_dir()]
    return run


def test_fp16_with_loss_scaling(cache: Path) -> None:
    out = cache / "runs"
    assert main([*TINY, "precision=fp16", "optimizer=lars", f"output_root={out}"]) == 0
    run = _run_dir(out)
    state = load_checkpoint(list_checkpoints(run / "checkpoints")[-1])
    assert state["scaler"] is not None and state["scaler"]["scale"] > 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["precision"] == "fp16" and summary["best_top1"] is not None


def test_bf16_channels_last(cache: Path) -> None:
    out = cache / "runs"
    assert main([*TINY, "precision=bf16", "model.channels_last=true", f"output_root={out}"]) == 0
    summary = json.loads((_run_dir(out) / "summary.json").read_text())
    assert summary["precision"] == "bf16"
    assert "cuda" in summary["backend"]


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_torchrun_two_gpus_nccl(cache: Path) -> None:
    out = cache / "runs"
    env = dict(os.environ, LARGEBATCH_CACHE=str(cache / "cache"))
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "largebatch.train",
         *TINY, "bn.group_size=2", "max_steps=2", f"output_root={out}"],
        env=env, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len([p for p in out.iterdir() if p.is_dir()]) == 1


def test_training_sets_cudnn_benchmark_from_the_config(cache: Path) -> None:
    """backend.cudnn_benchmark (default true) reaches torch.backends.cudnn.benchmark on CUDA,
    as benchmarks/throughput.py sets it, so its numbers transfer to training."""
    torch.backends.cudnn.benchmark = False
    assert main([*TINY, "max_steps=1", f"output_root={cache / 'on'}"]) == 0
    assert torch.backends.cudnn.benchmark is True
    assert main([*TINY, "max_steps=1", "backend.cudnn_benchmark=false", f"output_root={cache / 'off'}"]) == 0
    assert torch.backends.cudnn.benchmark is False
