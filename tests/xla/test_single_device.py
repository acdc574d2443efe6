"""One XLA:CPU device: the XLA step computes what eager CPU computes, and compiles once.

Run by ``scripts/test_xla.sh`` (``.venv-xla``, ``PJRT_DEVICE=CPU``); skipped without torch-xla.
"""

from __future__ import annotations

import copy

import pytest
import torch

from largebatch.engine.evaluate import evaluate
from largebatch.engine.loop import Hook, StepSettings, Trainer
from largebatch.lr import build_lr_scheduler
from largebatch.optim import build_optimizer
from tests.xla.common import (
    ListLoader,
    compile_count,
    exact_eval_loader,
    fixed_batches,
    max_abs_diff,
    tiny_resnet,
)

pytestmark = pytest.mark.xla

# Eager CPU (oneDNN) and XLA:CPU order float sums differently: measured differences are
# ~2e-7 in the loss and ~1e-7 in the weights after six SGD steps with momentum.
LOSS_ATOL = 1e-5
PARAM_ATOL = 1e-5
# torch-xla 2.9 updates nn.BatchNorm's running_var with the biased batch variance (eager torch:
# unbiased, x m/(m-1)); with m = 512 values per channel that is 2e-3 of one update, measured
# 5e-4 relative after six. GroupSyncBatchNorm updates its statistics itself, unbiased.
RUNNING_VAR_RTOL = 2e-3


@pytest.fixture(scope="module")
def xla_backend():
    pytest.importorskip("torch_xla")
    from largebatch.backends import build_backend

    backend = build_backend("xla")
    backend.start()
    assert backend.world_size == 1 and backend.device.type == "xla"
    return backend


@pytest.fixture(scope="module")
def cpu_backend():
    from largebatch.backends import build_backend

    return build_backend("cpu")


class _Record(Hook):
    """Per-step compile count and each logged loss."""

    def __init__(self) -> None:
        self.losses: list[float] = []
        self.compiles: list[int] = []

    def after_step(self) -> None:
        self.compiles.append(compile_count() if self.trainer.backend.name == "xla" else 0)

    def after_log(self, metrics: dict[str, float]) -> None:
        self.losses.append(metrics["loss"])


def _train(backend, batches, *, steps: int, log_every: int, optimizer: str = "sgd", autocast=None):
    model = backend.prepare_model(tiny_resnet())
    opts = {"momentum": 0.9} if optimizer in ("sgd", "lars") else {}
    opt = build_optimizer(optimizer, model, lr=0.1 if optimizer != "lamb" else 0.01, weight_decay=1e-4, **opts)
    # Warmup then cosine: the lr changes at every step, as in a real run.
    sched = build_lr_scheduler(opt, name="cosine", steps_per_epoch=steps, epochs=1, warmup_epochs=0.5)
    rec = _Record()
    trainer = Trainer(
        model=backend.wrap_model(model).model, optimizer=opt, scheduler=sched,
        train_loader=backend.wrap_loader(ListLoader(batches)), backend=backend,
        settings=StepSettings(epochs=1, global_batch_size=batches[0][0].shape[0], log_every=log_every,
                              autocast_dtype=autocast),
        hooks=[rec],
    )
    trainer.train()
    return model, rec



def _counted_step(opt, device, xla_backend, transfers: list[int], compiles: list[int]) -> None:
    """``opt.step()``; on XLA also the host transfers it made and, after the step's graph ran,
    the number of compilations so far."""
    if device.type != "xla":
        opt.step()
        return
    import torch_xla.debug.metrics as met

    before = met.metric_data("TransferFromDeviceTime")
    opt.step()
    after = met.metric_data("TransferFromDeviceTime")
    transfers.append((after[0] if after else 0) - (before[0] if before else 0))
    xla_backend.mark_step()
    compiles.append(compile_count())

def test_training_steps_match_eager_cpu(xla_backend, cpu_backend):
    """Six Trainer steps (SGD, warmup + cosine lr) give the eager CPU losses and weights."""
    batches = fixed_batches(6, 8)
    cpu_model, cpu = _train(cpu_backend, batches, steps=6, log_every=1)
    xla_model, xla = _train(xla_backend, batches, steps=6, log_every=1)
    assert len(xla.losses) == len(cpu.losses) == 6
    for step, (a, b) in enumerate(zip(xla.losses, cpu.losses)):
        assert abs(a - b) <= LOSS_ATOL, f"step {step}: XLA loss {a} vs CPU {b}"
    assert xla.losses[-1] < xla.losses[0]
    xla_state = {k: v.cpu() for k, v in xla_model.state_dict().items()}
    for name, ref in cpu_model.state_dict().items():
        tol = RUNNING_VAR_RTOL * ref.abs().max().item() if name.endswith("running_var") else PARAM_ATOL
        assert max_abs_diff(xla_state[name], ref) <= tol, name


def test_compile_count_is_flat_after_warmup(xla_backend):
    """With log steps every 3 steps, no step after warm-up compiles a new graph."""
    steps = 15
    start = compile_count()
    # Batch 6: shapes no other test uses, so this run compiles its own graphs.
    _, rec = _train(xla_backend, fixed_batches(steps, 6, seed=1), steps=steps, log_every=3)
    per_step = [c - start for c in rec.compiles]
    assert per_step[0] > 0, "the first step compiled nothing: the graphs came from another test"
    # Warm-up: the first step, the first steady step, the first log steps (3 and 6).
    assert per_step[-1] == per_step[5], f"compilations after each step: {per_step}"
    assert len(rec.losses) == steps // 3


@pytest.mark.parametrize("name", ["lars", "larc", "lamb"])
def test_large_batch_optimizer_steps_match_cpu(xla_backend, name):
    """LARS/LARC/LAMB steps on XLA (multi-tensor path) equal the CPU ones (per-tensor path),
    with no device-to-host transfer and no new compilation after the first steps."""
    torch.manual_seed(1)
    model = tiny_resnet()
    grads = [[torch.randn_like(p) * 0.1 for p in model.parameters()] for _ in range(4)]

    def run(device: torch.device, transfers: list[int], compiles: list[int]):
        m = copy.deepcopy(model).to(device)
        opts = {"momentum": 0.9} if name != "lamb" else {}
        opt = build_optimizer(name, m, lr=0.5 if name != "lamb" else 0.01, weight_decay=1e-3, **opts)
        for step_grads in grads:
            for p, g in zip(m.parameters(), step_grads):
                p.grad = g.to(device)
            _counted_step(opt, device, xla_backend, transfers, compiles)
        return [p.detach().cpu() for p in m.parameters()]

    transfers: list[int] = []
    compiles: list[int] = []
    ref = run(torch.device("cpu"), [], [])
    got = run(xla_backend.device, transfers, compiles)
    for i, (a, b) in enumerate(zip(got, ref)):
        assert max_abs_diff(a, b) <= 1e-5 * max(1.0, b.abs().max().item()), f"parameter {i}"
    assert transfers == [0] * len(grads), "the optimizer step read a tensor back to the host"
    assert compiles[-1] == compiles[1], f"compilations per step: {compiles}"


@pytest.mark.parametrize("lr_in_momentum", [False, True], ids=["torch_form", "lr_in_momentum"])
def test_lars_momentum_forms_under_a_changing_lr(xla_backend, lr_in_momentum):
    """Both momentum-buffer forms on XLA (multi-tensor path) under an lr that changes at every step
    (warmup, then poly decay): lr_in_momentum=True against the transcription of tensorflow/tpu
    efficientnet/lars_optimizer.py @e380f76 (tests/lars_references.py), False against our CPU
    per-tensor path (itself checked against timm's Lars in tests/test_optim_lars_forms.py); no host
    read and no new compilation once the lr changes (lr enters the graph as data, not a constant)."""

    from largebatch.optim import LARS
    from tests.lars_references import tf_tpu_lars_step, warmup_poly_lrs

    # peak 2.4: no step at lr 1.0, which torch-xla bakes into the graph as a special scalar (one more graph)
    lrs = warmup_poly_lrs(steps=12, warmup=4, peak=2.4)
    gen = torch.Generator().manual_seed(3)
    shapes = [((8, 4, 3, 3), False), ((10, 12), False), ((8,), True), ((10,), True)]  # skipped: BN, bias
    start = [torch.randn(s, generator=gen) for s, _ in shapes]
    grads = [[torch.randn(s, generator=gen) * 0.1 for s, _ in shapes] for _ in lrs]
    skipped = [skip for _, skip in shapes]

    def run(device: torch.device, foreach: bool, transfers: list[int], compiles: list[int]):
        params = [torch.nn.Parameter(t.clone().to(device)) for t in start]
        opt = LARS([{"params": [p for p, s in zip(params, skipped) if not s]},
                    {"params": [p for p, s in zip(params, skipped) if s], "lars_exclude": True}],
                   lr=lrs[0], momentum=0.9, weight_decay=1e-2, trust_coefficient=0.02, eps=0.0,
                   lr_in_momentum=lr_in_momentum, foreach=foreach)  # fmt: skip
        for lr, step_grads in zip(lrs, grads):
            for group in opt.param_groups:
                group["lr"] = lr
            for p, g in zip(params, step_grads):
                p.grad = g.to(device)
            _counted_step(opt, device, xla_backend, transfers, compiles)
        return [p.detach().cpu() for p in params]

    if lr_in_momentum:
        ref = [t.clone() for t in start]
        moms = [torch.zeros_like(t) for t in start]
        for lr, step_grads in zip(lrs, grads):
            tf_tpu_lars_step(ref, step_grads, moms, skipped, learning_rate=lr, momentum=0.9, weight_decay=1e-2,
                             eeta=0.02, epsilon=0.0, use_nesterov=False)  # fmt: skip
    else:
        ref = run(torch.device("cpu"), False, [], [])
    transfers: list[int] = []
    compiles: list[int] = []
    got = run(xla_backend.device, True, transfers, compiles)
    for i, (a, b) in enumerate(zip(got, ref)):
        assert max_abs_diff(a, b) <= 1e-5 * max(1.0, b.abs().max().item()), f"parameter {i}"
    assert transfers == [0] * len(lrs), "the optimizer step read a tensor back to the host"
    assert compiles[-1] == compiles[1], f"compilations per step: {compiles}"


def test_padded_evaluation_counts_every_image_once(xla_backend):
    """10 images in batches of 4: the last batch is padded with weight-0 samples; evaluate()
    counts exactly 10 images with the CPU top-1, and every batch has the full static shape."""
    torch.manual_seed(2)
    images, labels = torch.randn(10, 3, 16, 16), torch.randint(0, 4, (10,))
    cpu_model = tiny_resnet().eval()
    ref = evaluate(cpu_model, exact_eval_loader(images, labels, rank=0, world_size=1, batch_size=4),
                   backend=_CpuWorld1())
    loader = xla_backend.wrap_loader(exact_eval_loader(images, labels, rank=0, world_size=1, batch_size=4))
    shapes = [tuple(b[0].shape) for b in loader]
    assert shapes == [(4, 3, 16, 16)] * 3
    model = xla_backend.prepare_model(copy.deepcopy(cpu_model))
    got = evaluate(model, loader, backend=xla_backend)
    assert got["total"] == ref["total"] == 10
    assert got["correct1"] == ref["correct1"] and got["correct5"] == ref["correct5"]
    assert got["loss"] == pytest.approx(ref["loss"], abs=1e-5)


def test_eval_padding_for_a_short_or_empty_shard():
    """Each rank runs as many padded batches as the largest shard; weights count its own images."""
    from largebatch.backends.xla import padded_eval_batches

    images, labels = torch.randn(9, 3, 8, 8), torch.arange(9)
    counts = []
    for rank in range(4):  # 9 images on 4 ranks: shards 3, 2, 2, 2 -> 2 batches of 2 each
        loader = exact_eval_loader(images, labels, rank=rank, world_size=4, batch_size=2)
        batches = list(padded_eval_batches(loader, 2, 2))
        assert [b[0].shape[0] for b in batches] == [2, 2]
        counts.append(int(sum(b[2].sum().item() for b in batches)))
        for b in batches:
            assert torch.all(b[0][b[2] == 0] == 0)
    assert counts == [3, 2, 2, 2]
    # 2 images on 4 ranks: ranks 2 and 3 own nothing yet run one all-padding batch.
    empty = exact_eval_loader(images[:2], labels[:2], rank=3, world_size=4, batch_size=2)
    batches = list(padded_eval_batches(empty, 2, 1))
    assert len(batches) == 1 and batches[0][2].sum().item() == 0 and batches[0][0].shape == (2, 3, 8, 8)


def test_bf16_autocast_trains(xla_backend):
    """bf16 autocast on XLA: convolutions run in bf16, the loss is finite and falls."""
    batch = fixed_batches(1, 8, seed=3)
    model, rec = _train(xla_backend, batch * 8, steps=8, log_every=1, autocast=torch.bfloat16)
    assert all(torch.isfinite(torch.tensor(rec.losses))), rec.losses
    assert rec.losses[-1] < rec.losses[0] - 0.05, rec.losses
    with xla_backend.autocast(torch.bfloat16):
        out = model[0](batch[0][0].to(xla_backend.device))
    assert out.dtype == torch.bfloat16
    with pytest.raises(ValueError, match="bfloat16"):
        xla_backend.autocast(torch.float16)
    with pytest.raises(ValueError, match="bf16"):
        xla_backend.grad_scaler(True, 2.0**16, 2000)


class _CpuWorld1:
    """The backend surface evaluate() needs, for an eager CPU reference."""

    device = torch.device("cpu")
    world_size = 1

    def autocast(self, dtype):
        import contextlib

        return contextlib.nullcontext()

    def mark_step(self) -> None:
        pass

    def all_reduce_sum(self, t):
        return t
