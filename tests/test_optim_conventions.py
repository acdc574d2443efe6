"""torch.optim's conventions, held by LARS and LAMB alike: a rejected param group is not kept,
complex parameters are optimised as their real view (as torch's Adam does), and a compiled
``step()`` compiles once (no Python number in the step that dynamo would guard on); timm's argument
names are taken where they mean what ours do and refused, naming ours, where they do not."""

from __future__ import annotations

import pytest
import torch

from largebatch.optim import LAMB, LARS
from tests.test_optim_lars import BOTH_PATHS, _groups, _random_params, _train

BOTH_OPTIMIZERS = pytest.mark.parametrize("cls", [LARS, LAMB], ids=["lars", "lamb"])


@BOTH_OPTIMIZERS
def test_add_param_group_with_invalid_value_raises_and_keeps_no_group(cls: type) -> None:
    opt = cls([torch.nn.Parameter(torch.ones(2))])
    extra = torch.nn.Parameter(torch.ones(3))
    with pytest.raises(ValueError, match=f"{cls.__name__} param group 1: invalid lr"):
        opt.add_param_group({"params": [extra], "lr": -1.0})
    assert len(opt.param_groups) == 1
    opt.add_param_group({"params": [extra]})  # the parameter was not left registered by the failed call
    assert len(opt.param_groups) == 2


@BOTH_OPTIMIZERS
@BOTH_PATHS
def test_complex_parameters_update_as_their_real_view(cls: type, foreach: bool) -> None:
    """As torch's Adam: a complex tensor is optimised as its real view (real and imaginary parts are two
    coordinates), so the result equals that of the same optimizer on ``torch.view_as_real`` copies."""
    gen = torch.Generator().manual_seed(0)
    shapes = [(6, 4, 2), (5, 2), (3, 2)]  # the last dim holds (real, imaginary)
    real = [torch.nn.Parameter(torch.randn(s, dtype=torch.float64, generator=gen)) for s in shapes]
    cplx = [torch.nn.Parameter(torch.view_as_complex(p.detach().clone())) for p in real]
    cplx[1] = torch.nn.Parameter(cplx[1].real.clone())  # a real tensor in the same group as complex ones

    def groups(ps: list) -> list[dict]:
        return [{"params": ps[:2], "weight_decay": 1e-2}, {"params": ps[2:], "lars_exclude": True}]

    opt_real = cls(groups(real), lr=0.05, foreach=foreach)
    opt_cplx = cls(groups(cplx), lr=0.05, foreach=foreach)
    for _ in range(5):
        for r, c in zip(real, cplx):
            r.grad = torch.randn(r.shape, dtype=torch.float64, generator=gen)
            c.grad = torch.view_as_complex(r.grad.clone()) if c.is_complex() else r.grad[..., 0].clone()
        real[1].grad[..., 1] = 0.0  # the real tensor's stand-in has no imaginary part
        with torch.no_grad():
            real[1][..., 1] = 0.0
        opt_real.step()
        opt_cplx.step()
    for r, c in zip(real, cplx):
        got = torch.view_as_real(c.detach()) if c.is_complex() else c.detach()
        want = r.detach() if c.is_complex() else r.detach()[..., 0]
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


@BOTH_OPTIMIZERS
@BOTH_PATHS
def test_compiled_step_does_not_recompile_as_steps_go_by(cls: type, foreach: bool) -> None:
    """Dynamo guards on Python numbers read in step() (a Python-int step count recompiled every step
    until the recompile limit, then ran eagerly). After the first two steps (state creation) the graphs
    are reused. The eager backend keeps this to a second: the guards are dynamo's, not the compiler's."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    params = _random_params()
    opt = cls(_groups(params), lr=0.01, foreach=foreach)
    step = torch.compile(opt.step, backend="eager")
    graphs = []
    for _ in range(6):
        for p in params:
            p.grad = torch.randn_like(p)
        step()
        graphs.append(counters["stats"]["unique_graphs"])
    torch._dynamo.reset()
    assert graphs[1] > 0 and graphs[2:] == [graphs[1]] * 4, graphs


# ---- timm's argument names (largebatch.optim.timm_names): accepted where the meaning is ours, else refused


def test_lars_takes_timms_trust_coeff_as_trust_coefficient() -> None:
    ours = _train(lambda g: LARS(g, lr=0.1, trust_coefficient=0.02))
    timm_spelling = _train(lambda g: LARS(g, lr=0.1, trust_coeff=0.02, always_adapt=True, dampening=0))
    for a, b in zip(ours, timm_spelling):
        assert torch.equal(a, b)
    opt = LARS([{"params": [torch.nn.Parameter(torch.ones(2))], "trust_coeff": 0.05}])
    assert opt.param_groups[0]["trust_coefficient"] == 0.05 and "trust_coeff" not in opt.param_groups[0]


def test_both_spellings_of_one_option_raise() -> None:
    p = torch.nn.Parameter(torch.ones(2))
    both = r"^LARS: pass trust_coefficient or timm's name for it, trust_coeff, not both$"
    with pytest.raises(ValueError, match=both):
        LARS([p], trust_coefficient=0.01, trust_coeff=0.01)
    with pytest.raises(ValueError, match="LARS param group 0: pass trust_coefficient or .*trust_coeff, not both"):
        LARS([{"params": [p], "trust_coefficient": 0.01, "trust_coeff": 0.02}])


@BOTH_OPTIMIZERS
def test_always_adapt_true_is_ours_and_false_is_refused_naming_lars_exclude(cls: type) -> None:
    p = torch.nn.Parameter(torch.ones(2))
    opt = cls([{"params": [p], "always_adapt": True}], always_adapt=True)
    assert "always_adapt" not in opt.param_groups[0] and "always_adapt" not in opt.defaults
    refused = f"{cls.__name__}: timm's always_adapt=False is not supported: .*lars_exclude=True"
    with pytest.raises(ValueError, match=refused):
        cls([p], always_adapt=False)
    with pytest.raises(ValueError, match=f"{cls.__name__} param group 1: timm's always_adapt=False"):
        cls([{"params": [p]}, {"params": [torch.nn.Parameter(torch.ones(1))], "always_adapt": False}])


@pytest.mark.parametrize(
    "cls, kwargs, message",
    [
        (LAMB, {"max_grad_norm": 1.0}, r"max_grad_norm=1\.0 is not supported: LAMB does not clip .*clip_grad_norm_"),
        (LAMB, {"bias_correction": False}, "bias_correction=False is not supported: LAMB always bias-corrects"),
        (LARS, {"dampening": 0.1}, r"dampening=0\.1 is not supported: LARS has no momentum dampening"),
    ],
)
def test_timm_options_we_do_not_implement_are_refused(cls: type, kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        cls([torch.nn.Parameter(torch.ones(2))], **kwargs)


def test_timm_values_that_describe_ours_are_accepted() -> None:
    p = torch.nn.Parameter(torch.ones(2))
    LAMB([p], max_grad_norm=None, bias_correction=True, trust_clip=True)
    LARS([p], dampening=0)


@BOTH_OPTIMIZERS
def test_unknown_keyword_is_a_type_error(cls: type) -> None:
    with pytest.raises(TypeError, match=f"{cls.__name__} got unexpected keyword argument.*'caution'"):
        cls([torch.nn.Parameter(torch.ones(2))], caution=True)
