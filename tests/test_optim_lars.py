"""LARS / LARC: hand-computed steps, path agreement, timm agreement, convergence, resume, exclusion."""

from __future__ import annotations

import copy
import io
import math

import pytest
import timm.optim
import torch

from largebatch.optim import LARS
from tests.host_data import HostDataTensors

BOTH_PATHS = pytest.mark.parametrize("foreach", [False, True], ids=["per_tensor", "multi_tensor"])


def _param(values: list[float], grad: list[float]) -> torch.nn.Parameter:
    p = torch.nn.Parameter(torch.tensor(values))
    p.grad = torch.tensor(grad)
    return p


@BOTH_PATHS
def test_two_steps_match_hand_computation(foreach: bool) -> None:
    lr, m, wd, tc = 2.0, 0.9, 0.1, 0.01
    w = _param([3.0, 4.0], [0.6, 0.8])  # ||w|| = 5, ||g|| = 1
    zero_w = _param([0.0, 0.0], [1.0, 2.0])  # ||w|| = 0: ratio 1
    zero_g = _param([1.0, 1.0], [0.0, 0.0])  # ||g|| = 0: ratio 1, decay still applies
    bias = _param([1.0, -1.0], [0.5, 0.5])  # excluded: its group's weight_decay is ignored
    opt = LARS(
        [{"params": [w, zero_w, zero_g]}, {"params": [bias], "lars_exclude": True, "weight_decay": 0.5}],
        lr=lr, momentum=m, weight_decay=wd, trust_coefficient=tc, eps=0.0, foreach=foreach,
    )  # fmt: skip
    opt.step()
    # step 1: ratio = 0.01 * 5 / (1 + 0.1 * 5) = 1/30; d = ratio * (g + wd w) = [0.03, 0.04]; buf = d
    torch.testing.assert_close(w.detach(), torch.tensor([3.0 - 2 * 0.03, 4.0 - 2 * 0.04]))
    torch.testing.assert_close(zero_w.detach(), torch.tensor([-2.0, -4.0]))
    torch.testing.assert_close(zero_g.detach(), torch.tensor([1.0 - 2 * 0.1, 1.0 - 2 * 0.1]))
    torch.testing.assert_close(bias.detach(), torch.tensor([0.0, -2.0]))

    opt.step()  # same gradients again
    buf1 = [0.03, 0.04]
    w1 = [2.94, 3.92]
    norm = math.hypot(*w1)  # 4.9
    ratio = tc * norm / (1.0 + wd * norm)
    buf2 = [m * b + ratio * (g + wd * x) for b, g, x in zip(buf1, [0.6, 0.8], w1)]
    torch.testing.assert_close(w.detach(), torch.tensor([x - lr * b for x, b in zip(w1, buf2)]))
    # zero_w now [-2, -4], ||w|| = sqrt(20), ||g|| = sqrt(5)
    zw, zg = [-2.0, -4.0], [1.0, 2.0]
    zratio = tc * math.sqrt(20) / (math.sqrt(5) + wd * math.sqrt(20))
    zbuf = [m * g + zratio * (g + wd * x) for g, x in zip(zg, zw)]
    torch.testing.assert_close(zero_w.detach(), torch.tensor([x - lr * b for x, b in zip(zw, zbuf)]))
    # bias: plain momentum SGD, buf = 0.9 * g + g
    torch.testing.assert_close(bias.detach(), torch.tensor([0.0 - 2 * 0.95, -2.0 - 2 * 0.95]))


@BOTH_PATHS
def test_larc_clip_and_nesterov_first_step(foreach: bool) -> None:
    # raw ratio 1/30; LARC: min(ratio / lr, 1) -> 1 at lr = 0.01, ratio / lr = 1/3 at lr = 0.1
    for lr, expected_ratio in ((0.01, 1.0), (0.1, 1.0 / 3.0)):
        w = _param([3.0, 4.0], [0.6, 0.8])
        opt = LARS([w], lr=lr, momentum=0.9, weight_decay=0.1, trust_coefficient=0.01, eps=0.0,
                   trust_clip=True, nesterov=True, foreach=foreach)  # fmt: skip
        opt.step()
        d = [expected_ratio * (0.6 + 0.3), expected_ratio * (0.8 + 0.4)]
        # Nesterov, first step: buf = d, update = d + 0.9 * buf
        torch.testing.assert_close(w.detach(), torch.tensor([3.0 - lr * 1.9 * d[0], 4.0 - lr * 1.9 * d[1]]))


def _random_params(seed: int = 0) -> list[torch.nn.Parameter]:
    gen = torch.Generator().manual_seed(seed)
    shapes = [(8, 4, 3, 3), (8,), (8,), (10, 32), (10,), (5, 5)]
    params = [torch.nn.Parameter(torch.randn(s, generator=gen)) for s in shapes]
    with torch.no_grad():
        params[-1].zero_()  # a zero-norm weight
    return params


def _groups(params: list[torch.nn.Parameter]) -> list[dict]:
    return [
        {"params": [params[0], params[3], params[5]], "weight_decay": 1e-2},
        {"params": [params[1], params[2], params[4]], "weight_decay": 0.0, "lars_exclude": True},
    ]


def _train(make_opt, steps: int = 20, seed: int = 0) -> list[torch.Tensor]:
    params = _random_params(seed)
    opt = make_opt(_groups(params))
    gen = torch.Generator().manual_seed(seed + 1)
    for i in range(steps):
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen)
        if i % 3 == 0:
            params[0].grad.zero_()  # a zero-norm gradient now and then
        opt.step()
    return [p.detach().clone() for p in params]


@pytest.mark.parametrize(
    "options",
    [{}, {"nesterov": True}, {"trust_clip": True}, {"trust_clip": True, "nesterov": True}, {"momentum": 0.0}],
    ids=["plain", "nesterov", "larc", "larc_nesterov", "no_momentum"],
)
def test_multi_tensor_and_per_tensor_paths_agree(options: dict) -> None:
    def make(foreach: bool):
        return lambda groups: LARS(groups, lr=0.1, trust_coefficient=0.02, foreach=foreach, **options)

    for a, b in zip(_train(make(False)), _train(make(True))):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_paths_agree_on_channels_last_and_low_precision_tensors(dtype: torch.dtype) -> None:
    """Non-contiguous and bfloat16 tensors take the per-tensor fallbacks (no BLAS dot, no addr)."""

    def run(foreach: bool) -> list[torch.Tensor]:
        gen = torch.Generator().manual_seed(0)
        conv = torch.randn(8, 4, 3, 3, generator=gen).to(dtype).contiguous(memory_format=torch.channels_last)
        params = [torch.nn.Parameter(conv), torch.nn.Parameter(torch.randn(6, 5, generator=gen).to(dtype))]
        opt = LARS(params, lr=0.1, weight_decay=1e-2, trust_coefficient=0.02, foreach=foreach)
        for _ in range(5):
            for p in params:
                p.grad = torch.randn(p.shape, generator=gen).to(dtype)
            opt.step()
        assert params[0].is_contiguous(memory_format=torch.channels_last)
        return [p.detach().float() for p in params]

    tol = 1e-6 if dtype == torch.float32 else 1e-2
    for a, b in zip(run(False), run(True)):
        torch.testing.assert_close(a, b, rtol=tol, atol=tol)


@pytest.mark.parametrize("options", [{}, {"nesterov": True}, {"trust_clip": True}], ids=["lars", "nesterov", "larc"])
def test_matches_timm_lars(options: dict) -> None:
    """Same groups, same update. Intended differences, none visible here: timm excludes a group from
    adaptation only through weight_decay == 0 (ours: the explicit ``lars_exclude`` flag, so the excluded
    group here has both), timm clones the first momentum buffer (ours starts at zero: same values), and
    timm has dampening (ours has none)."""
    ours = _train(lambda g: LARS(g, lr=0.1, momentum=0.9, trust_coefficient=0.02, **options))
    theirs = _train(lambda g: timm.optim.Lars(g, lr=0.1, momentum=0.9, trust_coeff=0.02, **options))
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


def test_zero_weight_decay_group_is_still_adapted_unlike_timm_default() -> None:
    def groups_no_decay(params):
        return [{"params": params, "weight_decay": 0.0}]

    def run(make):
        params = _random_params()
        opt = make(groups_no_decay(params))
        gen = torch.Generator().manual_seed(1)
        for _ in range(5):
            for p in params:
                p.grad = torch.randn(p.shape, generator=gen)
            opt.step()
        return [p.detach() for p in params]

    ours = run(lambda g: LARS(g, lr=0.1, trust_coefficient=0.02))
    timm_adapt = run(lambda g: timm.optim.Lars(g, lr=0.1, momentum=0.9, trust_coeff=0.02, always_adapt=True))
    timm_default = run(lambda g: timm.optim.Lars(g, lr=0.1, momentum=0.9, trust_coeff=0.02))
    for a, b in zip(ours, timm_adapt):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    assert not torch.allclose(ours[0], timm_default[0])


@BOTH_PATHS
def test_excluded_group_is_plain_momentum_sgd(foreach: bool) -> None:
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

    ours = run(lambda ps: LARS([{"params": ps, "lars_exclude": True}], lr=0.5, momentum=0.9, weight_decay=0.3,
                               trust_coefficient=1e-3, nesterov=True, foreach=foreach))  # fmt: skip
    sgd = run(lambda ps: torch.optim.SGD(ps, lr=0.5, momentum=0.9, nesterov=True))
    for a, b in zip(ours, sgd):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


@BOTH_PATHS
def test_converges_on_rosenbrock(foreach: bool) -> None:
    w = torch.nn.Parameter(torch.tensor([-1.5, 2.0]))
    opt = LARS([w], lr=1.0, momentum=0.9, trust_coefficient=0.01, foreach=foreach)
    steps = 1000
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: (1 - s / steps) ** 2)  # poly decay, power 2
    for _ in range(steps):
        opt.zero_grad()
        loss = (1 - w[0]) ** 2 + 100 * (w[1] - w[0] ** 2) ** 2
        loss.backward()
        opt.step()
        schedule.step()
    torch.testing.assert_close(w.detach(), torch.tensor([1.0, 1.0]), rtol=0, atol=1e-3)


@BOTH_PATHS
def test_state_dict_resume_is_bit_identical(foreach: bool) -> None:
    def make(groups):
        return LARS(groups, lr=0.1, trust_coefficient=0.02, nesterov=True, foreach=foreach)

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
    for step in range(5, 10):
        grads(step, resumed)
        opt2.step()
    for a, b in zip(params, resumed):
        assert torch.equal(a, b)


def test_gradients_are_not_modified() -> None:
    params = _random_params()
    for p in params:
        p.grad = torch.ones_like(p)
    LARS(_groups(params), lr=0.1, foreach=False).step()
    LARS(_groups(params), lr=0.1, foreach=True).step()
    assert all(torch.equal(p.grad, torch.ones_like(p)) for p in params)


@BOTH_PATHS
def test_step_never_reads_a_tensor_on_the_host(foreach: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    params = _random_params()
    for p in params:
        p.grad = torch.randn_like(p)
    opt = LARS(_groups(params), lr=0.1, trust_clip=True, foreach=foreach)

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
    opt = LARS(_groups(params), foreach=foreach)
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
        ({"momentum": 1.0}, "momentum"),
        ({"weight_decay": -1e-4}, "weight_decay"),
        ({"trust_coefficient": 0.0}, "trust_coefficient"),
        ({"eps": -1.0}, "eps"),
        ({"momentum": 0.0, "nesterov": True}, "nesterov"),
        ({"lr_in_momentum": "true"}, "invalid lr_in_momentum 'true', must be True or False"),
    ],
)
def test_invalid_arguments_raise(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        LARS([torch.nn.Parameter(torch.ones(2))], **kwargs)


def test_invalid_param_group_raises() -> None:
    with pytest.raises(ValueError, match="param group 1: invalid momentum"):
        LARS([{"params": [torch.nn.Parameter(torch.ones(2))]},
              {"params": [torch.nn.Parameter(torch.ones(2))], "momentum": -0.5}])  # fmt: skip


def test_setstate_backfills_new_defaults() -> None:
    opt = LARS([torch.nn.Parameter(torch.ones(2))])
    state = copy.deepcopy(opt.__getstate__())
    for key in ("nesterov", "trust_clip", "lars_exclude", "foreach", "eps", "trust_coefficient", "lr_in_momentum"):
        del state["param_groups"][0][key]
    opt.__setstate__(state)
    group = opt.param_groups[0]
    assert (group["nesterov"], group["trust_clip"], group["lars_exclude"], group["foreach"]) == (
        False, False, False, None)  # fmt: skip
    assert group["lr_in_momentum"] is False  # the only form before the option


@pytest.mark.gpu
@pytest.mark.parametrize("options", [{}, {"nesterov": True}, {"trust_clip": True}], ids=["lars", "nesterov", "larc"])
def test_cuda_default_path_matches_cpu_and_never_syncs(options: dict) -> None:
    cpu = _train(lambda g: LARS(g, lr=0.1, trust_coefficient=0.02, **options))
    params = [torch.nn.Parameter(p.detach().cuda()) for p in _random_params()]
    opt = LARS(_groups(params), lr=0.1, trust_coefficient=0.02, **options)  # foreach=None: multi-tensor
    gen = torch.Generator().manual_seed(1)
    grads = [[torch.randn(p.shape, generator=gen) for p in params] for _ in range(20)]
    for i, step_grads in enumerate(grads):
        for p, g in zip(params, step_grads):
            p.grad = g.cuda()
        if i % 3 == 0:
            params[0].grad.zero_()
        torch.cuda.set_sync_debug_mode("error")
        try:
            opt.step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    for a, b in zip(cpu, params):
        torch.testing.assert_close(a, b.detach().cpu(), rtol=1e-5, atol=1e-5)
