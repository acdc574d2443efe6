"""No host synchronisation in the input hand-over or the training step, outside log steps.

A few real training steps (nvjpeg loader with its background decode thread, DDP-less torch
backend, LARS, the Trainer) run in the training thread under a counter of every operation
that reads a tensor back to the host (``.item()``, ``.tolist()``, ``.cpu()``, ``.numpy()``,
tensor-to-bool/float/int, ``nonzero``). On a CUDA GPU the same run is made under
``torch.cuda.set_sync_debug_mode("error")``, which raises on any synchronising call.

The count is per step: steps that are not log steps must read nothing; log steps read the
logged loss (and the non-finite counters), and those reads are counted, so the counter is
shown to see what it must catch. The decode thread is outside the count: it waits for its
own stream by design (``nvjpeg.decode_images``), which never stalls the training thread.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from largebatch.backends.torch_dist import TorchDistributedBackend
from largebatch.data.contract import LoaderSpec
from largebatch.data.pipelines.nvjpeg import build_nvjpeg_loaders
from largebatch.data.synthetic import make_synthetic_imagenet
from largebatch.engine.loop import StepSettings, Trainer
from largebatch.engine.noise_scale_hook import NoiseScaleHook, plan_noise_scale
from largebatch.optim import LARS, param_groups

HOST_READS = {"item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__", "__index__", "nonzero"}
LOG_EVERY = 3
STEPS = 6


class HostReads(TorchFunctionMode):
    """Counts tensor-to-host reads made by this thread (torch function modes are per thread)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0
        self.names: list[str] = []

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = getattr(func, "__name__", "")
        if name in HOST_READS:
            self.count += 1
            self.names.append(name)
        return func(*args, **(kwargs or {}))


class PerStep:
    """A Trainer hook that takes the read count after every step and after every log."""

    def __init__(self, reads: HostReads) -> None:
        self.reads = reads
        self.trainer: Any = None
        self.by_step: dict[int, int] = {}
        self._mark = 0

    def after_step(self) -> None:
        step = self.trainer.state.step
        self.by_step[step] = self.reads.count - self._mark
        self._mark = self.reads.count

    def after_log(self, metrics: dict) -> None:
        step = self.trainer.state.step
        self.by_step[step] += self.reads.count - self._mark  # the log's reads belong to its step
        self._mark = self.reads.count

    def __getattr__(self, event: str) -> Any:
        return lambda *args: None


def _trainer(tmp_path: Path, device: str, hook_type: type = PerStep, *, accumulation: int = 1,
             noise_scale: bool = False, probe_every: int = 0) -> tuple[Trainer, HostReads, PerStep]:
    """The run's set-up (data, loaders, the model moved to ``device``): outside the checked window.

    ``accumulation``: micro-batches a step; ``noise_scale``: the gradient noise scale measured
    from them (``largebatch.engine.noise_scale_hook``), read with the loss on log steps;
    ``probe_every``: without accumulation, the noise scale's probe every that many steps."""
    root = make_synthetic_imagenet(tmp_path / "ds", num_classes=3, train_per_class=12, val_per_class=2,
                                   image_size=40)
    train, _, _ = build_nvjpeg_loaders(root, LoaderSpec(image_size=24, batch_size=4, workers=1, device=device),
                                       prefetch_batches=2)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                          nn.Flatten(), nn.Linear(8, 3)).to(device)
    opt = LARS(param_groups(model, weight_decay=1e-4), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0)
    backend = TorchDistributedBackend(device)
    reads = HostReads()
    hook = hook_type(reads)
    hooks: list[Any] = [hook]
    if noise_scale:
        plan = plan_noise_scale(world_size=1, accumulation_steps=accumulation, per_device_batch=4,
                                local_norm_tap=None, probe_every=probe_every)
        hooks.insert(0, NoiseScaleHook(plan))
    trainer = Trainer(model=model, optimizer=opt, scheduler=sched, train_loader=train, backend=backend,
                      settings=StepSettings(epochs=2 * accumulation, global_batch_size=4 * accumulation,
                                            accumulation_steps=accumulation, log_every=LOG_EVERY, max_steps=STEPS),
                      hooks=hooks)
    return trainer, reads, hook


def _steps(tmp_path: Path, device: str, **options: Any) -> dict[int, int]:
    trainer, reads, hook = _trainer(tmp_path, device, **options)
    with reads:
        trainer.train()
    return hook.by_step


def test_no_host_read_outside_log_steps_on_cpu(tmp_path: Path) -> None:
    by_step = _steps(tmp_path, "cpu")
    assert sorted(by_step) == list(range(1, STEPS + 1))
    quiet = {step: n for step, n in by_step.items() if step % LOG_EVERY}
    logged = {step: n for step, n in by_step.items() if step % LOG_EVERY == 0}
    assert all(n == 0 for n in quiet.values()), f"host reads at steps that do not log: {quiet}"
    assert all(n > 0 for n in logged.values()), f"the counter saw no read at a log step: {logged}"


def test_the_noise_scale_adds_no_host_read(tmp_path: Path) -> None:
    """Measured every step (2 micro-batches), read on log steps in the loss's read-back: the
    same reads at the same steps as a run without it, and the values reach the log."""
    plain = _steps(tmp_path / "plain", "cpu", accumulation=2)
    trainer, reads, hook = _trainer(tmp_path / "measured", "cpu", accumulation=2, noise_scale=True)
    logged: list[dict] = []
    hook.after_log = lambda metrics, log=hook.after_log: (logged.append(metrics), log(metrics))  # type: ignore[method-assign]
    with reads:
        trainer.train()
    assert hook.by_step == plain, f"reads per step with the noise scale {hook.by_step}, without {plain}"
    assert sorted(plain) == list(range(1, STEPS + 1)) and all(n == 0 for step, n in plain.items() if step % LOG_EVERY
                                                              and step % 4), plain  # 4 steps an epoch
    assert len(logged) == 3 and all("noise_scale" in m for m in logged), logged  # steps 3, 4 (epoch end), 6
    assert all(isinstance(m["grad_sq_norm"], float) for m in logged)


def test_the_noise_scale_probe_adds_no_host_read(tmp_path: Path) -> None:
    """One process without accumulation, probed every 2 steps (steps 0, 2, 4: two of them not log
    steps): the same reads at the same steps as a run without it, and the values reach the log."""
    plain = _steps(tmp_path / "plain", "cpu")
    trainer, reads, hook = _trainer(tmp_path / "probed", "cpu", noise_scale=True, probe_every=2)
    probe = trainer.hooks[0]
    assert probe.plan.source == "probe"  # type: ignore[attr-defined]
    logged: list[dict] = []
    hook.after_log = lambda metrics, log=hook.after_log: (logged.append(metrics), log(metrics))  # type: ignore[method-assign]
    with reads:
        trainer.train()
    assert hook.by_step == plain, f"reads per step with the probe {hook.by_step}, without {plain}"
    assert probe.tracker.updates == 3  # type: ignore[attr-defined]
    assert logged and all("noise_scale" in m and isinstance(m["noise_trace"], float) for m in logged), logged


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("probe_every", [0, 2], ids=["plain", "noise-scale-probe"])
def test_no_synchronising_cuda_call_outside_log_steps(tmp_path: Path, probe_every: int) -> None:
    """CUDA's own detector: any synchronising call in the training thread raises, except at log
    steps, where the mode is lowered for the one read-back (PerStep counts them). With the
    noise-scale probe too (its buffer copies, RNG fork and extra backward)."""
    reads_at_log: list[int] = []

    class Strict(PerStep):
        def after_step(self) -> None:
            super().after_step()
            if self.trainer.state.step % LOG_EVERY == 0:
                torch.cuda.set_sync_debug_mode("default")  # the log step's read-back follows

        def after_log(self, metrics: dict) -> None:
            super().after_log(metrics)
            reads_at_log.append(self.by_step[self.trainer.state.step])
            if self.trainer.state.step < STEPS:  # after the last step, the run's closing check reads once
                torch.cuda.set_sync_debug_mode("error")

    # the set-up's blocking copies (model.to("cuda") from pageable memory) are outside the window:
    # it covers the training steps only
    trainer, reads, hook = _trainer(tmp_path, "cuda", Strict, noise_scale=bool(probe_every), probe_every=probe_every)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with reads:
            trainer.train()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    by_step = hook.by_step
    assert sorted(by_step) == list(range(1, STEPS + 1))
    assert all(n == 0 for step, n in by_step.items() if step % LOG_EVERY), by_step
    assert reads_at_log and all(n > 0 for n in reads_at_log)
