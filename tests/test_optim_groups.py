"""param_groups: the BN/bias split on a timm ResNet, no_weight_decay() names, frozen and shared params."""

from __future__ import annotations

import pytest
import timm
import torch
from torch import nn

from largebatch.optim import param_groups


@pytest.fixture(scope="module")
def resnet() -> nn.Module:
    return timm.create_model("resnet18", num_classes=10)


def test_resnet_split_every_param_once_bn_and_bias_excluded(resnet: nn.Module) -> None:
    groups = param_groups(resnet, weight_decay=5e-5)
    assert [(g["weight_decay"], g["lars_exclude"]) for g in groups] == [(5e-5, False), (0.0, True)]
    grouped = [id(p) for g in groups for p in g["params"]]
    assert len(grouped) == len(set(grouped)), "a parameter is in two groups"
    assert set(grouped) == {id(p) for p in resnet.parameters()}, "a parameter was dropped"

    names = {id(p): n for n, p in resnet.named_parameters()}
    decayed = {names[id(p)] for p in groups[0]["params"]}
    excluded = {names[id(p)] for p in groups[1]["params"]}
    bn_params = {
        f"{m_name}.{p_name}"
        for m_name, m in resnet.named_modules()
        if isinstance(m, nn.BatchNorm2d)
        for p_name, _ in m.named_parameters(recurse=False)
    }
    assert bn_params and bn_params <= excluded
    assert "fc.bias" in excluded and "fc.weight" in decayed
    assert decayed == {n for n, p in resnet.named_parameters() if p.ndim > 1}
    assert len(decayed) == 21 and len(excluded) == 41  # 20 convs + fc; 20 BNs x 2 + fc.bias


def test_decay_bias_excludes_the_bn_parameters_only(resnet: nn.Module) -> None:
    """fast.ai's --no-bn-wd (imagenet18 bnwd_optim_params): BN exempt, the fc bias decayed and adapted."""
    groups = param_groups(resnet, weight_decay=5e-5, decay_bias=True)
    names = {id(p): n for n, p in resnet.named_parameters()}
    excluded = {names[id(p)] for p in groups[1]["params"]}
    assert excluded == {f"{m}.{p}" for m, mod in resnet.named_modules() if isinstance(mod, nn.BatchNorm2d)
                        for p, _ in mod.named_parameters(recurse=False)}
    assert "fc.bias" in {names[id(p)] for p in groups[0]["params"]} and groups[1]["lars_exclude"]
    assert param_groups(resnet, 5e-5, exclude_bn_bias=False, decay_bias=True)[0]["params"] == list(resnet.parameters())


def test_exclude_bn_bias_false_gives_one_decayed_adapted_group(resnet: nn.Module) -> None:
    groups = param_groups(resnet, weight_decay=1e-4, exclude_bn_bias=False)
    assert len(groups) == 1
    assert groups[0]["weight_decay"] == 1e-4 and groups[0]["lars_exclude"] is False
    assert len(groups[0]["params"]) == len(list(resnet.parameters()))


class _Embed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.pos_embed = nn.Parameter(torch.zeros(1, 4, 8))
        self.proj = nn.Linear(8, 8)

    def no_weight_decay(self) -> set[str]:
        return {"pos_embed"}  # relative to this submodule


class _TinyViT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.cls_token = nn.Parameter(torch.zeros(1, 1, 8))
        self.dist_tokens = nn.Parameter(torch.zeros(2, 1, 8))
        self.embed = _Embed()
        self.norm = nn.LayerNorm(8)
        self.gn = nn.GroupNorm(2, 8)
        self.head = nn.Linear(8, 3)
        self.frozen = nn.Linear(8, 8)
        self.frozen.requires_grad_(False)

    def no_weight_decay(self) -> set[str]:
        return {"cls_token", "dist_*"}  # timm convention, wildcards allowed


def test_no_weight_decay_names_frozen_params_and_norm_layers() -> None:
    model = _TinyViT()
    groups = param_groups(model, weight_decay=0.05)
    names = {id(p): n for n, p in model.named_parameters()}
    decayed = {names[id(p)] for p in groups[0]["params"]}
    excluded = {names[id(p)] for p in groups[1]["params"]}
    assert decayed == {"embed.proj.weight", "head.weight"}
    assert excluded == {
        "cls_token", "dist_tokens", "embed.pos_embed", "embed.proj.bias",
        "norm.weight", "norm.bias", "gn.weight", "gn.bias", "head.bias",
    }  # fmt: skip
    assert not any(n.startswith("frozen") for n in decayed | excluded)


def test_shared_parameter_appears_once_and_empty_groups_are_dropped() -> None:
    a = nn.Linear(4, 4, bias=False)
    model = nn.Sequential(a, nn.ReLU(), a)
    groups = param_groups(model, weight_decay=1e-4)
    assert len(groups) == 1 and len(groups[0]["params"]) == 1 and groups[0]["lars_exclude"] is False


def test_groups_work_with_torch_optimizers(resnet: nn.Module) -> None:
    opt = torch.optim.SGD(param_groups(resnet, weight_decay=1e-4), lr=0.1, momentum=0.9)
    assert [g["weight_decay"] for g in opt.param_groups] == [1e-4, 0.0]


def test_negative_weight_decay_raises(resnet: nn.Module) -> None:
    with pytest.raises(ValueError, match="weight_decay"):
        param_groups(resnet, weight_decay=-1.0)
