"""The CPU backend's workaround for NaN bf16 weight gradients of convolutions narrower than
their stride (oneDNN; ``largebatch.nn.narrow_conv``, repro in
``benchmarks/onednn_bf16_narrow_conv_nan.py``).

Without the workaround, on a CPU with native bf16, about half of the backward passes of a
3x3 stride-2 convolution on a 1x1 map give NaN weight gradients (measured 8-32 of 40), so
30 passes all finite is what the workaround must deliver.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from largebatch.backends.torch_dist import TorchDistributedBackend
from largebatch.nn.narrow_conv import NarrowInputConv2d, convert_narrow_input_convs, needs_fp32_conv


def _tail() -> nn.Module:
    """The end of resnet10t on 16 px images: layer4.0.conv1 (3x3, stride 2) sees a 1x1 map."""
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(64, 128, 3, stride=2, padding=1, bias=False),
        nn.BatchNorm2d(128),
        nn.ReLU(),
        nn.Conv2d(128, 128, 3, stride=1, padding=1, bias=False),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(128, 4),
    )


def test_cpu_backend_bf16_narrow_input_gradients_are_finite():
    model = TorchDistributedBackend("cpu").prepare_model(_tail())
    bad = []
    for i in range(30):
        x = torch.randn(8, 64, 1, 1)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(x)
        nn.functional.cross_entropy(logits.float(), torch.arange(8) % 4).backward()
        bad += [(i, n) for n, p in model.named_parameters() if not torch.isfinite(p.grad).all()]
        model.zero_grad(set_to_none=True)
    assert bad == [], f"non-finite gradients (pass, parameter): {bad[:5]}"


def test_fallback_gradients_match_fp32():
    torch.manual_seed(0)
    ref = nn.Conv2d(64, 128, 3, stride=2, padding=1, bias=False)
    conv = copy.deepcopy(ref)
    assert convert_narrow_input_convs(conv) == 1
    x = torch.randn(8, 64, 1, 1)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        conv(x).float().sum().backward()
    ref(x).sum().backward()
    torch.testing.assert_close(conv.weight.grad, ref.weight.grad)
    # Only the centre tap sees the 1x1 input; the padding taps' gradient is exactly 0.
    assert conv.weight.grad[:, :, [0, 0, 0, 1, 1, 2, 2, 2], [0, 1, 2, 0, 2, 0, 1, 2]].abs().max() == 0


def test_only_narrow_bf16_calls_take_the_fallback():
    conv = nn.Conv2d(8, 8, 3, stride=2, padding=1)
    convert_narrow_input_convs(conv)
    assert isinstance(conv, NarrowInputConv2d) and isinstance(conv, nn.Conv2d)
    narrow, wide = torch.randn(2, 8, 1, 1), torch.randn(2, 8, 4, 4)
    assert not needs_fp32_conv(narrow, conv.stride)  # no autocast: fp32 anyway
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert needs_fp32_conv(narrow, conv.stride)
        assert needs_fp32_conv(torch.randn(2, 8, 4, 1), conv.stride)
        assert not needs_fp32_conv(wide, conv.stride)
        with torch.no_grad():  # no weight gradient, no bug: evaluation stays bf16
            assert not needs_fp32_conv(narrow, conv.stride)
        assert conv(narrow).dtype == torch.bfloat16  # same dtype as the bf16 conv gives
        assert conv(wide).dtype == torch.bfloat16


def test_conversion_keeps_state_dict_and_skips_unstrided():
    model = _tail()
    keys = list(model.state_dict())
    assert convert_narrow_input_convs(model) == 1  # only the strided conv
    assert type(model[3]) is nn.Conv2d
    assert list(model.state_dict()) == keys
