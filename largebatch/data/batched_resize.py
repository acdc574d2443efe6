"""Crop, resize and flip a batch of images of different sizes in a few kernels.

An antialiased bilinear resize is separable and linear: ``out = Wy @ image @ Wx^T`` per
channel, where row ``i`` of ``Wx`` holds the weights of the input columns that output column
``i`` reads. :func:`resize_weights` builds those rows with PIL's rule, the one
``F.interpolate(mode="bilinear", antialias=True, align_corners=False)`` follows (triangle
filter stretched by the scale when shrinking, normalised to sum 1). A crop is a resize whose
weights read only the crop's pixels, an evaluation resize-then-centre-crop a resize whose
rows start at the crop's offset, a horizontal flip the rows of ``Wx`` in reverse order; so a
whole group of images, zero-padded to one size, is cut, resized and flipped by two batched
matrix multiplies whatever each image's geometry.

The result equals the per-image ``F.interpolate`` path up to float rounding (the weights are
the same float32 numbers, summed in another order): tests/test_batched_resize.py holds it
within 0.001 on the 0..255 scale on the CPU (the largest seen is 8e-5). On a CUDA device
the matrix multiplies run at the process's float32 matmul precision (TF32 if ``torch.backends.cuda.matmul.allow_tf32``).
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import torch

__all__ = ["AxisPlan", "group_by_area", "resize_weights", "resize_group"]


class AxisPlan(NamedTuple):
    """One sample's geometry along one axis.

    Output pixel ``i`` (``0 <= i < out``) is pixel ``i + offset`` of the input span
    ``[start, start + length)`` resized to ``virtual`` pixels; ``flip`` reverses the output.
    A training crop: ``offset=0, virtual=out``; an evaluation crop: ``start=0, length=`` the
    image side, ``virtual=`` the resized side, ``offset=`` the centre crop's offset.
    """

    start: int
    length: int
    virtual: int
    offset: int = 0
    flip: bool = False


def resize_weights(plans: torch.Tensor, out: int, padded: int) -> torch.Tensor:
    """``(G, out, padded)`` float32 weights on ``plans.device`` from ``plans`` ``(G, 4)`` =
    (length, virtual, offset, flip) per sample, in the coordinates of the span (pixel 0 is
    the span's first); columns past ``length`` get weight 0."""
    length, virtual, offset, flip = (plans[:, k, None, None].to(torch.float32) for k in range(4))
    i = torch.arange(out, device=plans.device, dtype=torch.float32).view(1, -1, 1)
    i = torch.where(flip > 0, out - 1 - i, i) + offset
    scale = length / virtual
    support = torch.where(scale >= 1, scale, torch.ones_like(scale))  # interp_size / 2 * scale
    invscale = torch.where(scale >= 1, 1 / scale, torch.ones_like(scale))
    centre = scale * (i + 0.5)
    lo = torch.clamp(torch.floor(centre - support + 0.5), min=0)
    hi = torch.minimum(torch.floor(centre + support + 0.5), length)
    j = torch.arange(padded, device=plans.device, dtype=torch.float32).view(1, 1, -1)
    w = torch.clamp(1 - ((j - centre + 0.5) * invscale).abs(), min=0) * ((j >= lo) & (j < hi))
    return w / w.sum(-1, keepdim=True)


def group_by_area(sizes: Sequence[tuple[int, int]], max_pixels: int) -> list[list[int]]:
    """Sample positions split into groups padded to one size each: sorted by area, a group
    closes before its padded size ``len * max_h * max_w`` would pass ``max_pixels``."""
    order = sorted(range(len(sizes)), key=lambda k: (sizes[k][0] * sizes[k][1], k))
    groups: list[list[int]] = []
    h = w = 0
    for k in order:
        nh, nw = max(h, sizes[k][0]), max(w, sizes[k][1])
        if groups and (len(groups[-1]) + 1) * nh * nw <= max_pixels:
            groups[-1].append(k)
            h, w = nh, nw
        else:
            groups.append([k])
            h, w = sizes[k]
    return groups


def resize_group(spans: Sequence[torch.Tensor], rows: Sequence[AxisPlan], cols: Sequence[AxisPlan],
                 out: int) -> torch.Tensor:
    """Resize each uint8/float ``(3, h, w)`` span (already cut to its crop) with its row and
    column plan: float32 ``(G, 3, out, out)`` on the spans' device, 0..255."""
    device = spans[0].device
    ph = max(s.shape[-2] for s in spans)
    pw = max(s.shape[-1] for s in spans)
    padded = torch.zeros(len(spans), 3, ph, pw, dtype=torch.float32, device=device)
    for k, span in enumerate(spans):  # one copy per image: the decoder gives separate tensors
        padded[k, :, : span.shape[-2], : span.shape[-1]] = span
    # the plans are a few ints per sample: one small host-to-device copy, no host read back
    table = torch.tensor([[r.length, r.virtual, r.offset, r.flip, c.length, c.virtual, c.offset, c.flip]
                          for r, c in zip(rows, cols)], dtype=torch.int64)
    if device.type != "cpu":
        table = table.pin_memory()  # gpu-only
    table = table.to(device, non_blocking=True)
    wy = resize_weights(table[:, :4], out, ph)  # (G, out, ph)
    wx = resize_weights(table[:, 4:], out, pw)  # (G, out, pw)
    g = len(spans)
    # columns: (G, 3 * ph, pw) @ (G, pw, out); rows: (G * 3, out, ph) @ (G * 3, ph, out)
    across = torch.bmm(padded.view(g, 3 * ph, pw), wx.transpose(1, 2)).view(g * 3, ph, out)
    down = torch.bmm(wy.repeat_interleave(3, dim=0), across)
    return down.view(g, 3, out, out)
