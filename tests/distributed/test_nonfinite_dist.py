"""non_finite=skip on 2 gloo ranks: a NaN on one rank makes every rank skip that step."""

from __future__ import annotations

import torch
from torch import nn

from tests.distributed.harness import run_ranks


def _skip_run(rank: int, world_size: int, nan_rank: int | None) -> dict:
    from largebatch.backends.torch_dist import TorchDistributedBackend
    from largebatch.engine.loop import StepSettings, Trainer

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                          nn.Flatten(), nn.Linear(4, 3))
    backend = TorchDistributedBackend("cpu")
    ddp = backend.wrap_model(model).model
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0)
    gen = torch.Generator().manual_seed(10 + rank)
    batches = []
    for step in range(4):
        images = torch.randn(4, 3, 8, 8, generator=gen)
        if step == 1 and rank == nan_rank:
            images[0, 0, 0, 0] = float("nan")
        batches.append((images, torch.randint(0, 3, (4,), generator=gen)))
    if nan_rank is None:  # the reference: the step both ranks skip never happens
        del batches[1]
    t = Trainer(model=ddp, optimizer=opt, scheduler=sched, train_loader=batches, backend=backend,
                settings=StepSettings(epochs=1, global_batch_size=8, non_finite="skip", log_every=1))
    t.train()
    params = {k: v.clone() for k, v in model.state_dict().items()}
    return {"skipped": t.state.skipped_steps, "params": params}


def test_nan_on_one_rank_is_skipped_on_all_ranks() -> None:
    skipped = run_ranks(_skip_run, 2, 1, fork=True)
    clean = run_ranks(_skip_run, 2, None, fork=True)
    assert [r["skipped"] for r in skipped] == [1, 1]
    for rank in range(2):
        a, b = skipped[rank]["params"], clean[rank]["params"]
        assert all(torch.equal(a[k], b[k]) for k in a), f"rank {rank} differs from the clean run"
    p0, p1 = skipped[0]["params"], skipped[1]["params"]
    assert all(torch.equal(p0[k], p1[k]) for k in p0 if "running" not in k and "num_batches" not in k)
