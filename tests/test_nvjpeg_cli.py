"""``data.loader=nvjpeg`` through the training CLI on the CPU: a short run on the embedded set
(with its PNG and CMYK oddities), exact resume mid-epoch, and ``auto`` on the CPU reading the decoded store, not nvjpeg."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from largebatch.cli import main
from largebatch.engine.checkpoint import list_checkpoints, load_checkpoint
from tests import smoke

EXACT = [*smoke.EXACT, "data.loader=nvjpeg"]  # tests/test_resume.py's, with nvjpeg


pytestmark = pytest.mark.usefixtures("cache")  # tests/conftest.py


def _last(run: Path) -> dict:
    return load_checkpoint(list_checkpoints(run / "checkpoints")[-1])


def test_smoke_run_reads_with_nvjpeg(tmp_path: Path) -> None:
    run = tmp_path / "run"
    assert main(["debug=smoke", "progress=false", "model=resnet10t", "data.loader=nvjpeg", "data.workers=2",
                 "epochs=1", f"run_dir={run}"]) == 0
    log = (run / "train.log").read_text()
    assert "input pipeline: nvjpeg, CPU decode and augmentation on cpu, 2 file-reading worker(s)" in log
    # the embedded set's PNG and CMYK files are decoded on the CPU and named; nothing skipped
    assert "on the CPU: PNG data, not a JPEG" in log and "on the CPU: CMYK/YCCK JPEG" in log
    assert "unreadable" not in log
    assert "(32 images)" in log  # every val image once
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 4 and summary["final_top1"] is not None
    assert summary["channels_last"] is False and summary["compile"] == "none"


def test_stop_and_resume_gives_identical_weights(tmp_path: Path) -> None:
    straight = tmp_path / "straight"
    assert main([*EXACT, f"run_dir={straight}"]) == 0
    run = tmp_path / "run"
    assert main([*EXACT, f"run_dir={run}", "max_steps=5"]) == 0
    assert _last(run)["train_state"]["epoch_step"] == 1  # stopped mid-epoch
    assert main([*EXACT, f"run_dir={run}", "resume=auto", "max_steps=null"]) == 0
    a, b = _last(straight), _last(run)
    assert a["train_state"]["step"] == b["train_state"]["step"] == 8
    different = [k for k in a["model"] if not torch.equal(a["model"][k], b["model"][k])]
    assert not different, f"{len(different)} tensors differ after resume, e.g. {different[:3]}"


def test_auto_on_cpu_reads_the_decoded_store_not_nvjpeg(tmp_path: Path) -> None:
    """On the CPU backend ``auto`` reads from the decoded store (it fits the cache: issue 72,
    item 4) and says why in the run's start-up log; nvjpeg is for CUDA devices."""
    run = tmp_path / "run"
    assert main([*EXACT, "data.loader=auto", f"run_dir={run}", "max_steps=1"]) == 0
    log = (run / "train.log").read_text()
    assert "data.loader=auto: reading with the decoded store, the fastest input on a CPU host" in log
    assert "input pipeline: decoded store" in log
    assert "nvjpeg" not in log


def test_shards_are_not_read_by_nvjpeg(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main([*EXACT, f"data.shards={tmp_path}", f"run_dir={tmp_path / 'run'}"]) == 2
    assert "is read by DALI only" in capsys.readouterr().err


def test_torchrun_two_ranks_evaluate_every_image_once(tmp_path: Path) -> None:
    """2 gloo ranks with nvjpeg: disjoint train shards, the 32 val images counted once in all."""
    import os
    import subprocess
    import sys

    run = tmp_path / "run"
    env = dict(os.environ, OMP_NUM_THREADS="1", LARGEBATCH_CACHE=str(tmp_path / "cache"))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m",
           "largebatch.train", "debug=smoke", "progress=false", "tensorboard=false", "model=resnet10t",
           "backend=cpu", "data.loader=nvjpeg", "epochs=1", f"run_dir={run}"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).resolve().parents[1])
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    log = (run / "train.log").read_text()
    assert "input pipeline: nvjpeg" in log and "x 2 devices" in log and "(32 images)" in log
