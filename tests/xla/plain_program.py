"""A plain torch-xla program that reuses largebatch: ``python -m tests.xla.plain_program plain OUT_DIR``.

What a user of another project writes (the README's "Reuse in a plain torch-xla program"):
replicas started by ``torch_xla.launch``, no torch.distributed process group, no largebatch
backend or launcher; only the public ``largebatch.nn.convert_group_sync_batchnorm`` (no
reducer argument) and ``largebatch.optim.LARS`` / ``LAMB`` stepped by ``xm.optimizer_step``, batches from ``MpDeviceLoader``.
Started by ``tests/xla/test_plain_program.py`` with ``PJRT_DEVICE=CPU CPU_NUM_DEVICES=4``;
each replica saves what it computed to ``OUT_DIR/plain_<rank>.pt`` and the test compares.

Replicas are threads of one process here: everything random comes from private generators.
"""

from __future__ import annotations

import sys
from typing import Any

import torch
import torch.nn.functional as F
import torch_xla
import torch_xla.core.xla_model as xm
import torch_xla.distributed.parallel_loader as pl
import torch_xla.runtime as xr
from torch import nn

from largebatch.nn import convert_group_sync_batchnorm
from largebatch.optim import LAMB, LARS

BN_GROUP = 2
BN_SHAPE = (3, 5, 4, 4)  # per-replica (N, C, H, W)
STEPS = 3
BATCH = 4  # per replica
CLASSES = 4
OPTIMIZERS = {
    "lars": lambda params: LARS(params, lr=0.5, momentum=0.9, weight_decay=1e-4, trust_coefficient=0.01),
    "lamb": lambda params: LAMB(params, lr=0.01, weight_decay=0.01),
}


def bn_input(rank: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(100 + rank)
    return torch.randn(*BN_SHAPE, generator=g) * (1 + rank) + rank


def small_net() -> nn.Module:
    """conv -> BN -> ReLU -> pool -> linear, the same weights on every replica."""
    model = nn.Sequential(
        nn.Conv2d(3, 6, 3, padding=1, bias=False), nn.BatchNorm2d(6), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(6, CLASSES),
    )
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.rand(p.shape, generator=g) - 0.5)
    return model


def train_batches(rank: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(200 + rank)
    return [
        (torch.randn(BATCH, 3, 8, 8, generator=g), torch.randint(0, CLASSES, (BATCH,), generator=g))
        for _ in range(STEPS)
    ]


def _replica(index: int, out_dir: str) -> None:
    torch.set_num_threads(1)
    device = torch_xla.device()
    rank = xr.global_ordinal()
    out: dict[str, Any] = {"rank": rank, "world_size": xr.world_size()}

    # (a) grouped BN through the public conversion, no reducer given
    bn = convert_group_sync_batchnorm(nn.Sequential(nn.BatchNorm2d(BN_SHAPE[1])), group_size=BN_GROUP)
    bn = bn.to(device)
    y = bn(bn_input(rank).to(device))
    torch_xla.sync(wait=True)  # also a waiting sync goes through the serialised launch
    layer = bn[0]
    out["bn"] = {"type": type(layer).__name__, "y": y.cpu(), "running_mean": layer.running_mean.cpu(),
                 "running_var": layer.running_var.cpu()}

    # (b) a few LARS / LAMB steps in the plain torch-xla loop
    for name, make_optimizer in OPTIMIZERS.items():
        model = convert_group_sync_batchnorm(small_net(), group_size=BN_GROUP).to(device)
        optimizer = make_optimizer(model.parameters())
        for images, labels in pl.MpDeviceLoader(train_batches(rank), device):  # syncs once per batch
            F.cross_entropy(model(images), labels).backward()
            xm.optimizer_step(optimizer)  # mean of the gradients over the replicas, then step
            optimizer.zero_grad(set_to_none=True)
        out[name] = {k: v.cpu() for k, v in model.state_dict().items()}
    torch.save(out, f"{out_dir}/plain_{rank}.pt")


if __name__ == "__main__":
    torch_xla.launch(_replica, args=(sys.argv[2],))  # argv[1]: the scenario name, "plain"
