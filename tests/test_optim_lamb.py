"""LAMB: hand-computed step, path agreement, timm agreement, convergence, resume, exclusion."""

from __future__ import annotations

import copy
import io
import math

import pytest
import timm.optim
import torch

from largebatch.optim import LAMB
from tests.host_data import HostDataTensors

BOTH_PATHS = pytest.mark.parametrize("foreach", [False, True], ids=["per_tensor", "multi_tensor"])


def _param(values: list[float], grad: list[float]) -> torch.nn.Parameter:
    p = torch.nn.Parameter(torch.tensor(values, dtype=torch.float64))
    p.grad = torch.tensor(grad, dtype=torch.float64)
    return p


def _norm(v: list[float]) -> float:
    return math.sqrt(sum(x * x for x in v))


@BOTH_PATHS
def test_two_steps_match_hand_computation(foreach: bool) -> None:
    lr, b1, b2, eps, wd = 0.1, 0.9, 0.99, 1e-6, 0.1
    w = _param([3.0, 4.0], [1.0, -2.0])
    zero_w = _param([0.0, 0.0], [1.0, 2.0])  # ||w|| = 0: ratio 1
    zero_u = _param([1.0, 2.0], [0.0, 0.0])  # in the wd = 0 group: update 0, ratio 1, no move
    bias = _param([1.0, -1.0], [0.5, -0.25])  # excluded: Adam step, no decay, no ratio
    opt = LAMB(
        [
            {"params": [w, zero_w]},
            {"params": [zero_u], "weight_decay": 0.0},
            {"params": [bias], "lars_exclude": True, "weight_decay": 0.5},
        ],
        lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd, foreach=foreach,
    )  # fmt: skip
    state = {id(p): ([0.0] * 2, [0.0] * 2, list(p.detach().tolist())) for p in (w, zero_w, zero_u, bias)}

    def expected(p, grad, t, decay, exclude):
        m, v, x = state[id(p)]
        m[:] = [b1 * mi + (1 - b1) * g for mi, g in zip(m, grad)]
        v[:] = [b2 * vi + (1 - b2) * g * g for vi, g in zip(v, grad)]
        u = [
            (mi / (1 - b1**t)) / (math.sqrt(vi / (1 - b2**t)) + eps) + (0.0 if exclude else decay * xi)
            for mi, vi, xi in zip(m, v, x)
        ]
        ratio = 1.0 if exclude or _norm(x) == 0 or _norm(u) == 0 else _norm(x) / _norm(u)
        x[:] = [xi - lr * ratio * ui for xi, ui in zip(x, u)]
        return torch.tensor(x, dtype=torch.float64)

    for t in (1, 2):
        opt.step()
        if t == 1:  # m_hat = g, v_hat = g^2: u = g / (|g| + eps) + 0.1 w ~ [1.3, -0.6], ratio 5 / ||u||
            u = [1.0 / (1.0 + eps) + 0.3, -2.0 / (2.0 + eps) + 0.4]
            step1 = [x - lr * 5.0 / _norm(u) * ui for x, ui in zip([3.0, 4.0], u)]
            torch.testing.assert_close(w.detach(), torch.tensor(step1, dtype=torch.float64))
        torch.testing.assert_close(w.detach(), expected(w, [1.0, -2.0], t, wd, False))
        torch.testing.assert_close(zero_w.detach(), expected(zero_w, [1.0, 2.0], t, wd, False))
        torch.testing.assert_close(zero_u.detach(), expected(zero_u, [0.0, 0.0], t, 0.0, False))
        torch.testing.assert_close(bias.detach(), expected(bias, [0.5, -0.25], t, 0.5, True))
    assert zero_u.detach().tolist() == [1.0, 2.0]


def _random_params(seed: int = 0) -> list[torch.nn.Parameter]:
    gen = torch.Generator().manual_seed(seed)
    shapes = [(8, 4, 3, 3), (8,), (8,), (10, 32), (10,), (5, 5)]
    params = [torch.nn.Parameter(torch.randn(s, generator=gen)) for s in shapes]
    with torch.no_grad():
        params[-1].zero_()  # a zero-norm weight
    return params


def _groups(params: list[torch.nn.Parameter], weight_decay: float = 1e-2) -> list[dict]:
    return [
        {"params": [params[0], params[3], params[5]], "weight_decay": weight_decay},
        {"params": [params[1], params[2], params[4]], "weight_decay": 0.0, "lars_exclude": True},
    ]


def _train(make_opt, steps: int = 20, seed: int = 0, weight_decay: float = 1e-2) -> list[torch.Tensor]:
    params = _random_params(seed)
    opt = make_opt(_groups(params, weight_decay))
    gen = torch.Generator().manual_seed(seed + 1)
    for i in range(steps):
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen)
        if i == 0:
            params[0].grad.zero_()
        opt.step()
    return [p.detach().clone() for p in params]


@pytest.mark.parametrize("weight_decay", [1e-2, 0.0])
def test_multi_tensor_and_per_tensor_paths_agree(weight_decay: float) -> None:
    per_tensor = _train(lambda g: LAMB(g, lr=0.01, foreach=False), weight_decay=weight_decay)
    multi_tensor = _train(lambda g: LAMB(g, lr=0.01, foreach=True), weight_decay=weight_decay)
    for a, b in zip(per_tensor, multi_tensor):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


def test_matches_timm_lamb_without_its_gradient_clipping() -> None:
    """timm's Lamb clips the global gradient norm to 1 by default (``max_grad_norm=1.0``): ours never
    clips. With clipping off, and the excluded group at weight_decay 0 (timm skips the ratio only there),
    the updates agree."""
    ours = _train(lambda g: LAMB(g, lr=0.01))
    theirs = _train(lambda g: timm.optim.Lamb(g, lr=0.01, max_grad_norm=None))
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    clipped = _train(lambda g: timm.optim.Lamb(g, lr=0.01))
    assert not torch.allclose(ours[1], clipped[1])


@BOTH_PATHS
def test_trust_clip_matches_timm_lambc(foreach: bool) -> None:
    """``trust_clip=True`` is timm's LAMBC (``Lamb(trust_clip=True)``, ratio capped at 1), here with timm's
    gradient clipping off; the cap changes the result, so it is exercised."""
    ours = _train(lambda g: LAMB(g, lr=0.01, trust_clip=True, foreach=foreach))
    theirs = _train(lambda g: timm.optim.Lamb(g, lr=0.01, trust_clip=True, max_grad_norm=None))
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    unclipped = _train(lambda g: LAMB(g, lr=0.01, foreach=foreach))
    assert not torch.allclose(ours[0], unclipped[0])


@BOTH_PATHS
@pytest.mark.parametrize("weight_decay", [0.0, 0.5])
def test_trust_clip_caps_the_ratio_at_one(foreach: bool, weight_decay: float) -> None:
    """||w|| = 50 against a first Adam step of norm about sqrt(2): ratio about 35 unclipped, 1 clipped, so
    the step is lr * u exactly; a ratio below 1 is left alone."""
    lr, eps = 0.1, 1e-6
    big = _param([30.0, 40.0], [0.5, -2.0])
    small = _param([0.003, 0.004], [0.5, -2.0])  # ||w|| = 0.005: ratio well below 1, unchanged by the cap
    opt = LAMB([big, small], lr=lr, eps=eps, weight_decay=weight_decay, trust_clip=True, foreach=foreach)
    opt.step()
    # first step: m_hat = g, v_hat = g * g, so the Adam direction is g / (|g| + eps)
    for p, w in ((big, [30.0, 40.0]), (small, [0.003, 0.004])):
        u = [gi / (abs(gi) + eps) + weight_decay * wi for gi, wi in zip([0.5, -2.0], w)]
        ratio = min(_norm(w) / _norm(u), 1.0)
        want = [wi - lr * ratio * ui for wi, ui in zip(w, u)]
        torch.testing.assert_close(p.detach(), torch.tensor(want, dtype=torch.float64), rtol=1e-12, atol=1e-12)


@BOTH_PATHS
def test_excluded_group_is_plain_adam(foreach: bool) -> None:
    """Excluded tensors see neither decay (even with a group weight_decay) nor the trust ratio."""

    def run(make):
        gen = torch.Generator().manual_seed(0)
        params = [torch.nn.Parameter(torch.randn(s, generator=gen) * 10) for s in [(16,), (4, 4)]]
        opt = make(params)
        for _ in range(10):
            for p in params:
                p.grad = torch.randn(p.shape, generator=gen)
            opt.step()
        return [p.detach() for p in params]

    ours = run(lambda ps: LAMB([{"params": ps, "lars_exclude": True}], lr=0.05, weight_decay=0.3, foreach=foreach))
    adam = run(lambda ps: torch.optim.Adam(ps, lr=0.05, eps=1e-6))
    for a, b in zip(ours, adam):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


@BOTH_PATHS
def test_converges_on_rosenbrock(foreach: bool) -> None:
    w = torch.nn.Parameter(torch.tensor([-1.5, 2.0]))
    opt = LAMB([w], lr=0.1, weight_decay=0.0, foreach=foreach)
    steps = 1000
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: (1 - s / steps) ** 2)  # poly decay, power 2
    for _ in range(steps):
        opt.zero_grad()
        loss = (1 - w[0]) ** 2 + 100 * (w[1] - w[0] ** 2) ** 2
        loss.backward()
        opt.step()
        schedule.step()
    torch.testing.assert_close(w.detach(), torch.tensor([1.0, 1.0]), rtol=0, atol=2e-2)


@BOTH_PATHS
def test_state_dict_resume_is_bit_identical(foreach: bool) -> None:
    def make(groups):
        return LAMB(groups, lr=0.01, foreach=foreach)

    def grads(step: int, params):
        gen = torch.Generator().manual_seed(100 + step)
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen)

    params = _random_params()
    opt = make(_groups(params))
    for step in range(5):
        grads(step, params)
        opt.step()
    buffer = io.BytesIO()
    torch.save({"params": [p.detach().clone() for p in params], "opt": opt.state_dict()}, buffer)
    for step in range(5, 10):
        grads(step, params)
        opt.step()

    buffer.seek(0)
    saved = torch.load(buffer)
    resumed = [torch.nn.Parameter(t) for t in saved["params"]]
    opt2 = make(_groups(resumed))
    opt2.load_state_dict(saved["opt"])
    assert opt2.state[resumed[0]]["step"] == 5
    for step in range(5, 10):
        grads(step, resumed)
        opt2.step()
    for a, b in zip(params, resumed):
        assert torch.equal(a, b)


def test_gradients_are_not_modified() -> None:
    params = _random_params()
    for p in params:
        p.grad = torch.ones_like(p)
    LAMB(_groups(params), foreach=False).step()
    LAMB(_groups(params), foreach=True).step()
    assert all(torch.equal(p.grad, torch.ones_like(p)) for p in params)


@BOTH_PATHS
def test_step_never_reads_a_tensor_on_the_host(foreach: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    params = _random_params()
    for p in params:
        p.grad = torch.randn_like(p)
    opt = LAMB(_groups(params), foreach=foreach)

    def forbidden(*args, **kwargs):
        raise AssertionError("host read of a tensor inside step()")

    for name in ("item", "tolist", "__bool__", "__float__", "__int__"):
        monkeypatch.setattr(torch.Tensor, name, forbidden)
    opt.step()


@BOTH_PATHS
def test_step_builds_no_tensor_from_host_data(foreach: bool) -> None:
    """The first step (which creates the state) and the next build every tensor on the
    parameter's device: nothing is copied from the host, so step() never waits on a CUDA copy."""
    params = _random_params()
    opt = LAMB(_groups(params), foreach=foreach)
    for _ in range(2):
        for p in params:
            p.grad = torch.randn_like(p)
        with HostDataTensors() as seen:
            opt.step()
        assert seen.calls == []


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"lr": -1.0}, "lr"),
        ({"betas": (0.9, 1.0)}, "betas"),
        ({"betas": (0.9,)}, "betas"),
        ({"eps": 0.0}, "eps"),
        ({"weight_decay": -0.1}, "weight_decay"),
    ],
)
def test_invalid_arguments_raise(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        LAMB([torch.nn.Parameter(torch.ones(2))], **kwargs)


def test_setstate_backfills_new_defaults() -> None:
    opt = LAMB([torch.nn.Parameter(torch.ones(2))])
    state = copy.deepcopy(opt.__getstate__())
    for key in ("trust_clip", "lars_exclude", "foreach"):
        del state["param_groups"][0][key]
    opt.__setstate__(state)
    group = opt.param_groups[0]
    assert (group["trust_clip"], group["lars_exclude"], group["foreach"]) == (False, False, None)


@pytest.mark.gpu
def test_cuda_default_path_matches_cpu_and_never_syncs() -> None:
    cpu = _train(lambda g: LAMB(g, lr=0.01))
    params = [torch.nn.Parameter(p.detach().cuda()) for p in _random_params()]
    opt = LAMB(_groups(params), lr=0.01)  # foreach=None: multi-tensor
    gen = torch.Generator().manual_seed(1)
    for i in range(20):
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen).cuda()
        if i == 0:
            params[0].grad.zero_()
        torch.cuda.set_sync_debug_mode("error")
        try:
            opt.step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    for a, b in zip(cpu, params):
        torch.testing.assert_close(a, b.detach().cpu(), rtol=1e-5, atol=1e-5)


@BOTH_PATHS
def test_state_dict_with_integer_step_counts_still_loads(foreach: bool) -> None:
    """Checkpoints written while ``state['step']`` was a Python int load and continue the same run."""
    params = _random_params()
    opt = LAMB(_groups(params), lr=0.01, foreach=foreach)
    gen = torch.Generator().manual_seed(1)
    for _ in range(3):
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen)
        opt.step()
    old = copy.deepcopy(opt.state_dict())
    for s in old["state"].values():
        s["step"] = int(s["step"])
    twin = [torch.nn.Parameter(p.detach().clone()) for p in params]
    resumed = LAMB(_groups(twin), lr=0.01, foreach=foreach)
    resumed.load_state_dict(old)
    for p, q in zip(params, twin):
        p.grad = torch.randn(p.shape, generator=gen)
        q.grad = p.grad.clone()
    opt.step()
    resumed.step()
    for p, q in zip(params, twin):
        torch.testing.assert_close(q, p, rtol=0, atol=0)
    assert all(torch.is_tensor(s["step"]) and s["step"].item() == 4 for s in resumed.state.values())
