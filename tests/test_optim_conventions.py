"""torch.optim's conventions, held by LARS and LAMB alike: a rejected param group is not kept,
complex parameters are optimised as their real view (as torch's Adam does), and a compiled
``step()`` compiles once (no Python number in the step that dynamo would guard on)."""

from __future__ import annotations

import pytest
import torch

from largebatch.optim import LAMB, LARS
from tests.test_optim_lars import BOTH_PATHS, _groups, _random_params

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
