"""The run's hooks come in the order the loop needs, and only rank 0 gets the writers."""

from __future__ import annotations

from pathlib import Path

from largebatch.engine import hooks as H
from largebatch.engine.assemble import LogSettings, build_run_hooks
from largebatch.engine.mllog import MLPerfLogHook
from largebatch.engine.preemption import PreemptionHook


def _kinds(is_main: bool, tmp_path: Path, **kwargs: object) -> list[type]:
    hooks = build_run_hooks(run_dir=tmp_path, is_main=is_main, val_loader=[], agree_every=1, **kwargs)
    assert hooks.preemption in hooks.hooks and hooks.hooks[-1] is hooks.summary
    for h in hooks.hooks:
        if isinstance(h, MLPerfLogHook):
            h.file.close()
    return [type(h) for h in hooks.hooks]


def test_rank0_order(tmp_path: Path) -> None:
    assert _kinds(True, tmp_path) == [
        H.DataOrderHook, H.ProgressHook, H.BatchLogHook, PreemptionHook, MLPerfLogHook, H.EvalHook,
        H.CheckpointHook, H.TensorBoardHook, H.JsonlHook, H.SummaryHook,
    ]
    assert H.TensorBoardHook not in _kinds(True, tmp_path, logging=LogSettings(tensorboard=False))


def test_the_adaptive_batch_hook_decides_before_anything_reads_the_batch(tmp_path: Path) -> None:
    from largebatch.engine.assemble import OptionalHooks
    from largebatch.engine.loop import Hook

    class Decider(Hook):
        pass

    hooks = build_run_hooks(run_dir=tmp_path, is_main=True, val_loader=[], agree_every=1,
                            optional=OptionalHooks(batch=Decider()))
    assert isinstance(hooks.hooks[0], Decider) and isinstance(hooks.hooks[1], H.DataOrderHook)


def test_other_ranks_write_nothing(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    kinds = _kinds(False, run)
    assert kinds == [H.DataOrderHook, H.ProgressHook, PreemptionHook, H.EvalHook, H.CheckpointHook, H.SummaryHook]
    assert list(run.iterdir()) == []
    hooks = build_run_hooks(run_dir=run, is_main=False, val_loader=[], agree_every=7,
                            logging=LogSettings(progress=True))
    assert hooks.summary.path is None and hooks.preemption.check_every == 7
    assert not next(h for h in hooks.hooks if isinstance(h, H.ProgressHook)).enabled
