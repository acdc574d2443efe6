"""The gradient noise scale (largebatch/diagnostics/noise_scale.py) against a problem solved by hand.

Linear regression with Gaussian inputs: ``y = x·w* + ε``, ``x ~ N(0, I_d)``, ``ε ~ N(0, σ²)``, the
per-example loss ``½ (x·w − y)²``. At ``w = w* + δ`` the per-example gradient is
``g = x (x·δ − ε)``, so

* ``G = E[g] = E[x xᵀ] δ − E[x ε] = δ``, hence ``|G|² = |δ|²``;
* ``E|g|² = E[|x|² (x·δ)²] + σ² E|x|² = (d + 2) |δ|² + d σ²`` (Isserlis: ``E[x_i² (x·δ)²] = |δ|² + 2 δ_i²``);
* ``tr Σ = E|g|² − |G|² = (d + 1) |δ|² + d σ²``, and ``B_simple = tr Σ / |G|²``.

With ``d = 16``, ``|δ| = 2``, ``σ = 1``: ``|G|² = 4``, ``tr Σ = 84``, ``B_simple = 21``, between the
two batch sizes drawn, ``B_small = 16`` (one rank's batch) inside ``B_big = 256`` (16 ranks' global
batch), the way data-parallel training gives them.
"""

from __future__ import annotations

import math

import pytest
import torch

from largebatch.diagnostics import GradientNoiseScale, grad_sq_norm_estimate, noise_trace_estimate, squared_norm
from tests.test_no_host_sync import HostReads

D, DELTA, SIGMA = 16, 2.0, 1.0
B_SMALL, B_BIG = 16, 256
TRUE_G2 = DELTA**2  # 4
TRUE_TRACE = (D + 1) * DELTA**2 + D * SIGMA**2  # 84
TRUE_B_SIMPLE = TRUE_TRACE / TRUE_G2  # 21
STEPS = 16_000
TRACKED_STEPS = 2_000  # updates of the tracker itself (~0.06 ms each on a quiet CPU)
BETA = 0.9999  # weights from 1 (last step) down to beta**STEPS = 0.2 (first): ~13k effective steps
TOLERANCE = 0.05


def _batch_gradients(x: torch.Tensor, eps: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
    """Mean gradient of ``½ (x·w − y)²`` over dim -2 at ``w = w* + delta``: ``xᵀ (x·δ − ε) / B``."""
    return torch.einsum("...bd,...b->...d", x, x @ delta - eps) / x.shape[-2]


@pytest.fixture(scope="module")
def draws() -> tuple[torch.Tensor, torch.Tensor]:
    """``STEPS`` steps' gradients: the mean over the first ``B_SMALL`` examples and over all ``B_BIG``."""
    gen = torch.Generator().manual_seed(0)
    delta = torch.zeros(D)
    delta[0] = DELTA
    small, big = [], []
    for _ in range(STEPS // 2000):  # 2000 steps at a time: 33 MB of inputs, not 260
        x = torch.randn(2000, B_BIG, D, generator=gen)
        eps = SIGMA * torch.randn(2000, B_BIG, generator=gen)
        small.append(_batch_gradients(x[:, :B_SMALL], eps[:, :B_SMALL], delta))
        big.append(_batch_gradients(x, eps, delta))
    return torch.cat(small), torch.cat(big)


def test_the_batch_gradient_is_autograds() -> None:
    """The premise of the closed form: ``_batch_gradients`` is the gradient autograd computes."""
    gen = torch.Generator().manual_seed(1)
    w_star, delta = torch.randn(D, generator=gen), torch.randn(D, generator=gen)
    x, eps = torch.randn(B_SMALL, D, generator=gen), torch.randn(B_SMALL, generator=gen)
    w = (w_star + delta).requires_grad_()
    (0.5 * (x @ w - (x @ w_star + eps)).square().mean()).backward()
    torch.testing.assert_close(w.grad, _batch_gradients(x, eps, delta))


def _estimates(draws: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    small, big = draws
    sq_small, sq_big = small.double().square().sum(-1), big.double().square().sum(-1)
    return (grad_sq_norm_estimate(sq_small, B_SMALL, sq_big, B_BIG),
            noise_trace_estimate(sq_small, B_SMALL, sq_big, B_BIG))


def _ema_weights(steps: int) -> torch.Tensor:
    """The weight of each step's estimate in the tracker's bias-corrected average after ``steps``
    updates: ``(1−β) β^(t−i) / (1 − β^t)``, summing to 1 (the class's docstring)."""
    return (1 - BETA) * BETA ** torch.arange(steps - 1, -1, -1, dtype=torch.float64) / (1 - BETA**steps)


def test_tracker_averages_the_per_step_estimates_with_the_ema_weights(
        draws: tuple[torch.Tensor, torch.Tensor]) -> None:
    """The tracker fed ``TRACKED_STEPS`` steps holds the weighted means of the per-step estimates
    (bias-corrected EMA weights) and their ratio, to float32's rounding. The statistical check
    below applies the same weights to all ``STEPS`` steps, without the 16,000 updates (a tenth of
    this test's time; several times more beside a busy worker)."""
    small, big = (d[:TRACKED_STEPS] for d in draws)
    tracker = GradientNoiseScale(beta=BETA)
    for g_small, g_big in zip(small, big):
        tracker.update(squared_norm([g_small]), B_SMALL, squared_norm([g_big]), B_BIG)
    g2, tr = _estimates((small, big))
    weights = _ema_weights(TRACKED_STEPS)
    g2_mean, tr_mean = (weights * g2).sum().item(), (weights * tr).sum().item()
    assert tracker.grad_sq_norm().item() == pytest.approx(g2_mean, rel=1e-4)
    assert tracker.noise_trace().item() == pytest.approx(tr_mean, rel=1e-4)
    assert tracker.noise_scale().item() == pytest.approx(tr_mean / g2_mean, rel=1e-4)
    assert tracker.updates == TRACKED_STEPS


def test_the_averaged_estimates_match_the_closed_form(draws: tuple[torch.Tensor, torch.Tensor]) -> None:
    """The tracker's average over ``STEPS`` steps (its weights, checked above) is within 5% of the
    closed form for ``|G|²``, ``tr Σ`` and ``B_simple``."""
    # The tolerance from the estimator's own spread at this many steps: the EMA's weights w_i give
    # std(EMA) = std(per-step estimate) * sqrt(Σ w_i²), and the ratio's relative error is, to first
    # order, that of tr/TRUE_TRACE − g2/TRUE_G2. One step's estimates spread by ~100% (tr Σ) and ~20%
    # (|G|²), so ~13k effective steps give ~1% (measured below); 5% is > 4 standard deviations, and a
    # wrong formula (a factor in B, a swapped batch size) misses by far more than 5%.
    g2, tr = _estimates(draws)
    weights = _ema_weights(STEPS)
    spread = math.sqrt(weights.square().sum())
    rel_std = {
        "|G|²": (g2 / TRUE_G2).std().item() * spread,
        "tr Σ": (tr / TRUE_TRACE).std().item() * spread,
        "B_simple": (tr / TRUE_TRACE - g2 / TRUE_G2).std().item() * spread,
    }
    assert max(rel_std.values()) * 4 < TOLERANCE, rel_std

    g2_mean, tr_mean = (weights * g2).sum().item(), (weights * tr).sum().item()
    measured = {"|G|²": g2_mean, "tr Σ": tr_mean, "B_simple": tr_mean / g2_mean}
    truth = {"|G|²": TRUE_G2, "tr Σ": TRUE_TRACE, "B_simple": TRUE_B_SIMPLE}
    error = {k: measured[k] / truth[k] - 1 for k in truth}
    print(f"relative error {error}, one standard deviation {rel_std}")
    assert all(abs(e) < TOLERANCE for e in error.values()), (error, rel_std)


def test_per_step_estimates_are_unbiased_and_their_ratio_is_not(draws: tuple[torch.Tensor, torch.Tensor]) -> None:
    """Appendix A.1's point, and the reason the tracker averages before dividing: the mean of the
    per-step estimates is within 4 standard errors of the truth, the mean of the per-step ratio is not
    (about +14% here: the noisy |G|² estimate sits in the denominator, anti-correlated with tr Σ's)."""
    g2, tr = _estimates(draws)
    for est, truth in ((g2, TRUE_G2), (tr, TRUE_TRACE)):
        standard_error = est.std().item() / math.sqrt(len(est))
        assert abs(est.mean().item() - truth) < 4 * standard_error, (est.mean().item(), truth, standard_error)
    assert (g2 > 0).all()  # in this regime the ratio has a mean at all (a |G|² estimate near 0 would be worse)
    ratio = tr / g2
    standard_error = ratio.std().item() / math.sqrt(len(ratio))
    bias = ratio.mean().item() - TRUE_B_SIMPLE
    assert bias > 8 * standard_error and bias > 0.08 * TRUE_B_SIMPLE, (bias, standard_error)
    assert abs(tr.mean().item() / g2.mean().item() / TRUE_B_SIMPLE - 1) < 0.02  # average, then divide


def test_the_estimates_solve_the_two_expectations() -> None:
    """Given exact expectations ``E|G_B|² = |G|² + tr Σ / B`` at both sizes, both formulas return the
    two terms exactly (floats in, floats out)."""
    def expected(b: int) -> float:
        return TRUE_G2 + TRUE_TRACE / b
    assert grad_sq_norm_estimate(expected(32), 32, expected(512), 512) == pytest.approx(TRUE_G2)
    assert noise_trace_estimate(expected(32), 32, expected(512), 512) == pytest.approx(TRUE_TRACE)


def _feed(tracker: GradientNoiseScale, steps: int, seed: int, device: str = "cpu") -> None:
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        small, big = torch.rand(2, generator=gen).to(device) + torch.tensor([2.0, 1.0]).to(device)
        tracker.update(small, B_SMALL, big, B_BIG)


def test_update_and_reading_read_nothing_on_the_host() -> None:
    tracker = GradientNoiseScale()
    grads = [torch.randn(5, 3), torch.randn(7, dtype=torch.bfloat16)]
    small, big = squared_norm(grads), squared_norm([g / 2 for g in grads])
    with HostReads() as reads:
        for _ in range(3):
            tracker.update(squared_norm(grads), B_SMALL, squared_norm([g / 2 for g in grads]), B_BIG)
            values = (tracker.noise_scale(), tracker.grad_sq_norm(), tracker.noise_trace())
        tracker.load_state_dict(tracker.state_dict())
    assert reads.count == 0, reads.names
    assert all(v.shape == () and v.dtype == torch.float32 for v in values)
    # the detector sees what it must catch
    with HostReads() as reads:
        tracker.noise_scale().item()
    assert reads.names == ["item"]
    # and on the meta device, where any read of a value raises, the update runs as well
    meta = GradientNoiseScale()
    meta.update(small.to("meta"), B_SMALL, big.to("meta"), B_BIG)
    assert meta.noise_scale().device.type == "meta"


def test_state_dict_round_trip_continues_the_same_averages() -> None:
    straight = GradientNoiseScale(beta=0.9)
    _feed(straight, 40, seed=0)
    saved = straight.state_dict()
    _feed(straight, 5, seed=9)  # the saved copy must not follow the tracker it came from
    resumed = GradientNoiseScale(beta=0.9)
    resumed.load_state_dict(saved)
    straight.load_state_dict(saved)
    _feed(straight, 30, seed=1)
    _feed(resumed, 30, seed=1)
    assert resumed.updates == straight.updates == 70
    for name in ("noise_scale", "grad_sq_norm", "noise_trace"):
        assert torch.equal(getattr(resumed, name)(), getattr(straight, name)()), name
    with pytest.raises(ValueError, match=r"beta=0.9 .* resume with beta=0.9"):
        GradientNoiseScale(beta=0.99).load_state_dict(saved)


def test_edge_values_before_and_while_the_signal_is_unresolved() -> None:
    tracker = GradientNoiseScale()
    assert all(math.isnan(v().item()) for v in (tracker.noise_scale, tracker.grad_sq_norm, tracker.noise_trace))
    # |G_big|² * B_big < |G_small|² * B_small: the |G|² estimate is negative, B_simple is +inf
    tracker.update(torch.tensor(10.0), B_SMALL, torch.tensor(0.1), B_BIG)
    assert tracker.grad_sq_norm().item() < 0 and tracker.noise_scale().item() == math.inf
    # a non-finite step (an overflowed gradient) leaves the averages as they were
    before = tracker.state_dict()["ema"]
    tracker.update(torch.tensor(math.inf), B_SMALL, torch.tensor(1.0), B_BIG)
    tracker.update(torch.tensor(math.nan), B_SMALL, torch.tensor(1.0), B_BIG)
    assert torch.equal(tracker.state_dict()["ema"], before)


def test_the_first_update_is_its_own_average() -> None:
    """Adam-style bias correction: after one update the averages are that step's estimates, not (1 − β)
    times them."""
    tracker = GradientNoiseScale(beta=0.99)
    small, big = torch.tensor(3.0), torch.tensor(1.5)
    tracker.update(small, B_SMALL, big, B_BIG)
    torch.testing.assert_close(tracker.grad_sq_norm(), grad_sq_norm_estimate(small, B_SMALL, big, B_BIG))
    torch.testing.assert_close(tracker.noise_trace(), noise_trace_estimate(small, B_SMALL, big, B_BIG))


def test_squared_norm_is_a_float32_sum_of_squares() -> None:
    grads = [torch.randn(4, 5), torch.randn(3, dtype=torch.bfloat16), torch.randn(2, 2, dtype=torch.float16)]
    got = squared_norm(grads)
    want = sum(g.double().square().sum() for g in grads)
    assert got.dtype == torch.float32 and got.shape == ()
    torch.testing.assert_close(got.double(), want, rtol=1e-6, atol=0)
    assert squared_norm([torch.ones(3, dtype=torch.float64)]).dtype == torch.float64
    with pytest.raises(ValueError, match="no tensor"):
        squared_norm([])


@pytest.mark.parametrize(
    ("batch_small", "batch_big", "message"),
    [
        (64, 64, r"batch_small=64 must be smaller than batch_big=64"),
        (128, 64, r"batch_small=128 must be smaller than batch_big=64"),
        (0, 64, r"batch_small=0 must be a positive number"),
        (-8, 64, r"batch_small=-8 must be a positive number"),
        (8, math.inf, r"batch_big=inf must be a positive number"),
        (torch.tensor(8), 64, r"batch_small must be a number of examples"),
    ],
)
def test_bad_batch_sizes_are_refused(batch_small: object, batch_big: object, message: str) -> None:
    for estimate in (grad_sq_norm_estimate, noise_trace_estimate):
        with pytest.raises(ValueError, match=message):
            estimate(1.0, batch_small, 0.5, batch_big)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=message):
        GradientNoiseScale().update(torch.tensor(1.0), batch_small, torch.tensor(0.5), batch_big)  # type: ignore[arg-type]


@pytest.mark.parametrize("beta", [1.0, -0.1, float("nan")])
def test_bad_beta_is_refused(beta: float) -> None:
    with pytest.raises(ValueError, match=r"beta=.* must be in \[0, 1\)"):
        GradientNoiseScale(beta=beta)
