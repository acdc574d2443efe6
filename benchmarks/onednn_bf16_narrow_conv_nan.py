"""Standalone repro (plain torch): NaN weight gradients from oneDNN's bf16 convolution when
the input is narrower than the stride.

    OMP_NUM_THREADS=2 python benchmarks/onednn_bf16_narrow_conv_nan.py [--trials 40]

On a CPU with native bf16 (AVX512-BF16), ``conv2d`` in bf16 (autocast or bf16 tensors) with
stride_w > input width returns a weight gradient that sometimes holds NaN, at kernel taps
that only ever see zero padding (their true gradient is exactly 0). The forward output and
the input gradient are finite; fp32, or bf16 with ``torch.backends.mkldnn`` disabled, never
do it. Which calls fail changes from call to call for the same inputs (it depends on what
the allocator hands back), as if the backward-weights kernel read uninitialised memory for
the padded columns. Once NaN-holding memory has been freed (a failed step's weights), later
calls fail more often, so one bad step in a process makes the next runs in it fail too.

In largebatch this is the "parameter/buffer tensor(s) are not finite ... although the loss
was checked" stop of tiny CPU runs: resnet10t on 16 px images reaches layer4.0.conv1
(3x3, stride 2, pad 1) with a 1x1 feature map. largebatch avoids it with
``largebatch.nn.narrow_conv`` (such a convolution runs in fp32).

Measured (torch 2.14.1, oneDNN v3.12.0, AVX512-BF16 CPU, OMP_NUM_THREADS=2, N=8,
C=K=64; NaN weight grads / trials; the bf16 rate varies from run to run, 8-28 of 40 for
1x1)::

     input stride  k/pad             bf16             fp32  bf16-mkldnn-off
    1x1         2 3/1             8/40             0/40             0/40
    2x2         2 3/1             0/40             0/40             0/40   (width == stride)
    2x2         3 3/1             3/40             0/40             0/40
    4x1         2 3/1            32/40             0/40             0/40   (narrow width)
    1x4         2 3/1             0/40             0/40             0/40   (narrow height)
    1x1         2 5/2            14/40             0/40             0/40

No exact upstream report was found; related oneDNN edge-case reports: pytorch/pytorch#25101
(mkldnn conv gradients wrong with stride 3), #68868 (mkldnn weight gradient wrong with
stride larger than the input), fujitsu/oneDNN#43 (stride_w > 1 with a narrow input).
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

CASES = [  # (H, W, stride, kernel, padding)
    (1, 1, 2, 3, 1),
    (2, 2, 2, 3, 1),
    (2, 2, 3, 3, 1),
    (4, 1, 2, 3, 1),
    (1, 4, 2, 3, 1),
    (1, 1, 2, 5, 2),
]


def nan_weight_grads(h: int, w: int, stride: int, k: int, pad: int, *, mode: str, trials: int,
                     channels: int = 64, batch: int = 8) -> int:
    """How many of ``trials`` backward passes gave a non-finite weight gradient."""
    bad = 0
    for _ in range(trials):
        x = torch.randn(batch, channels, h, w, requires_grad=True)
        weight = torch.randn(channels, channels, k, k, requires_grad=True)
        with torch.backends.mkldnn.flags(enabled=mode != "bf16-mkldnn-off"):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=mode != "fp32"):
                y = F.conv2d(x, weight, stride=stride, padding=pad)
            y.float().sum().backward()
        bad += not bool(torch.isfinite(weight.grad).all())
    return bad


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=40)
    args = parser.parse_args()
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, "
          f"native bf16 {torch.ops.mkldnn._is_mkldnn_bf16_supported()}")
    modes = ("bf16", "fp32", "bf16-mkldnn-off")
    print(f"{'input':>6} {'stride':>6} {'k/pad':>6} " + " ".join(f"{m:>16}" for m in modes))
    for h, w, stride, k, pad in CASES:
        counts = [nan_weight_grads(h, w, stride, k, pad, mode=m, trials=args.trials) for m in modes]
        print(f"{h}x{w:<4} {stride:>6} {k}/{pad:<4} " + " ".join(f"{c:>10}/{args.trials:<5}" for c in counts),
              flush=True)


if __name__ == "__main__":
    main()
