"""Batch-size control (``batch_schedule``, issue 57) on one XLA:CPU device, through the CLI in-process.

On XLA the step is one graph (``mark_step`` once per optimizer step), so a phase whose factor k
is new compiles one new step graph in either form: ``via=accumulation`` traces k forwards and
backwards of the base micro-batch into it, ``via=per_device`` one of k times the batch. The
bound checked here: after the first phase's warm-up (the first step, and the second, whose
optimizer state now exists), each later phase compiles exactly one graph, at its first step,
and no other step compiles; a resumed run compiles at most one graph more, at its first step
(as it does without a batch schedule).

A run stopped inside phase 2 and resumed ends with the uninterrupted run's weights bit for bit:
the same computation on the same inputs (measured bit-identical with torch-xla 2.9 on XLA:CPU,
the resumed first step's extra graph included), so ``torch.equal``, no tolerance.

Run in ``.venv-xla`` with ``PJRT_DEVICE=CPU`` (scripts/test_xla.sh); skipped without torch-xla.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from largebatch.engine.checkpoint import list_checkpoints, load_checkpoint
from largebatch.engine.loop import Trainer
from tests.smoke import EXACT, smoke
from tests.xla.common import compile_count

pytestmark = pytest.mark.xla

# 4 classes x 8 images, base global batch 8 on one device: 4 steps of 8 in epoch 0, 2 of 16 in
# epoch 1, 1 of 32 in epoch 2. 32 px: resnet10t's last stage pools a 16 px input to 0 x 0 on XLA.
JOB = smoke("backend=xla", "data.image_size=32", "epochs=3", "batch_schedule.steps=[[1,16],[2,32]]", base=EXACT)
FACTORS = [1] * 4 + [2] * 2 + [4]  # per step


@pytest.fixture
def step_compiles(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The graphs compiled during each optimizer step (its micro-batches' forwards and backwards,
    the update; ``run_step`` ends with ``mark_step``, which compiles and runs the step's graph)."""
    seen: list[int] = []
    run_step = Trainer.run_step

    def counted(self: Trainer, micro_batches: list) -> None:
        before = compile_count()
        run_step(self, micro_batches)
        seen.append(compile_count() - before)

    monkeypatch.setattr(Trainer, "run_step", counted)
    return seen


def _last(run: Path) -> dict:
    return load_checkpoint(list_checkpoints(run / "checkpoints")[-1])


@pytest.mark.parametrize("via", ["accumulation", "per_device"])
def test_each_new_factor_compiles_one_step_graph_and_a_resume_is_bit_identical(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step_compiles: list[int], via: str) -> None:
    pytest.importorskip("torch_xla")
    from largebatch.cli import main

    monkeypatch.setenv("LARGEBATCH_CACHE", str(tmp_path / "cache"))
    job = [*JOB, f"batch_schedule.via={via}"]
    straight, run = tmp_path / "straight", tmp_path / "run"
    assert main([*job, f"run_dir={straight}"]) == 0
    assert len(step_compiles) == len(FACTORS)
    # phase 1: at most the two warm-up graphs (none where an earlier test of this process compiled them)
    assert step_compiles[0] <= 1 and step_compiles[1] <= 1 and step_compiles[2:4] == [0, 0], step_compiles
    # each later phase (a factor not seen before): one new step graph, at its first step
    assert step_compiles[4:] == [1, 0, 1], step_compiles

    step_compiles.clear()
    assert main([*job, f"run_dir={run}", "max_steps=5"]) == 0  # inside phase 2 (epoch 1, its first step)
    assert main([*job, f"run_dir={run}", "resume=auto"]) == 0
    # the uninterrupted run's graphs, but for one more at the resumed process's first step (the same
    # without a batch schedule: a step on state loaded from a checkpoint traces another graph once)
    assert step_compiles[:5] == [0] * 5 and step_compiles[5] <= 1 and step_compiles[6:] == [0], step_compiles

    a, b = _last(straight), _last(run)
    assert (b["train_state"]["step"], b["train_state"]["epoch"], b["train_state"]["images_seen"]) == (7, 3, 3 * 32)
    assert [k for k in a["model"] if not torch.equal(a["model"][k], b["model"][k])] == []


def test_each_new_side_of_progressive_resizing_compiles_one_step_graph(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step_compiles: list[int]) -> None:
    """Progressive resizing on XLA: 32, then 40, then 48 px (one epoch each, 4 steps of 8): each new
    side compiles one step graph, at its epoch's first step, and no other step compiles."""
    pytest.importorskip("torch_xla")
    from largebatch.cli import main

    monkeypatch.setenv("LARGEBATCH_CACHE", str(tmp_path / "cache"))
    sides = smoke("backend=xla", "data.image_size=32", "epochs=3", "data.resolution.schedule=steps",
                  "data.resolution.steps=[[0,32],[1,40],[2,48]]", base=EXACT)
    assert main([*sides, f"run_dir={tmp_path / 'run'}"]) == 0
    assert len(step_compiles) == 12
    assert step_compiles[0] <= 1 and step_compiles[1] <= 1 and step_compiles[2:4] == [0, 0], step_compiles
    assert step_compiles[4:] == [1, 0, 0, 0, 1, 0, 0, 0], step_compiles
