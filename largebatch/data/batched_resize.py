"""Crop, resize and flip a batch of images of different sizes in a few kernels.

An antialiased bilinear resize is separable and linear: ``out = Wy @ image @ Wx^T`` per
channel, where row ``i`` of ``Wx`` holds the weights of the input columns that output column
``i`` reads. :func:`resize_weights` builds those rows with PIL's rule, the one
``F.interpolate(mode="bilinear", antialias=True, align_corners=False)`` follows (triangle
filter stretched by the scale when shrinking, normalised to sum 1). A crop is a resize whose
weights read only the crop's pixels, an evaluation resize-then-centre-crop a resize whose
rows start at the crop's offset, a horizontal flip the rows of ``Wx`` in reverse order; so a
whole group of images, zero-padded to one size, is cut, resized and flipped by two batched
matrix multiplies whatever each image's geometry. The whole images are padded, not their crops:
a group's padded size is that of its largest height and width, which its largest crops nearly
reach anyway, and no Python-level work is left per image but a view for the one copy.

The result equals the per-image ``F.interpolate`` path up to float rounding (the weights are
the same float32 numbers, summed in another order): tests/test_batched_resize.py holds it
within 0.001 on the 0..255 scale on the CPU (the largest seen is 8e-5). On a CUDA device
the matrix multiplies run at the process's float32 matmul precision (TF32 if ``torch.backends.cuda.matmul.allow_tf32``).
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import torch

__all__ = ["AxisPlan", "group_by_area", "padded_copy", "resize_group", "resize_weights", "to_device"]


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
    """``(G, out, padded)`` float32 weights on ``plans.device`` from ``plans`` ``(G, 5)`` = an
    :class:`AxisPlan` (start, length, virtual, offset, flip) per sample, in the coordinates of the
    image: columns outside ``[start, start + length)`` get weight 0, so the weights cut the crop."""
    start, length, virtual, offset, flip = (plans[:, k, None, None].to(torch.float32) for k in range(5))
    i = torch.arange(out, device=plans.device, dtype=torch.float32).view(1, -1, 1)
    i = torch.where(flip > 0, out - 1 - i, i) + offset
    scale = length / virtual
    support = torch.where(scale >= 1, scale, torch.ones_like(scale))  # interp_size / 2 * scale
    invscale = torch.where(scale >= 1, 1 / scale, torch.ones_like(scale))
    centre = scale * (i + 0.5)
    lo = torch.clamp(torch.floor(centre - support + 0.5), min=0)
    hi = torch.minimum(torch.floor(centre + support + 0.5), length)
    j = torch.arange(padded, device=plans.device, dtype=torch.float32).view(1, 1, -1) - start  # in the crop's
    w = torch.clamp(1 - ((j - centre + 0.5) * invscale).abs(), min=0) * ((j >= lo) & (j < hi))
    return w / w.sum(-1, keepdim=True)


def group_by_area(sizes: Sequence[tuple[int, int]], max_pixels: int) -> list[list[int]]:
    """Sample positions split into groups padded to one size each: sorted by area, a group
    closes before its padded size ``len * max_h * max_w`` would pass ``max_pixels``."""
    order = sorted(range(len(sizes)), key=lambda k: (sizes[k][0] * sizes[k][1], k))
    groups: list[list[int]] = []
    group: list[int] = []
    h = w = 0
    for k in order:
        sh, sw = sizes[k]
        nh, nw = (h if h > sh else sh), (w if w > sw else sw)
        if group and (len(group) + 1) * nh * nw <= max_pixels:
            group.append(k)
            h, w = nh, nw
        else:
            group = [k]
            groups.append(group)
            h, w = sh, sw
    return groups


def to_device(table: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A small host tensor on ``device`` without a host wait: pinned first off the CPU, so the copy
    is asynchronous (from pageable memory it would wait for the device)."""
    if device.type == "cpu":
        return table
    return table.pin_memory().to(device, non_blocking=True)  # gpu-only


def padded_copy(images: Sequence[torch.Tensor], height: int, width: int) -> torch.Tensor:
    """uint8/float ``(3, h, w)`` images zero-padded into one float32 ``(G, 3, height, width)``.

    The decoder gives separate tensors: one ``torch._foreach_copy_`` copies them all (with the
    cast) into views of the padded tensor, not a Python-level copy per image; the views are made
    by ``as_strided`` (half the host time of indexing)."""
    padded = torch.zeros(len(images), 3, height, width, dtype=torch.float32, device=images[0].device)
    stride, per_image = padded.stride()[1:], padded.stride(0)
    views = [padded.as_strided(image.shape, stride, k * per_image) for k, image in enumerate(images)]
    torch._foreach_copy_(views, list(images))
    return padded


def resize_group(images: Sequence[torch.Tensor], wy: torch.Tensor, wx: torch.Tensor) -> torch.Tensor:
    """Cut, resize and flip each uint8/float ``(3, h, w)`` image with its weights ``wy`` ``(G,
    out, >= max h)`` and ``wx`` ``(G, out, >= max w)`` (:func:`resize_weights` on the images'
    device; only the first max h / max w columns are read): float32 ``(G, 3, out, out)``, 0..255."""
    ph = max(image.shape[-2] for image in images)
    pw = max(image.shape[-1] for image in images)
    padded = padded_copy(images, ph, pw)
    g, out = len(images), wy.shape[1]
    wy, wx = wy[..., :ph], wx[..., :pw]
    # columns: (G, 3 * ph, pw) @ (G, pw, out); rows: (G * 3, out, ph) @ (G * 3, ph, out)
    across = torch.bmm(padded.view(g, 3 * ph, pw), wx.transpose(1, 2)).view(g * 3, ph, out)
    down = torch.bmm(wy.repeat_interleave(3, dim=0), across)
    return down.view(g, 3, out, out)
