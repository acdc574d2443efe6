"""build_optimizer: every registered name builds and steps; bad names and options fail clearly."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from largebatch.optim import LAMB, LARS, OPTIMIZERS, build_optimizer, optimizer_names


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(4 * 6 * 6, 2))


def test_names() -> None:
    assert optimizer_names() == ["lamb", "larc", "lars", "sgd"]
    assert set(OPTIMIZERS) == set(optimizer_names())


@pytest.mark.parametrize(
    "name, cls", [("sgd", torch.optim.SGD), ("lars", LARS), ("larc", LARS), ("lamb", LAMB)]
)
def test_each_name_builds_and_steps(name: str, cls: type) -> None:
    model = _model()
    opt = build_optimizer(name, model, lr=0.1, weight_decay=1e-4)
    assert type(opt) is cls
    assert [(g["weight_decay"], g["lars_exclude"], g["lr"]) for g in opt.param_groups] == [
        (1e-4, False, 0.1), (0.0, True, 0.1)]  # fmt: skip
    before = [p.detach().clone() for p in model.parameters()]
    model(torch.randn(2, 3, 8, 8)).sum().backward()
    opt.step()
    assert all(not torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_variants_are_registry_defaults() -> None:
    model = _model()
    assert build_optimizer("larc", model, lr=1.0, weight_decay=0.0).defaults["trust_clip"] is True
    assert build_optimizer("lars", model, lr=1.0, weight_decay=0.0).defaults["trust_clip"] is False
    assert build_optimizer("sgd", model, lr=1.0, weight_decay=0.0).defaults["momentum"] == 0.9


def test_options_pass_through_and_none_keeps_default() -> None:
    model = _model()
    lars = build_optimizer("lars", model, lr=1.0, weight_decay=1e-4, momentum=0.8, nesterov=True,
                           trust_coefficient=0.02, eps=0.0, foreach=True)  # fmt: skip
    assert {k: lars.defaults[k] for k in ("momentum", "nesterov", "trust_coefficient", "eps", "foreach")} == {
        "momentum": 0.8, "nesterov": True, "trust_coefficient": 0.02, "eps": 0.0, "foreach": True}  # fmt: skip
    lamb = build_optimizer("lamb", model, lr=1e-3, weight_decay=0.01, betas=(0.8, 0.9), eps=None)
    assert lamb.defaults["betas"] == (0.8, 0.9) and lamb.defaults["eps"] == 1e-6
    sgd = build_optimizer("sgd", model, lr=0.1, weight_decay=1e-4, nesterov=True)
    assert sgd.defaults["nesterov"] is True and sgd.defaults["momentum"] == 0.9


def test_exclude_bn_bias_false_and_explicit_groups() -> None:
    model = _model()
    opt = build_optimizer("lars", model, lr=1.0, weight_decay=1e-4, exclude_bn_bias=False)
    assert len(opt.param_groups) == 1 and opt.param_groups[0]["lars_exclude"] is False
    groups = [{"params": [model[0].weight]}, {"params": [model[0].bias], "lars_exclude": True, "weight_decay": 0.0}]
    opt = build_optimizer("lamb", groups, lr=1e-3, weight_decay=0.05)
    assert [(g["weight_decay"], g["lars_exclude"]) for g in opt.param_groups] == [(0.05, False), (0.0, True)]


def test_unknown_name_lists_valid_names() -> None:
    with pytest.raises(ValueError, match=r"unknown optimizer 'adam'; valid names: lamb, larc, lars, sgd"):
        build_optimizer("adam", _model(), lr=0.1, weight_decay=0.0)


@pytest.mark.parametrize(
    "name, option, accepted",
    [
        ("lamb", "momentum", "betas, eps, foreach"),
        ("sgd", "trust_coefficient", "foreach, momentum, nesterov"),
        ("lars", "betas", "eps, foreach, lr_in_momentum, momentum, nesterov, trust_coefficient"),
        ("larc", "trust_clip", "eps, foreach, lr_in_momentum, momentum, nesterov, trust_coefficient"),
    ],
)
def test_wrong_option_names_it_and_the_accepted_ones(name: str, option: str, accepted: str) -> None:
    with pytest.raises(ValueError) as info:
        build_optimizer(name, _model(), lr=0.1, weight_decay=0.0, **{option: 0.9})
    assert str(info.value) == f"optimizer '{name}' does not take option(s) '{option}'; it accepts: {accepted}"


def test_bad_option_value_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="momentum"):
        build_optimizer("lars", _model(), lr=0.1, weight_decay=0.0, momentum=1.5)
