"""LARS's two momentum-buffer forms (``lr_in_momentum``), each against a transcription of the update it
reproduces, over an lr that changes at every step (warmup, then poly decay): False against torch's SGD
form (timm's ``Lars``, run as timm's code), True against the tensorflow/tpu and MLPerf reference
optimizers (tests/lars_references.py). Both paths, with and without Nesterov; the forms agree at a
constant lr and not under the schedule; a resume across forms is refused."""

from __future__ import annotations

import io

import pytest
import timm.optim
import torch

from largebatch.optim import LARS, build_optimizer
from tests.lars_references import mlperf_lars_step, tf_tpu_lars_step, warmup_poly_lrs
from tests.test_optim_lars import BOTH_PATHS

NESTEROV = pytest.mark.parametrize("nesterov", [False, True], ids=["heavy_ball", "nesterov"])
WD, ETA = 1e-2, 0.02
TOL = dict(rtol=1e-12, atol=1e-12)  # float64: the paths and the references differ only in rounding


def _params() -> tuple[list[torch.Tensor], list[bool]]:
    """float64 tensors (conv, fc, a zero-norm weight) and the skipped ones (bias, BN), with flags."""
    gen = torch.Generator().manual_seed(0)
    shapes = [((8, 4, 3, 3), False), ((10, 32), False), ((5, 5), False), ((8,), True), ((10,), True)]
    params = [torch.randn(s, generator=gen, dtype=torch.float64) for s, _ in shapes]
    params[2].zero_()  # ||w|| = 0: trust ratio 1 in every source
    return params, [skip for _, skip in shapes]


def _grads(params: list[torch.Tensor], lrs: list[float]) -> list[list[torch.Tensor]]:
    gen = torch.Generator().manual_seed(1)
    steps = [[torch.randn(p.shape, generator=gen, dtype=p.dtype) for p in params] for _ in lrs]
    steps[3][0].zero_()  # ||g|| = 0 once: trust ratio 1
    return steps


def _run_ours(lrs: list[float], *, eps: float = 0.0, **options) -> list[torch.Tensor]:
    values, skipped = _params()
    params = [torch.nn.Parameter(v) for v in values]
    opt = LARS(
        [{"params": [p for p, s in zip(params, skipped) if not s]},
         {"params": [p for p, s in zip(params, skipped) if s], "lars_exclude": True}],
        lr=lrs[0], weight_decay=WD, trust_coefficient=ETA, eps=eps, **{"momentum": 0.9, **options},
    )  # fmt: skip
    for lr, grads in zip(lrs, _grads(values, lrs)):
        for group in opt.param_groups:
            group["lr"] = lr  # what LambdaLR does before each step
        for p, g in zip(params, grads):
            p.grad = g
        opt.step()
    return [p.detach() for p in params]


def _run_reference(step, lrs: list[float], *, nesterov: bool, eps: float = 0.0) -> list[torch.Tensor]:
    params, skipped = _params()
    moms = [torch.zeros_like(p) for p in params]
    for lr, grads in zip(lrs, _grads(params, lrs)):
        step(params, grads, moms, skipped, learning_rate=lr, momentum=0.9, weight_decay=WD, eeta=ETA,
             epsilon=eps, use_nesterov=nesterov)
    return params


def _assert_all_close(a: list[torch.Tensor], b: list[torch.Tensor]) -> None:
    for i, (x, y) in enumerate(zip(a, b)):
        torch.testing.assert_close(x, y, **TOL, msg=lambda m: f"tensor {i}: {m}")


@BOTH_PATHS
@NESTEROV
def test_lr_in_momentum_is_the_tensorflow_tpu_update(foreach: bool, nesterov: bool) -> None:
    lrs = warmup_poly_lrs()
    ours = _run_ours(lrs, lr_in_momentum=True, nesterov=nesterov, foreach=foreach)
    _assert_all_close(ours, _run_reference(tf_tpu_lars_step, lrs, nesterov=nesterov))


@BOTH_PATHS
@NESTEROV
def test_lr_in_momentum_is_the_mlperf_update(foreach: bool, nesterov: bool) -> None:
    """The MLPerf optimizer adds Keras's epsilon (1e-7) when given 0, as mlperf_rn50 sets."""
    lrs = warmup_poly_lrs()
    ours = _run_ours(lrs, eps=1e-7, lr_in_momentum=True, nesterov=nesterov, foreach=foreach)
    _assert_all_close(ours, _run_reference(mlperf_lars_step, lrs, nesterov=nesterov, eps=0.0))


@BOTH_PATHS
@NESTEROV
def test_default_form_is_torch_sgd_form_as_timm_lars(foreach: bool, nesterov: bool) -> None:
    """lr_in_momentum=False (the default) is timm's Lars (1.0.31 timm/optim/lars.py: ``buf = m * buf +
    ratio * (g + wd * w)``, ``p -= lr * buf``), run as timm's code, on the adapted tensors, and torch's SGD
    on the excluded ones (timm's Lars skips adaptation at weight decay 0; ours through lars_exclude)."""
    lrs = warmup_poly_lrs()
    ours = _run_ours(lrs, nesterov=nesterov, foreach=foreach)
    values, skipped = _params()
    params = [torch.nn.Parameter(v) for v in values]
    theirs = timm.optim.Lars(
        [{"params": [p for p, s in zip(params, skipped) if not s], "weight_decay": WD, "always_adapt": True},
         {"params": [p for p, s in zip(params, skipped) if s], "weight_decay": 0.0}],
        lr=lrs[0], momentum=0.9, trust_coeff=ETA, eps=0.0, nesterov=nesterov,
    )  # fmt: skip
    for lr, grads in zip(lrs, _grads(values, lrs)):
        for group in theirs.param_groups:
            group["lr"] = lr
        for p, g in zip(params, grads):
            p.grad = g
        theirs.step()
    _assert_all_close(ours, [p.detach() for p in params])


@NESTEROV
def test_the_forms_agree_at_constant_lr_and_differ_under_warmup_and_poly(nesterov: bool) -> None:
    constant = [1.5] * 20
    _assert_all_close(_run_ours(constant, nesterov=nesterov), _run_ours(constant, lr_in_momentum=True,
                                                                         nesterov=nesterov))
    lrs = warmup_poly_lrs()
    torch_form = _run_ours(lrs, nesterov=nesterov)
    tf_form = _run_ours(lrs, lr_in_momentum=True, nesterov=nesterov)
    for i, (a, b) in enumerate(zip(torch_form, tf_form)):
        if i != 2:  # the zero weight has ||w|| = 0 at the start only; all others move differently
            assert (a - b).abs().max() > 1e-4, f"tensor {i} is the same in both forms"


@pytest.mark.parametrize(
    "options", [{}, {"nesterov": True}, {"trust_clip": True}, {"momentum": 0.0}],
    ids=["plain", "nesterov", "larc", "no_momentum"],
)
def test_paths_agree_in_the_lr_in_momentum_form(options: dict) -> None:
    lrs = warmup_poly_lrs()
    _assert_all_close(_run_ours(lrs, lr_in_momentum=True, foreach=False, **options),
                      _run_ours(lrs, lr_in_momentum=True, foreach=True, **options))


@BOTH_PATHS
def test_without_momentum_the_forms_are_one_update(foreach: bool) -> None:
    lrs = warmup_poly_lrs()
    _assert_all_close(_run_ours(lrs, momentum=0.0, foreach=foreach),
                      _run_ours(lrs, momentum=0.0, lr_in_momentum=True, foreach=foreach))


def _saved_state(lr_in_momentum: bool, momentum: float = 0.9) -> tuple[list[torch.nn.Parameter], dict]:
    params = [torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(2))]
    opt = LARS([{"params": params[:1]}, {"params": params[1:], "lars_exclude": True}], lr=0.1,
               momentum=momentum, lr_in_momentum=lr_in_momentum)  # fmt: skip
    for p in params:
        p.grad = torch.full_like(p, 0.5)
    opt.step()
    buffer = io.BytesIO()
    torch.save(opt.state_dict(), buffer)
    buffer.seek(0)
    return params, torch.load(buffer)


@pytest.mark.parametrize("saved, now", [(False, True), (True, False)])
def test_resume_into_the_other_form_is_refused_in_one_line(saved: bool, now: bool) -> None:
    params, state = _saved_state(saved)
    opt = LARS([{"params": params[:1]}, {"params": params[1:], "lars_exclude": True}], lr=0.1,
               lr_in_momentum=now)  # fmt: skip
    message = (rf"^LARS param group 0: the saved momentum buffers were written with lr_in_momentum={saved} "
               rf"and this optimizer has lr_in_momentum={now} .*resume with lr_in_momentum={saved}, or start afresh$")
    with pytest.raises(ValueError, match=message):
        opt.load_state_dict(state)
    assert opt.state == {}  # nothing was loaded


def test_resume_in_the_same_form_and_from_before_the_option() -> None:
    params, state = _saved_state(True)
    opt = LARS([{"params": params[:1]}, {"params": params[1:], "lars_exclude": True}], lr_in_momentum=True)
    opt.load_state_dict(state)
    assert opt.param_groups[0]["lr_in_momentum"] is True and len(opt.state) == 2
    # a state written before the option existed has no key: it was the torch form
    params, state = _saved_state(False)
    for group in state["param_groups"]:
        del group["lr_in_momentum"]
    LARS([{"params": params[:1]}, {"params": params[1:], "lars_exclude": True}]).load_state_dict(state)
    with pytest.raises(ValueError, match="written with lr_in_momentum=False"):
        LARS([{"params": params[:1]}, {"params": params[1:], "lars_exclude": True}],
             lr_in_momentum=True).load_state_dict(state)  # fmt: skip
    # no momentum buffers (momentum 0): nothing whose meaning differs, so the form may change
    params, state = _saved_state(False, momentum=0.0)
    LARS([{"params": params[:1]}, {"params": params[1:], "lars_exclude": True}], momentum=0.0,
         lr_in_momentum=True).load_state_dict(state)  # fmt: skip


def test_build_optimizer_passes_lr_in_momentum() -> None:
    model = torch.nn.Linear(3, 2)
    for name in ("lars", "larc"):
        opt = build_optimizer(name, model, lr=1.0, weight_decay=1e-4, lr_in_momentum=True)
        assert all(g["lr_in_momentum"] is True for g in opt.param_groups)
        assert build_optimizer(name, model, lr=1.0, weight_decay=1e-4).defaults["lr_in_momentum"] is False
    with pytest.raises(ValueError, match="'sgd' does not take option.*'lr_in_momentum'"):
        build_optimizer("sgd", model, lr=1.0, weight_decay=1e-4, lr_in_momentum=True)
