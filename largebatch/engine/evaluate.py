"""Exact distributed evaluation: every validation image counted exactly once.

Each rank evaluates a disjoint shard (``ExactShardSampler``: no padding duplicates; a rank
may have no images at all). Correct counts and totals are summed on the device and
all-reduced once at the end, so top-1/top-5 are those of the whole set at any world size.
A batch may carry a third element, a 0/1 weight per sample, so backends that need static
shapes (XLA) can pad the last batch with samples that are never counted.

The model is evaluated without its DDP (and ``torch.compile``) wrappers: DDP's first forward
after training broadcasts rank 0's buffers, a collective that a rank without a batch never
joins (the ranks' collectives then mismatch: a gloo error, or an NCCL hang until the
timeout). What that broadcast gave, every rank evaluating rank 0's BN statistics, is done
once before the loop by :func:`copy_from_rank0`, on every rank.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from largebatch.engine.compile import unwrap_model

if TYPE_CHECKING:
    from largebatch.backends.base import Backend

__all__ = ["evaluate", "accuracy_counts", "copy_from_rank0"]


@torch.no_grad()
def copy_from_rank0(tensors: Iterable[torch.Tensor], backend: Backend) -> None:
    """Overwrite ``tensors`` on every rank with rank 0's (an all-reduce of rank 0's values and
    zeros, one per dtype: ``x + 0 + ... + 0 == x`` exactly). Every rank calls it with tensors
    of the same shapes and dtypes, in the same order."""
    if backend.world_size == 1:
        return
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for t in tensors:
        by_dtype.setdefault(t.dtype, []).append(t)
    for group in by_dtype.values():
        flat = torch.cat([t.reshape(-1) for t in group])
        if not backend.is_main:
            flat.zero_()
        flat = backend.all_reduce_sum(flat)
        offset = 0
        for t in group:
            t.copy_(flat[offset: offset + t.numel()].view_as(t))
            offset += t.numel()


def _broadcasts_buffers(model: nn.Module) -> bool:
    """True when a DDP wrapper in ``model`` gives every rank rank 0's buffers at its forwards."""
    while True:
        if isinstance(model, nn.parallel.DistributedDataParallel):
            return bool(model.broadcast_buffers)
        inner = getattr(model, "_orig_mod", None)  # torch.compile's OptimizedModule
        if not isinstance(inner, nn.Module):
            return False
        model = inner


def accuracy_counts(
    logits: torch.Tensor, labels: torch.Tensor, weight: Optional[torch.Tensor] = None, topk: tuple[int, ...] = (1, 5)
) -> torch.Tensor:
    """Per-k counts of correct predictions (weighted), as one float64 tensor of len(topk)."""
    k_max = min(max(topk), logits.shape[1])
    pred = logits.topk(k_max, dim=1).indices  # (N, k_max)
    hit = pred.eq(labels.view(-1, 1))
    w = torch.ones_like(labels, dtype=torch.float64) if weight is None else weight.to(torch.float64)
    return torch.stack([(hit[:, : min(k, k_max)].any(dim=1).to(torch.float64) * w).sum() for k in topk])


@torch.no_grad()
def evaluate(
    model: nn.Module,
    loader: Iterable,
    *,
    backend: Backend,
    autocast_dtype: Optional[torch.dtype] = None,
    channels_last: bool = False,
) -> dict[str, float]:
    """Top-1, top-5, mean loss and the exact image count over all ranks.

    ``model`` may be wrapped in DDP and ``torch.compile``: the plain module inside is evaluated
    (the module docstring says why), with rank 0's buffers where DDP broadcasts them. Every
    rank calls it, also one whose part of ``loader`` is empty.
    """
    if _broadcasts_buffers(model):
        copy_from_rank0(unwrap_model(model).buffers(), backend)
    model = unwrap_model(model)
    was_training = model.training
    model.eval()
    # [correct@1, correct@5, loss sum, count]; float64 keeps counts exact past 2**24.
    sums = torch.zeros(4, dtype=torch.float64, device=backend.device)
    for batch in loader:
        images, labels = batch[0], batch[1]
        weight = batch[2] if len(batch) > 2 else None
        with backend.autocast(autocast_dtype):
            logits = model(images)
        logits = logits.float()
        loss = F.cross_entropy(logits, labels, reduction="none")
        w = torch.ones_like(loss) if weight is None else weight.to(loss.dtype)
        sums[:2] += accuracy_counts(logits, labels, w)
        sums[2] += (loss * w).sum().to(torch.float64)
        sums[3] += w.sum().to(torch.float64)
        backend.mark_step()
    sums = backend.all_reduce_sum(sums)
    correct1, correct5, loss_sum, total = sums.tolist()
    model.train(was_training)
    total_i = int(round(total))
    return {
        "top1": 100.0 * correct1 / max(total, 1.0),
        "top5": 100.0 * correct5 / max(total, 1.0),
        "loss": loss_sum / max(total, 1.0),
        "correct1": int(round(correct1)),
        "correct5": int(round(correct5)),
        "total": total_i,
    }
