"""Weight EMA on XLA:CPU (issue 35): timm's ModelEmaV3 on an XLA device follows the decay
formula with no recompile per decay value, and every replica evaluates the same EMA.

``ModelEmaV3`` makes a generator on the model's device, which XLA devices lack;
``largebatch.engine.ema.build_model_ema`` builds it from a CPU copy there (no stochastic
rounding, which float32 weights never use).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from tests.xla.common import failure_text, run_replicas

pytestmark = pytest.mark.xla

WORLD = 4


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Linear(4, 2))


def _ema_steps(device: torch.device, steps: int, sync: object = None, compiles: list | None = None) -> dict:
    from largebatch.engine.ema import build_model_ema

    model = _model().to(device)
    ema = build_model_ema(model, decay=0.9, warmup=True, warmup_gamma=9, warmup_power=1, update_after_step=-2)
    expected = {k: v.cpu().double() for k, v in model.state_dict().items() if v.is_floating_point()}
    g = torch.Generator().manual_seed(1)
    for n in range(1, steps + 1):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.05 * torch.randn(p.shape, generator=g).to(device))
        model(torch.randn(8, 3, generator=g).to(device))  # BN statistics move
        ema.update(model, step=n)  # a new decay every step during warmup
        if sync is not None:
            sync()
            if compiles is not None:
                compiles.append(_compile_count())
        d = min(0.9, (1 + n) / (10 + n))  # TensorFlow's ExponentialMovingAverage(num_updates=n)
        for k, v in model.state_dict().items():
            if k in expected:
                expected[k] = d * expected[k] + (1 - d) * v.cpu().double()
    return {k: v.cpu() for k, v in ema.module.state_dict().items()}, expected


def _compile_count() -> int:
    import torch_xla.debug.metrics as met

    data = met.metric_data("CompileTime")
    return data[0] if data else 0


def test_ema_on_xla_follows_the_formula_with_one_graph_per_step() -> None:
    torch_xla = pytest.importorskip("torch_xla")
    compiles: list[int] = []
    on_xla, expected = _ema_steps(torch_xla.device(), 12, sync=torch_xla.sync, compiles=compiles)
    for k, v in expected.items():  # the XLA model's own states, averaged by the formula on the host
        torch.testing.assert_close(on_xla[k].double(), v, rtol=1e-5, atol=1e-6, msg=k)
    assert compiles[-1] == compiles[3], f"the decay recompiled the step: {compiles}"


def test_every_replica_evaluates_rank_0s_ema(tmp_path: Path) -> None:
    pytest.importorskip("torch_xla")
    proc, _ = run_replicas("ema", tmp_path, devices=WORLD)
    assert proc.returncode == 0, failure_text(proc)
    outs = [torch.load(tmp_path / f"ema_{r}.pt", weights_only=False) for r in range(WORLD)]
    params = [k for k in outs[0]["before"] if "running" not in k and outs[0]["before"][k].is_floating_point()]
    for o in outs[1:]:
        for k in params:
            torch.testing.assert_close(o["before"][k], outs[0]["before"][k], rtol=0, atol=0, msg=k)
        for k, v in outs[0]["after"].items():
            assert torch.equal(o["after"][k], v), f"EMA {k} differs between replicas after the sync"
    running = [k for k in outs[0]["before"] if "running" in k]
    assert any(not torch.equal(outs[1]["before"][k], outs[0]["before"][k]) for k in running), (
        "per-replica BN statistics were expected to differ before the sync; the test shows nothing")
    for k, v in outs[0]["before"].items():
        assert torch.equal(outs[0]["after"][k], v), f"rank 0's EMA {k} changed in the sync"
    assert any(not torch.equal(outs[0]["before"][k], outs[0]["model"][k]) for k in params), "nothing averaged"


def test_cli_with_ema_on_xla_evaluates_and_checkpoints_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch_xla")
    import json

    from largebatch.cli import main
    from largebatch.engine.checkpoint import list_checkpoints, load_checkpoint

    monkeypatch.setenv("LARGEBATCH_CACHE", str(tmp_path / "cache"))
    run = tmp_path / "run"
    assert main(["debug=smoke", "progress=false", "tensorboard=false", "model=resnet10t", "epochs=1",
                 "backend=xla", "ema.enabled=true", "ema.decay=0.5", "ema.target=ema", f"run_dir={run}"]) == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["backend"].startswith("xla") and summary["top1_of"] == "ema"
    assert summary["best_top1"] == summary["final_ema_top1"]
    ckpt = load_checkpoint(list_checkpoints(run / "checkpoints")[-1])
    assert ckpt["ema"].keys() == ckpt["model"].keys()
    assert all(v.device.type == "cpu" for v in ckpt["ema"].values())
