"""A training side far beyond the images (issue 75 item 4): a warning at start, and a step that
runs out of memory ends in one line naming the step, the batch and the side (exit 4), the
checkpoints before it intact.

The out-of-memory run is real: ``ulimit -v`` in the shell that starts ``largebatch-train``, as a
user on a shared host would meet it, lets the 16 px epoch train and makes the 4096 px batch fail
in the CPU allocator. The address-space size of a process grows with its threads (each has a
stack, glibc a malloc arena per thread), so the run is given one intra-op thread and two arenas:
a tiny run then needs about 4 GiB of address space here, the 4096 px batch of 8 more than 1.5 GiB
on top of it for its images alone (and many times that for the model's activations).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from PIL import Image

from largebatch.cli import main
from largebatch.data.build import SIDE_ABOVE_IMAGES, warn_side_above_images
from largebatch.data.contract import LoaderSpec
from largebatch.data.images import largest_sampled_side
from largebatch.engine.checkpoint import list_checkpoints, load_checkpoint
from largebatch.engine.out_of_memory import allocation_text, step_memory
from largebatch.errors import EXIT_OUT_OF_MEMORY, StepOutOfMemoryError
from tests.smoke import smoke

TRAIN = Path(sys.executable).with_name("largebatch-train")
WARNING = "longest side of the images"


def _images(root: Path, sides: list[tuple[int, int]]) -> Path:
    for i, size in enumerate(sides):
        folder = root / "train" / f"c{i % 2}"
        folder.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", size).save(folder / f"{i}.jpg")
    return root


def test_the_images_side_is_read_from_a_sample_of_headers(tmp_path: Path) -> None:
    root = _images(tmp_path, [(40, 30), (36, 50), (20, 20)])
    (root / "train" / "c0" / "notes.txt").write_text("not an image")
    assert largest_sampled_side(root / "train") == 50
    assert largest_sampled_side(tmp_path / "missing") is None


@pytest.mark.parametrize(("side", "warned"), [(SIDE_ABOVE_IMAGES * 50, False), (SIDE_ABOVE_IMAGES * 50 + 1, True)])
def test_the_warning_starts_above_the_threshold(tmp_path: Path, caplog: pytest.LogCaptureFixture, side: int,
                                                warned: bool) -> None:
    root = _images(tmp_path, [(40, 30), (36, 50)])
    with caplog.at_level(logging.WARNING):
        warn_side_above_images(root, LoaderSpec(image_size=side, batch_size=8, workers=0))
    lines = [r.getMessage() for r in caplog.records if WARNING in r.getMessage()]
    assert len(lines) == warned
    if warned:
        assert lines[0].startswith(f"data.image_size={side} trains at {side} px, 4.0x the longest side")
        assert "(50 px, sampled)" in lines[0] and "lower the side to 200 px (4x the images) or less" in lines[0]


def test_a_side_far_above_the_images_warns_once_and_the_run_goes_on(tmp_path: Path) -> None:
    """The embedded set's images are 36 px (debug=smoke): 160 px crops are more than 4x."""
    run = tmp_path / "run"
    assert main(smoke("data.image_size=160", "epochs=1", "max_steps=1", f"run_dir={run}")) == 0
    lines = [line for line in (run / "train.log").read_text().splitlines() if WARNING in line]
    assert len(lines) == 1, lines
    assert "data.image_size=160 trains at 160 px, 4.4x the longest side of the images in" in lines[0]
    assert "(36 px, sampled)" in lines[0] and "lower the side to 144 px" in lines[0]


def test_allocation_failures_in_a_step_become_one_error_and_others_pass() -> None:
    cuda = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79 GiB")
    assert allocation_text(cuda) == "out of device memory (tried to allocate 2.00 GiB)"
    with pytest.raises(StepOutOfMemoryError) as caught:
        with step_memory(step=7, epoch=1, per_device_batch=64):
            raise cuda
    assert str(caught.value) == "step 7 (epoch 2) ran out of memory with 64 images per device " \
                                "(out of device memory (tried to allocate 2.00 GiB))"
    with pytest.raises(RuntimeError, match="a bug"):
        with step_memory(step=7, epoch=1, per_device_batch=64):
            raise RuntimeError("a bug")


def test_a_step_out_of_memory_is_one_line_exit_4_and_the_checkpoint_before_it_stays(tmp_path: Path) -> None:
    if not sys.platform.startswith("linux"):
        pytest.skip("ulimit -v bounds the address space on Linux")
    run = tmp_path / "run"
    # torchvision: the allocator's own failure is the subject (auto reads with DALI where a data check
    # of the embedded set is on disk; DALI's out of memory is held in tests/test_dali.py)
    overrides = smoke("backend=cpu", "data.loader=torchvision", "data.resolution.schedule=steps",
                      "data.resolution.steps=[[0,16],[1,4096]]", f"run_dir={run}")
    env = dict(os.environ, OMP_NUM_THREADS="1", MALLOC_ARENA_MAX="2", CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run(["bash", "-c", 'ulimit -v 6000000 && exec "$@"', "bash", str(TRAIN), *overrides],
                          capture_output=True, text=True, env=env, timeout=600)
    err = proc.stderr.strip()
    assert proc.returncode == EXIT_OUT_OF_MEMORY == 4, err[-3000:]
    assert "Traceback" not in err
    line = err.splitlines()[-1]
    assert line.startswith("largebatch: error: step 5 (epoch 2) ran out of memory: 8 images per device at 4096 px "
                           "(the CPU allocator could not allocate "), line
    assert (f"lower the images per device (accumulation_steps=2 keeps global_batch_size=8 in micro-batches of 4) and "
            f"resume=auto run_dir={run} continues from its last checkpoint (ckpt-e0001-s000000004.pt), or lower the "
            "side (data.resolution.steps=[[0, 16], [1, 4096]]) in a new run_dir") in line
    saved = list_checkpoints(run / "checkpoints")
    assert [p.name for p in saved] == ["ckpt-e0001-s000000004.pt"]
    assert load_checkpoint(saved[0])["train_state"]["step"] == 4
    # the warning came at start, and the run trained its first epoch after it
    warned = [line for line in proc.stdout.splitlines() if WARNING in line]
    assert len(warned) == 1 and "data.resolution.steps=[[0, 16], [1, 4096]] trains at 4096 px" in warned[0]


def test_an_evaluation_out_of_memory_saves_the_epoch_and_is_one_line_exit_4(tmp_path: Path) -> None:
    """Issue 90 case 3: an evaluation that runs out of memory (a 4096 px evaluation side under
    ``ulimit -v``, after a 16 px epoch) ended in a traceback and exit 1, the epoch's checkpoint
    (written after the evaluation) lost and summary.json's stop_reason null. Now the epoch is
    saved, summary.json says why the run stopped, and one line (exit 4) names the setting to
    lower and the resume that continues."""
    if not sys.platform.startswith("linux"):
        pytest.skip("ulimit -v bounds the address space on Linux")
    import json

    run = tmp_path / "run"
    overrides = smoke("backend=cpu", "data.loader=torchvision", "max_steps=null", "data.resolution.eval_size=4096",
                      f"run_dir={run}")
    env = dict(os.environ, OMP_NUM_THREADS="1", MALLOC_ARENA_MAX="2", CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run(["bash", "-c", 'ulimit -v 6000000 && exec "$@"', "bash", str(TRAIN), *overrides],
                          capture_output=True, text=True, env=env, timeout=600)
    err = proc.stderr.strip()
    assert proc.returncode == EXIT_OUT_OF_MEMORY, err[-3000:]
    assert "Traceback" not in err
    line = err.splitlines()[-1]
    assert line.startswith("largebatch: error: the evaluation after epoch 1 ran out of memory: 8 images per device "
                           "at 4096 px (the CPU allocator could not allocate "), line
    assert (f"the epoch is saved (ckpt-e0001-s000000004.pt): set accumulation_steps=2 (evaluation batches of 4, "
            f"global_batch_size=8 kept) and resume=auto run_dir={run} continues with it") in line
    saved = list_checkpoints(run / "checkpoints")
    assert [p.name for p in saved] == ["ckpt-e0001-s000000004.pt"]
    assert load_checkpoint(saved[0])["train_state"]["epoch"] == 1
    assert json.loads((run / "summary.json").read_text())["stop_reason"] == \
        "the evaluation after epoch 1 ran out of memory"
