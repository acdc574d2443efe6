"""The engine's and the composition root's GPU-only lines, run on a CPU with CUDA's queries
stood in for: CUDA-graph step marks in the loop, the loaders' GPU index in run.py, cuDNN's
benchmark switch (run.py asks the backend), torch's SyncBatchNorm for a model on CUDA."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import timm.layers
import torch
import torch.distributed as dist
from torch import nn

from largebatch import run as run_module
from largebatch.backends.torch_dist import TorchDistributedBackend
from largebatch.comm.reducers import ProcessGroupReducer
from largebatch.config.schema import ResolutionConfig
from largebatch.data.pipelines.dali_graph import dali_device_id
from largebatch.engine.loop import StepSettings, Trainer
from largebatch.nn import sync_bn


class _Logged(nn.Module):
    def __init__(self, log: list[str]) -> None:
        super().__init__()
        self.log = log
        self.linear = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.log.append("forward")
        return self.linear(x)


@pytest.mark.parametrize("cuda_graph_steps", [True, False])
def test_each_step_of_a_cuda_graph_model_is_marked_before_its_forward(
    monkeypatch: pytest.MonkeyPatch, cuda_graph_steps: bool
) -> None:
    """``cudagraph_mark_step_begin`` before every step's forward (a new graph replay, so the
    previous step's outputs may be overwritten), and only for a CUDA-graph model."""
    log: list[str] = []
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: log.append("mark"))
    model = _Logged(log)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(0)
    batches = [(torch.randn(2, 4, generator=gen), torch.tensor([0, 2])) for _ in range(3)]
    trainer = Trainer(model=model, optimizer=opt, scheduler=torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0),
                      train_loader=batches, backend=TorchDistributedBackend("cpu"),
                      settings=StepSettings(epochs=1, global_batch_size=2, cuda_graph_steps=cuda_graph_steps))
    trainer.train()
    assert log == (["mark", "forward"] * 3 if cuda_graph_steps else ["forward"] * 3)


def _cuda_backend(monkeypatch: pytest.MonkeyPatch, local_rank: int) -> TorchDistributedBackend:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for name in ("RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("LOCAL_RANK", str(local_rank))
    return TorchDistributedBackend("cuda")


def test_the_loaders_of_a_cuda_device_without_an_index_get_the_local_rank(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """DALI's mixed decode needs the GPU's index: a bare ``cuda`` device becomes ``cuda:<local rank>``."""
    from largebatch.data import build
    from largebatch.parts.data import data_of

    backend = _cuda_backend(monkeypatch, local_rank=2)
    backend.device = torch.device("cuda")  # as a backend that names no index gives it
    specs: list[Any] = []
    monkeypatch.setattr(build, "resolve_data_root", lambda *a, **k: tmp_path)
    one_batch = [(None, None)]  # a loader whose one batch fills the one accumulation step
    monkeypatch.setattr(build, "build_run_loaders", lambda root, spec, **k: specs.append(spec) or (one_batch, one_batch, 5))
    data = SimpleNamespace(root=str(tmp_path), loader="nvjpeg", workers=0, shards=None, image_size=24,
                           crop_scale=[0.25, 1.0], val_crop_ratio=0.875, shuffle_buffer=16,
                           synthetic=SimpleNamespace(classes=5, train_per_class=1, val_per_class=1,
                                                     image_size=32, seed=0),
                           resolution=ResolutionConfig())  # the schema's default: no schedule
    plan = SimpleNamespace(per_device=4, accumulation_steps=1)
    data_of(SimpleNamespace(data=data, seed=3, epochs=1), backend, plan, torch.bfloat16, True)
    (spec,) = specs
    assert spec.device == torch.device("cuda", 2) and dali_device_id(spec) == 2 and spec.pin_memory


@pytest.mark.parametrize("benchmark", [True, False])
def test_a_cuda_run_sets_cudnn_benchmark_from_the_config_before_the_job(
    monkeypatch: pytest.MonkeyPatch, benchmark: bool
) -> None:
    from largebatch import backends

    backend = _cuda_backend(monkeypatch, local_rank=0)
    chosen: list[torch.device] = []
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    monkeypatch.setattr(backends, "build_backend", lambda name, timeout_s: backend)
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", not benchmark)
    seen: list[Any] = []
    monkeypatch.setattr(run_module, "_run_job",
                        lambda cfg, raw, b: seen.append((b, torch.backends.cudnn.benchmark)) or {"ok": 1})
    cfg = SimpleNamespace(backend=SimpleNamespace(name="cuda", timeout_s=60, cudnn_benchmark=benchmark))
    assert run_module.run(cfg) == {"ok": 1}
    assert seen == [(backend, benchmark)] and chosen == [torch.device("cuda", 0)]


@pytest.mark.parametrize("benchmark", [True, False])
def test_a_cpu_backend_leaves_cudnn_benchmark_alone(monkeypatch: pytest.MonkeyPatch, benchmark: bool) -> None:
    """Only the CUDA stack sets cuDNN's switch (run.py asks every backend, as it asked only on CUDA)."""
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", not benchmark)
    TorchDistributedBackend("cpu").autotune_kernels(benchmark)
    assert torch.backends.cudnn.benchmark is (not benchmark)


@pytest.fixture
def world_of_two(monkeypatch: pytest.MonkeyPatch) -> Any:
    """A ProcessGroupReducer over a group of 2 (its size is the one thing asked of the group)."""
    group = object()
    monkeypatch.setattr(dist, "get_world_size", lambda g=None: 2 if g is group else 1)
    return ProcessGroupReducer(group)


@pytest.mark.parametrize("norm_act", [False, True])
def test_a_model_on_cuda_gets_torch_sync_batchnorm_over_the_reducers_group(
    monkeypatch: pytest.MonkeyPatch, world_of_two: ProcessGroupReducer, norm_act: bool
) -> None:
    """torch's fused SyncBatchNorm on the reducer's process group, parameters carried over,
    timm's BatchNormAct2d keeping its activation; the same model on the CPU gets ours."""
    def model() -> nn.Module:
        torch.manual_seed(0)
        norm = timm.layers.BatchNormAct2d(4, act_layer=nn.ReLU) if norm_act else nn.BatchNorm2d(4)
        return nn.Sequential(nn.Conv2d(3, 4, 3), norm)

    on_cpu = sync_bn.convert_group_sync_batchnorm(model(), 2, world_of_two)
    assert isinstance(on_cpu[1], sync_bn.GroupSyncBatchNorm)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda t: True))  # the model's parameters are on CUDA
    original = model()
    converted = sync_bn.convert_group_sync_batchnorm(original, 2, world_of_two)
    bn = converted[1]
    assert isinstance(bn, nn.SyncBatchNorm) and bn.process_group is world_of_two.process_group
    assert torch.equal(bn.weight, original[1].weight) and bn.num_features == 4
    if norm_act:
        assert isinstance(bn.act, nn.ReLU)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda t: False))
    assert isinstance(sync_bn.convert_group_sync_batchnorm(model(), 2, world_of_two, use_torch_sync_bn_on_cuda=True)[1],
                      sync_bn.GroupSyncBatchNorm)


def test_the_cuda_backend_uses_its_local_rank_gpu_for_sync_and_asks_cuda_about_bf16(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    backend = _cuda_backend(monkeypatch, local_rank=3)
    synced: list[torch.device] = []
    monkeypatch.setattr(torch.cuda, "synchronize", synced.append)
    for answer in (True, False):
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda answer=answer: answer)
        assert backend.supports_bf16() is answer
    backend.synchronize()
    assert backend.device == torch.device("cuda", 3) and synced == [torch.device("cuda", 3)]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="no CUDA GPU is visible"):
        TorchDistributedBackend("cuda")
