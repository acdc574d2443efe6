"""A checkpoint written before each key of ``checkpoint_format.ADDED_KEYS`` was added resumes
exactly (issue 71, item 3).

A real run of this code (tests/test_resume.py's exact resume, no feature on) trains 8 steps with
a checkpoint every 2. For each commit that added keys, its step-6 checkpoint loses the keys of
that commit and of every later one (what a run of the commit before wrote: format 2, nothing
of the later keys) and is resumed; the resumed run ends with the uninterrupted run's weights,
bit for bit, and the absent keys read back as the table's ``absent`` values.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from largebatch.cli import main
from largebatch.engine.checkpoint import checkpoint_step, list_checkpoints, load_checkpoint, save_checkpoint
from largebatch.engine.checkpoint_format import ADDED_KEYS
from tests.smoke import EXACT, smoke

RUN = smoke("checkpoint.every_steps=2", base=EXACT)

# the commits that added keys, oldest first (the table lists its keys in the order added)
ADDITIONS = list(dict.fromkeys(added.since for added in ADDED_KEYS.values()))


@pytest.fixture(scope="module")
def straight(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("straight") / "run"
    assert main([*RUN, f"run_dir={run}"]) == 0
    return run


def _remove(state: dict[str, Any], key: str) -> bool:
    """Delete ``key`` (a dotted path) from ``state``; whether it was there."""
    *parents, last = key.split(".")
    node = state
    for part in parents:
        node = node.get(part) if isinstance(node, dict) else None
    if not isinstance(node, dict) or last not in node:
        return False
    del node[last]
    return True


def _written_before(state: dict[str, Any], addition: str) -> tuple[dict[str, Any], list[str]]:
    """``state`` as the code before ``addition`` wrote it, and the keys taken out."""
    later = ADDITIONS[ADDITIONS.index(addition):]
    removed = [key for key, added in ADDED_KEYS.items() if added.since in later and _remove(state, key)]
    state.pop("features", None)
    state["format"] = 2
    return state, removed


@pytest.mark.slow  # 12 resumes of 2 steps: ~15 s each on a loaded 2-core machine
@pytest.mark.parametrize("addition", ADDITIONS)
def test_a_checkpoint_written_before_an_addition_resumes_exactly(addition: str, straight: Path,
                                                                 tmp_path: Path) -> None:
    step6, step8 = (next(p for p in list_checkpoints(straight / "checkpoints") if checkpoint_step(p) == s)
                    for s in (6, 8))
    old, removed = _written_before(load_checkpoint(step6), addition)
    # every addition but the device generator's (none on CPU) takes a key out of a real checkpoint
    assert removed or addition == ADDED_KEYS["rng.device"].since, addition
    run = tmp_path / "run"
    save_checkpoint(old, run / "checkpoints", step6.name)
    assert main([*RUN, f"run_dir={run}", "resume=auto"]) == 0

    resumed = load_checkpoint(list_checkpoints(run / "checkpoints")[-1])
    done = load_checkpoint(step8)
    assert resumed["train_state"]["step"] == 8
    assert resumed["model"].keys() == done["model"].keys()
    for name, value in done["model"].items():
        assert torch.equal(resumed["model"][name], value), (addition, name)
    assert resumed["train_state"]["batch_factors"] == done["train_state"]["batch_factors"] == []
    for key in removed:  # the resumed run writes them again, as a run from the start does
        assert _remove(resumed, key) and _remove(done, key), key
