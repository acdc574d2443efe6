"""The noise scale measured by 2 DDP ranks equals the one process with 2 micro-batches measures.

With the same global batch split the same way, rank r's local gradient (before the all-reduce)
is micro-batch r's gradient, and the all-reduced gradient is the accumulated one: rank 0's
(|G_small|², |G_big|²) pairs, and so its averages, are the one process's up to float rounding
(the all-reduce sums in another order than the accumulation, ~1e-7 relative on the float32
norms; the |G|² estimate B_big|G_big|² - B_small|G_small|² cancels most of its terms, which
magnifies that: measured 1.5e-5 at most; 1e-4 is allowed, far below the estimates' spread
from step to step, which is of order 1).
fp16-free, on gloo, for the builtin flat all-reduce and the hierarchical and 2-D torus comm hooks; with the
wire compressed (fp16, bf16), equal to within the compression's own rounding.

The ranks are started once for the module (2 spawned processes cost ~10 s of imports, the
trainings a fraction of a second): each trains every configuration in turn, one fresh model and
DDP each, and the tests read their own configuration's results.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from largebatch.backends.torch_dist import TorchDistributedBackend
from largebatch.engine.loop import Hook, StepSettings, Trainer
from largebatch.engine.noise_scale_hook import NoiseScaleHook, plan_noise_scale
from tests.distributed.harness import run_ranks

MICRO, STEPS = 4, 5
ALGORITHMS, COMPRESSIONS = ("flat", "hierarchical", "torus2d"), ("fp16", "bf16")

# the module's ranks are one fixture: its tests run on one worker, where it is computed once
pytestmark = pytest.mark.xdist_group("noise_scale_dist")


def _batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    """STEPS x 2 micro-batches of MICRO images: micro-batch 2s+r is rank r's batch of step s."""
    gen = torch.Generator().manual_seed(3)
    return [(torch.randn(MICRO, 3, 8, 8, generator=gen), torch.randint(0, 3, (MICRO,), generator=gen))
            for _ in range(2 * STEPS)]


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 3))


def _train(model: nn.Module, backend: TorchDistributedBackend, batches: list, accumulation: int) -> dict:
    # DDP (tapped) on 2 ranks, the model (no tap) on 1
    wrapped = backend.wrap_model(model, tap_local_norm=True)
    train_model, tap = wrapped.model, wrapped.local_norm_tap
    opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0)
    plan = plan_noise_scale(world_size=backend.world_size, accumulation_steps=accumulation, per_device_batch=MICRO,
                            local_norm_tap=tap)
    hook = NoiseScaleHook(plan, beta=0.5, local_norm_tap=tap)
    steps: list[tuple[float, float, float]] = []

    class Record(Hook):  # the averages after every step, to compare the sequences
        def after_step(self) -> None:
            t = hook.tracker
            steps.append((float(t.grad_sq_norm()), float(t.noise_trace()), float(t.noise_scale())))

    t = Trainer(model=train_model, optimizer=opt, scheduler=sched, train_loader=batches, backend=backend,
                settings=StepSettings(epochs=1, global_batch_size=2 * MICRO, accumulation_steps=accumulation,
                                      log_every=2), hooks=[hook, Record()])
    t.train()
    return {"plan": plan, "steps": steps, "updates": hook.tracker.updates, "tap": type(tap).__name__,
            "backend_keeps_a_tap": hasattr(backend, "local_norm_tap")}


def _ranks(rank: int, world_size: int, algorithm: str) -> dict:
    backend = TorchDistributedBackend("cpu")
    model = _model()
    if algorithm != "flat":
        backend.wrap_model = _with_algorithm(backend.wrap_model, algorithm)  # type: ignore[method-assign]
    return _train(model, backend, _batches()[rank::2], accumulation=1)


def _with_algorithm(wrap, algorithm):  # type: ignore[no-untyped-def]
    return lambda model, **kw: wrap(model, algorithm=algorithm, ranks_per_node=1, **kw)


def _every_configuration(rank: int, world_size: int) -> dict[str, object]:
    """Rank ``rank``'s results of every configuration the tests compare, one after another."""
    results: dict[str, object] = {a: _ranks(rank, world_size, a) for a in ALGORITHMS}
    results.update({c: _ranks_compressed(rank, world_size, c) for c in COMPRESSIONS})
    results["grouped_bn"] = _grouped_bn_pairs(rank, world_size)
    return results


@pytest.fixture(scope="module")
def two_ranks() -> list[dict]:
    """Each rank's results by configuration, from one pair of gloo ranks."""
    return run_ranks(_every_configuration, 2, fork=True)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_two_ranks_measure_what_two_micro_batches_measure(two_ranks: list[dict], algorithm: str) -> None:
    ranks = [r[algorithm] for r in two_ranks]
    one = _train(_model(), TorchDistributedBackend("cpu"), _batches(), accumulation=2)
    assert ranks[0]["plan"].source == "ranks" and one["plan"].source == "micro-batches"
    # the tap comes back from wrap_model (DDP's on 2 ranks, none on 1), not left on the backend
    assert (ranks[0]["tap"], one["tap"]) == ("SquaredNormTap", "NoneType")
    assert not ranks[0]["backend_keeps_a_tap"] and not one["backend_keeps_a_tap"]
    assert (ranks[0]["plan"].batch_small, ranks[0]["plan"].batch_big) == (MICRO, 2 * MICRO)
    assert (one["plan"].batch_small, one["plan"].batch_big) == (MICRO, 2 * MICRO)
    assert ranks[0]["updates"] == one["updates"] == STEPS
    got, want = torch.tensor(ranks[0]["steps"]), torch.tensor(one["steps"])
    assert torch.isfinite(want[:, :2]).all()
    torch.testing.assert_close(got, want, rtol=1e-4, atol=0)
    # rank 1's local gradient is the other micro-batch: a different estimate (the test can fail)
    assert not torch.allclose(torch.tensor(ranks[1]["steps"]), want, rtol=1e-4, atol=0)


def _ranks_compressed(rank: int, world_size: int, compress: str) -> dict:
    backend = TorchDistributedBackend("cpu")
    wrap = backend.wrap_model
    backend.wrap_model = lambda model, **kw: wrap(model, compress=compress, **kw)  # type: ignore[method-assign]
    return _train(_model(), backend, _batches()[rank::2], accumulation=1)


@pytest.mark.parametrize("compress", COMPRESSIONS)
def test_wire_compression_changes_the_measurement_by_its_own_rounding_only(two_ranks: list[dict],
                                                                            compress: str) -> None:
    """With the gradients compressed on the wire, the local norms are the exact ones and the
    reduced gradient carries the compression's rounding: the estimates stay those of the exact
    run to within that rounding (fp16: 11-bit, bf16: 8-bit mantissas; the |G|^2 estimate's
    cancellation magnifies it), not a different measurement."""
    ranks = [r[compress] for r in two_ranks]
    one = _train(_model(), TorchDistributedBackend("cpu"), _batches(), accumulation=2)
    got, want = torch.tensor(ranks[0]["steps"]), torch.tensor(one["steps"])
    assert ranks[0]["updates"] == STEPS and torch.isfinite(got[:, :2]).all()
    # measured: fp16 within 2e-3 relative, bf16 within 2.3e-2, of each estimate (noise scale:
    # inf on the same steps, where |G|^2's estimate is not positive); an estimate near 0 is held
    # to the rounding of the terms it is the difference of (the largest estimate's scale)
    rtol = {"fp16": 5e-3, "bf16": 5e-2}[compress]
    scale = want[:, :2].abs().max()
    torch.testing.assert_close(got[:, :2], want[:, :2], rtol=rtol, atol=rtol * scale)
    torch.testing.assert_close(got[:, 2], want[:, 2], rtol=rtol, atol=0)
    # and it is not the exact run's measurement (the compression shows): the test can fail
    assert not torch.equal(got[:, :2], want[:, :2])


def _bn_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(4, 3))


def _grouped_bn_pairs(rank: int, world_size: int) -> list[tuple[float, float]]:
    """Rank ``rank`` of a grouped-BN model (BN over both ranks' images): the (|G_small|²,
    |G_big|²) pairs its noise-scale hook hands the tracker, step by step."""
    from largebatch.nn import convert_group_sync_batchnorm

    backend = TorchDistributedBackend("cpu")
    model = convert_group_sync_batchnorm(_bn_model(), group_size=2)
    wrapped = backend.wrap_model(model, tap_local_norm=True)
    train_model, tap = wrapped.model, wrapped.local_norm_tap
    opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    plan = plan_noise_scale(world_size=2, accumulation_steps=1, per_device_batch=MICRO, local_norm_tap=tap)
    hook = NoiseScaleHook(plan, beta=0.5, local_norm_tap=tap)
    pairs: list[tuple[float, float]] = []
    update = hook.tracker.update

    def recording(small: torch.Tensor, b_small: float, big: torch.Tensor, b_big: float) -> None:
        pairs.append((float(small), float(big)))
        update(small, b_small, big, b_big)

    hook.tracker.update = recording  # type: ignore[method-assign]
    Trainer(model=train_model, optimizer=opt, scheduler=torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0),
            train_loader=_batches()[rank::2], backend=backend,
            settings=StepSettings(epochs=1, global_batch_size=2 * MICRO, log_every=2), hooks=[hook]).train()
    return pairs


def test_grouped_bn_the_reduced_gradient_measured_is_the_full_batchs(two_ranks: list[dict]) -> None:
    """With BN over the group of both ranks (GroupSyncBatchNorm), what the ranks all-reduce is
    the gradient of the whole batch under BN over all 8 images, as one process computes it:
    the |G_big|² the tap's hook measures is that gradient's, step by step (the same
    trajectory), on both ranks; each rank's |G_small|² is its own local gradient's."""
    from largebatch.diagnostics.noise_scale import squared_norm

    ranks = [r["grouped_bn"] for r in two_ranks]
    model = _bn_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    batches, full = _batches(), []
    for step in range(STEPS):
        images = torch.cat([batches[2 * step][0], batches[2 * step + 1][0]])
        labels = torch.cat([batches[2 * step][1], batches[2 * step + 1][1]])
        torch.nn.functional.cross_entropy(model(images), labels).backward()
        full.append(float(squared_norm(p.grad for p in model.parameters())))
        opt.step()
        opt.zero_grad(set_to_none=True)
    big = [[b for _, b in r] for r in ranks]
    assert len(big[0]) == STEPS and big[0] == pytest.approx(big[1], rel=1e-6)
    assert big[0] == pytest.approx(full, rel=1e-4)
    small = [[s for s, _ in r] for r in ranks]
    assert small[0] != pytest.approx(small[1], rel=1e-3)  # each rank its own local gradient
