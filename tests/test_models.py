"""Model construction and the zero-init of each residual block's last BN gamma."""

from __future__ import annotations

import pytest
import torch

from largebatch.models import ModelError, build_model, init_classifier, zero_init_last_bn


def test_resnet_last_bn_gamma_zeroed_or_not() -> None:
    m = build_model("resnet10t", 5, zero_init_last_bn_gamma=True)
    assert torch.count_nonzero(m.layer1[0].bn2.weight) == 0
    assert torch.count_nonzero(m.layer1[0].bn1.weight) > 0
    m = build_model("resnet10t", 5, zero_init_last_bn_gamma=False)
    assert torch.count_nonzero(m.layer1[0].bn2.weight) > 0


def test_efficientnet_residual_blocks_zeroed() -> None:
    m = build_model("efficientnet_b0", 5, zero_init_last_bn_gamma=False)
    assert zero_init_last_bn(m) > 5
    skip_blocks = [b for b in m.modules() if getattr(b, "has_skip", False)]
    for b in skip_blocks:
        bn = getattr(b, "bn3", None) or b.bn2
        assert torch.count_nonzero(bn.weight) == 0


def test_unknown_model_is_a_clear_error() -> None:
    with pytest.raises(ModelError, match="resnet"):
        build_model("resnet51x", 10)


def test_fc_init_std_draws_the_classifier_weights_only() -> None:
    torch.manual_seed(0)
    default = build_model("resnet18", 10, zero_init_last_bn_gamma=False)
    torch.manual_seed(0)
    drawn = build_model("resnet18", 10, zero_init_last_bn_gamma=False, fc_init_std=0.01)
    assert float(drawn.fc.weight.detach().std()) == pytest.approx(0.01, rel=0.1)
    assert torch.equal(drawn.fc.bias, default.fc.bias) and torch.equal(drawn.conv1.weight, default.conv1.weight)
    with pytest.raises(ModelError, match="fc_init_std"):
        init_classifier(torch.nn.Conv2d(1, 1, 1), 0.01)
