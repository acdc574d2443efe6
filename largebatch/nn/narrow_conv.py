"""Workaround for NaN weight gradients of oneDNN bf16 convolutions narrower than their stride.

On CPUs, a bf16 ``conv2d`` whose input is narrower than its stride (stride_w > input width,
e.g. a 3x3 stride-2 convolution on a 1x1 feature map) sometimes returns a weight gradient
with NaN at the kernel taps that see only zero padding; the forward output and the input
gradient are finite, fp32 never does it, nor bf16 with oneDNN disabled. Which steps fail
changes from run to run for the same seed (it looks like a read of uninitialised memory),
and after one failure freed NaN memory makes later steps in the process fail more often.
``benchmarks/onednn_bf16_narrow_conv_nan.py`` reproduces it with plain torch (measured
there: 8-32 of 40 backward passes with NaN, torch 2.14.1 / oneDNN v3.12.0, AVX512-BF16).

In our runs it is the tiny-image case: resnet10t on 16 px images gives layer4.0.conv1
(3x3, stride 2) a 1x1 input, and the run stops with "parameter/buffer tensor(s) are not
finite ... although the loss was checked" after a few steps, with bf16 only.

:func:`convert_narrow_input_convs` makes such convolutions run in fp32, and only when the
call would hit the bug: CPU autocast to bf16, gradients enabled, and an input side smaller
than the stride (measured: the width triggers it; a narrow height alone did not, but it
is included, as the fp32 fallback costs nothing on maps this small). Every other call,
and every convolution of a real-sized image, runs unchanged in bf16.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["NarrowInputConv2d", "convert_narrow_input_convs", "needs_fp32_conv"]


def needs_fp32_conv(x: torch.Tensor, stride: tuple[int, ...]) -> bool:
    """True when a CPU bf16-autocast conv2d of ``x`` would hit the oneDNN NaN gradient bug.

    Host-side checks only (shapes, autocast state): no device read.
    """
    return (
        x.device.type == "cpu"
        and torch.is_grad_enabled()
        and torch.is_autocast_enabled("cpu")
        and torch.get_autocast_dtype("cpu") == torch.bfloat16
        and any(size < s for size, s in zip(x.shape[-2:], stride))
    )


class NarrowInputConv2d(nn.Conv2d):
    """``nn.Conv2d`` that computes in fp32 where oneDNN's bf16 weight gradient is unsafe.

    The output keeps the dtype the bf16 convolution would have returned (bfloat16), so the
    layers after it see the same dtypes as before.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not needs_fp32_conv(x, self.stride):
            return super().forward(x)
        with torch.autocast("cpu", enabled=False):
            y = super().forward(x.float())
        return y.to(torch.bfloat16)


def convert_narrow_input_convs(model: nn.Module) -> int:
    """Make every strided ``nn.Conv2d`` of ``model`` a :class:`NarrowInputConv2d`, in place.

    Only the class changes (parameters, state-dict keys and ``isinstance(m, nn.Conv2d)``
    stay). Subclasses of ``nn.Conv2d`` with their own forward are left alone. Returns how
    many modules were converted.
    """
    count = 0
    for module in model.modules():
        if type(module) is nn.Conv2d and any(s > 1 for s in module.stride):
            module.__class__ = NarrowInputConv2d
            count += 1
    return count
