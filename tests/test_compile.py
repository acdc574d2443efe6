"""``model.compile``: mode parsing, checkpoints without ``_orig_mod.`` prefixes, and (slow) a
compiled CPU training run that saves and resumes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from largebatch.backends.torch_dist import TorchDistributedBackend
from largebatch.cli import main
from largebatch.config import ConfigError, compose_config, to_train_config
from largebatch.engine.checkpoint import list_checkpoints, load_checkpoint
from largebatch.engine.compile import compile_model, parse_compile_mode, strip_compile_prefixes, unwrap_model
from largebatch.engine.hooks import CheckpointHook
from largebatch.engine.loop import StepSettings, Trainer
from largebatch.errors import UsageError
from tests.smoke import smoke


@pytest.mark.parametrize("value,mode", [
    ("none", "none"), (False, "none"), ("false", "none"), (True, "default"), ("default", "default"),
    ("reduce-overhead", "reduce-overhead"), ("max-autotune-no-cudagraphs", "max-autotune-no-cudagraphs"),
])
def test_parse_compile_mode(value: object, mode: str) -> None:
    assert parse_compile_mode(value) == mode


def test_config_takes_modes_and_booleans() -> None:
    assert to_train_config(compose_config([])).model.compile == "none"
    assert to_train_config(compose_config(["model.compile=true"])).model.compile == "default"
    assert to_train_config(compose_config(["model.compile=reduce-overhead"])).model.compile == "reduce-overhead"
    assert to_train_config(compose_config([])).model.channels_last is None  # auto: CUDA only


def test_the_composed_config_holds_the_canonical_mode() -> None:
    """The compose-time check writes the mode back, so the saved config.yaml says ``default``."""
    assert compose_config(["model.compile=true"]).model.compile == "default"
    assert compose_config(["model.compile=False"]).model.compile == "none"
    with pytest.raises(ConfigError, match=r"^model.compile='fastest' is not a compile mode"):
        compose_config(["model.compile=fastest"])


def test_bad_mode_is_one_line_and_exit_2(capsys: pytest.CaptureFixture) -> None:
    assert main(["model.compile=fastest"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("largebatch: error: model.compile='fastest' is not a compile mode") and "\n" not in err


def test_unwrap_and_strip() -> None:
    model = nn.Sequential(nn.Linear(2, 3), nn.BatchNorm1d(3))
    compiled = compile_model(model, "default")  # torch.compile is lazy: nothing compiles here
    assert compile_model(model, "none") is model
    assert unwrap_model(compiled) is model
    prefixed = compiled.state_dict()
    assert all(k.startswith("_orig_mod.") for k in prefixed)
    assert strip_compile_prefixes(prefixed).keys() == model.state_dict().keys()


def test_checkpoint_of_a_compiled_model_has_plain_keys(tmp_path: Path) -> None:
    model = nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    hook = CheckpointHook(tmp_path)
    Trainer(
        model=compile_model(model, "default"), optimizer=optimizer,
        scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0),
        train_loader=[(torch.zeros(2, 4), torch.zeros(2, dtype=torch.int64))], backend=TorchDistributedBackend("cpu"),
        settings=StepSettings(epochs=1, global_batch_size=2), hooks=[hook],
    )
    assert hook.state()["model"].keys() == model.state_dict().keys()


@pytest.mark.slow  # torch.compile on the CPU: ~1 min cold for resnet10t at 16 px on 2 cores
def test_compiled_run_saves_plain_checkpoints_and_resumes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LARGEBATCH_CACHE", str(tmp_path / "cache"))
    run = tmp_path / "run"
    args = smoke("model=resnet10t", "precision=fp32", "model.compile=default", "epochs=1", f"run_dir={run}")
    assert main([*args, "max_steps=2", "checkpoint.every_steps=1"]) == 0
    state = load_checkpoint(list_checkpoints(run / "checkpoints")[-1])
    assert state["train_state"]["step"] == 2
    assert not [k for k in state["model"] if "_orig_mod" in k]
    assert main([*args, "resume=auto"]) == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 4 and summary["compile"] == "default" and summary["final_top1"] is not None


def test_a_checkpoint_with_compile_prefixes_still_resumes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Checkpoints of compiled runs from before the fix carry ``_orig_mod.`` keys."""
    from largebatch.engine.checkpoint import save_checkpoint

    monkeypatch.setenv("LARGEBATCH_CACHE", str(tmp_path / "cache"))
    run = tmp_path / "run"
    args = smoke("model=resnet10t", "precision=fp32", "epochs=1", f"run_dir={run}", "checkpoint.every_steps=1",
                 "checkpoint.keep=1")
    assert main([*args, "max_steps=2"]) == 0
    path = list_checkpoints(run / "checkpoints")[-1]
    state = load_checkpoint(path)
    state["model"] = {f"_orig_mod.{k}": v for k, v in state["model"].items()}
    save_checkpoint(state, path.parent, path.name)
    assert main([*args, "resume=auto", "max_steps=3"]) == 0
    assert load_checkpoint(list_checkpoints(run / "checkpoints")[-1])["train_state"]["step"] == 3


@pytest.mark.parametrize("mode", ["reduce-overhead", "max-autotune"])
def test_cuda_graphs_with_accumulation_is_refused_at_compose_time(
    tmp_path: Path, capsys: pytest.CaptureFixture, mode: str
) -> None:
    """Each CUDA-graph replay reuses the previous replay's buffers, .grad included (pytorch
    issue 169545), so accumulated gradients would be overwritten: one line, exit 2, no run dir."""
    with pytest.raises(ConfigError, match=rf"^model.compile={mode} \(CUDA graphs\) cannot be combined with "
                                          r"accumulation_steps=2"):
        compose_config([f"model.compile={mode}", "accumulation_steps=2"])
    run = tmp_path / "run"
    assert main(["debug=smoke", "progress=false", f"run_dir={run}", f"model.compile={mode}",
                 "accumulation_steps=4"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "model.compile" in err and "accumulation_steps=4" in err and not run.exists()
    # either key alone, or accumulation with a mode without CUDA graphs, composes
    compose_config([f"model.compile={mode}", "accumulation_steps=1"])
    compose_config(["model.compile=max-autotune-no-cudagraphs", "accumulation_steps=2"])


def test_trainer_refuses_cuda_graph_steps_with_accumulation() -> None:
    """The same rule for the Trainer used as a library (no config in between): its step settings refuse it."""
    model = nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = [(torch.randn(2, 2), torch.tensor([0, 1]))] * 4
    kwargs = dict(model=model, optimizer=opt, scheduler=torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0),
                  train_loader=batches, backend=TorchDistributedBackend("cpu"))
    with pytest.raises(UsageError, match="cannot accumulate gradients over 2 micro-steps"):
        StepSettings(epochs=1, global_batch_size=4, accumulation_steps=2, cuda_graph_steps=True)
    Trainer(**kwargs, settings=StepSettings(epochs=1, global_batch_size=4, accumulation_steps=2))
    Trainer(**kwargs, settings=StepSettings(epochs=1, global_batch_size=4, cuda_graph_steps=True))


def test_cudnn_benchmark_is_a_backend_key_left_alone_off_cuda(tmp_path: Path) -> None:
    """On by default; a CPU run does not touch torch's flag (tests/gpu checks CUDA sets it)."""
    assert to_train_config(compose_config([])).backend.cudnn_benchmark is True
    assert to_train_config(compose_config(["backend.cudnn_benchmark=false"])).backend.cudnn_benchmark is False
    before = torch.backends.cudnn.benchmark
    assert main(["debug=smoke", "progress=false", "precision=fp32", "max_steps=1", "backend=cpu",
                 f"run_dir={tmp_path / 'run'}"]) == 0
    assert torch.backends.cudnn.benchmark is before


def _pooled_model() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 2))


def test_each_known_training_shape_compiles_once_static() -> None:
    """Told a run's shape count, compile_model compiles each side once (static graphs: 3 sides,
    3 graphs, and a second pass compiles nothing) and raises dynamo's recompile limit to at least
    the count, so a schedule of more sides than the default limit (8) never falls back to eager."""
    import torch._dynamo.config as dynamo_config
    from torch._dynamo.utils import counters

    before = dynamo_config.recompile_limit
    try:
        compile_model(_pooled_model(), "default", shapes=12)
        assert dynamo_config.recompile_limit == max(before, 12)
        torch._dynamo.reset()
        counters.clear()
        told = compile_model(_pooled_model(), "default", shapes=3)
        for _ in range(2):
            for side in (8, 12, 16):
                told(torch.randn(2, 3, side, side))
        assert counters["stats"]["unique_graphs"] == 3
    finally:
        dynamo_config.recompile_limit = before
        torch._dynamo.reset()


def test_a_run_counts_its_training_shapes() -> None:
    from largebatch.parts.model import training_shapes

    def shapes(*overrides: str) -> int:
        return training_shapes(to_train_config(compose_config(["debug=smoke", "epochs=6", *overrides])))

    assert shapes() == 1
    assert shapes("data.resolution.schedule=steps", "data.resolution.steps=[[0,16],[2,24],[4,32]]") == 3
    per_device = ["global_batch_size=8", "batch_schedule.steps=[[3,16]]", "batch_schedule.via=per_device"]
    assert shapes(*per_device) == 2
    assert shapes(*per_device[:2]) == 1  # accumulation: the same batch shape
    assert shapes(*per_device, "data.resolution.schedule=steps", "data.resolution.steps=[[0,16],[2,24],[4,32]]") == 4
    # the noise scale's probe feeds half batches: another shape at every side
    probe = ["diagnostics.noise_scale.enabled=true", "diagnostics.noise_scale.probe_every=4"]
    sides = ["data.resolution.schedule=steps", "data.resolution.steps=[[0,16],[2,24],[4,32]]"]
    assert shapes(*probe) == 2
    assert shapes(*probe, *sides) == 6
    assert shapes("diagnostics.noise_scale.enabled=true", *sides) == 3  # no probe: nothing extra
    cfg = to_train_config(compose_config(["debug=smoke", "epochs=6", *probe, *sides]))
    assert training_shapes(cfg, world_size=2) == 3  # ranks: the gradient norms come free, no probe
