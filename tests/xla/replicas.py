"""Worker of the multi-replica XLA tests: ``python -m tests.xla.replicas SCENARIO OUT_DIR``.

Started by ``tests/xla/test_replicas.py`` with ``PJRT_DEVICE=CPU CPU_NUM_DEVICES=4``; the
replicas are started by the project's launcher (``largebatch.launch.xla.launch_replicas``),
so they run with the backend's XLA:CPU measures and nothing set up here. Each replica saves
what it computed to ``OUT_DIR/<scenario>_<rank>.pt``; the test compares in its own process.

Replicas are threads of one process here: anything random is drawn from private generators
(the global one is shared), and host-side references are computed by the test, not here.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable

import torch

GROUP_SIZES = (1, 2, 4)
BN_SHAPE = (3, 5, 4, 4)  # per-replica (N, C, H, W)
TRAIN_STEPS = 3
TRAIN_BATCH = 4  # per replica


def bn_inputs(rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Replica ``rank``'s BN input and the upstream gradient of its output."""
    g = torch.Generator().manual_seed(100 + rank)
    x = torch.randn(*BN_SHAPE, generator=g) * (1 + rank) + rank
    dy = torch.randn(*BN_SHAPE, generator=g)
    return x, dy


def bn_parameters() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    return torch.rand(BN_SHAPE[1], generator=g) + 0.5, torch.randn(BN_SHAPE[1], generator=g) * 0.1


def train_batches(rank: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(200 + rank)
    return [
        (torch.randn(TRAIN_BATCH, 3, 16, 16, generator=g), torch.randint(0, 4, (TRAIN_BATCH,), generator=g))
        for _ in range(TRAIN_STEPS)
    ]


def eval_data(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(300)
    return torch.randn(n, 3, 16, 16, generator=g), torch.randint(0, 4, (n,), generator=g)


# ------------------------------------------------------------------------- scenarios
def scenario_sync_bn(backend: Any, out: dict[str, Any]) -> None:
    """GroupSyncBatchNorm forward + backward for each group size."""
    from largebatch.nn import GroupSyncBatchNorm

    x_cpu, dy_cpu = bn_inputs(backend.rank)
    weight, bias = bn_parameters()
    for g in GROUP_SIZES:
        bn = GroupSyncBatchNorm(BN_SHAPE[1], momentum=0.1, reducer=backend.bn_reducer(g))
        with torch.no_grad():
            bn.weight.copy_(weight)
            bn.bias.copy_(bias)
        bn = bn.to(backend.device)
        x = x_cpu.to(backend.device).requires_grad_(True)
        y = bn(x)
        y.backward(dy_cpu.to(backend.device))
        backend.mark_step()
        out[f"g{g}"] = {
            "y": y.detach().cpu(),
            "dx": x.grad.cpu(),
            "dweight": bn.weight.grad.cpu(),
            "dbias": bn.bias.grad.cpu(),
            "running_mean": bn.running_mean.cpu(),
            "running_var": bn.running_var.cpu(),
        }


def scenario_train(backend: Any, out: dict[str, Any]) -> None:
    """Trainer steps of the tiny ResNet with global BN (group 4) and SGD; replicas start
    from different weights, which prepare_model must overwrite with rank 0's."""
    from largebatch.engine.loop import StepSettings, Trainer
    from largebatch.lr import build_lr_scheduler
    from largebatch.nn import convert_group_sync_batchnorm
    from largebatch.optim import build_optimizer
    from tests.xla.common import ListLoader, tiny_resnet

    model = tiny_resnet()
    if backend.rank != 0:  # a replica that drew other initial weights
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.1 * (backend.rank + 1))
    model = backend.prepare_model(model)
    out["start_state"] = {k: v.cpu() for k, v in model.state_dict().items()}
    model = convert_group_sync_batchnorm(model, -1, backend.bn_reducer(-1))
    opt = build_optimizer("sgd", model, lr=0.1, weight_decay=1e-4, momentum=0.9)
    sched = build_lr_scheduler(opt, name="cosine", steps_per_epoch=TRAIN_STEPS, epochs=1, warmup_epochs=0.5)
    trainer = Trainer(
        model=backend.wrap_model(model).model, optimizer=opt, scheduler=sched,
        train_loader=backend.wrap_loader(ListLoader(train_batches(backend.rank))), backend=backend,
        settings=StepSettings(epochs=1, global_batch_size=TRAIN_BATCH * backend.world_size, log_every=TRAIN_STEPS),
    )
    trainer.train()
    out["state"] = {k: v.cpu() for k, v in model.state_dict().items()}


def scenario_collectives(backend: Any, out: dict[str, Any]) -> None:
    """all_reduce_sum, broadcast_object, barrier, and exact evaluation with padded batches."""
    from largebatch.engine.evaluate import evaluate
    from tests.xla.common import exact_eval_loader, tiny_resnet

    r = backend.rank
    out["sum"] = backend.all_reduce_sum(torch.full((3,), float(r + 1)).to(backend.device)).cpu()
    out["object"] = backend.broadcast_object({"rank": r, "text": "x" * (100 * (r + 1))} if r == 0 else None)
    backend.barrier()
    model = backend.prepare_model(tiny_resnet()).eval()
    # Replicas are threads sharing torch's global generator, so the weights each one drew
    # differ run to run; after prepare_model's broadcast all hold rank 0's: saved for the test.
    out["model_state"] = {k: v.cpu() for k, v in model.state_dict().items()}
    for n in (10, 2):  # 10 images: shards 3,3,2,2; 2 images: ranks 2 and 3 own none
        images, labels = eval_data(n)
        loader = backend.wrap_loader(exact_eval_loader(images, labels, rank=r, world_size=backend.world_size, batch_size=2))
        out[f"eval{n}"] = evaluate(model, loader, backend=backend)
        out[f"eval{n}_batches"] = len(loader)


def scenario_ema(backend: Any, out: dict[str, Any]) -> None:
    """Trainer steps with the weight EMA (largebatch.engine.ema) and per-replica BN: the EMA
    before and after ``eval_model()`` (which gives every replica rank 0's)."""
    from largebatch.engine.ema import EmaHook, build_model_ema
    from largebatch.engine.loop import StepSettings, Trainer
    from largebatch.lr import build_lr_scheduler
    from largebatch.optim import build_optimizer
    from tests.xla.common import ListLoader, tiny_resnet

    model = backend.prepare_model(tiny_resnet())  # per-replica BN: statistics differ by replica
    ema = build_model_ema(model, decay=0.5, warmup=True)
    hook = EmaHook(ema)
    opt = build_optimizer("sgd", model, lr=0.1, weight_decay=1e-4, momentum=0.9)
    sched = build_lr_scheduler(opt, name="cosine", steps_per_epoch=TRAIN_STEPS, epochs=1, warmup_epochs=0.5)
    trainer = Trainer(
        model=backend.wrap_model(model).model, optimizer=opt, scheduler=sched,
        train_loader=backend.wrap_loader(ListLoader(train_batches(backend.rank))), backend=backend,
        settings=StepSettings(epochs=1, global_batch_size=TRAIN_BATCH * backend.world_size, log_every=TRAIN_STEPS), hooks=[hook],
    )
    trainer.train()
    backend.mark_step()
    out["model"] = {k: v.cpu() for k, v in model.state_dict().items()}
    out["before"] = {k: v.cpu() for k, v in ema.module.state_dict().items()}
    out["after"] = {k: v.cpu() for k, v in hook.eval_model().state_dict().items()}


NS_MICRO, NS_STEPS = 4, 5  # the noise-scale agreement run: images per replica, steps
NS_COUNTED_MICRO, NS_COUNTED_STEPS = 6, 12  # the counted runs: shapes no other run here uses


def noise_scale_batches(steps: int, micro: int = NS_MICRO) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``2 x steps`` micro-batches of ``micro`` images: micro-batch 2s+r is replica r's batch of step s."""
    g = torch.Generator().manual_seed(3)
    return [(torch.randn(micro, 3, 8, 8, generator=g), torch.randint(0, 3, (micro,), generator=g))
            for _ in range(2 * steps)]


def noise_scale_model() -> torch.nn.Module:
    """A small conv net without BN (the DDP agreement test's); the replicas train rank 0's weights."""
    from torch import nn

    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 3))


def _noise_scale_run(backend: Any, batches: list, *, log_every: int, after_step: Callable[[Any], None]) -> dict:
    """Trainer steps (SGD) with the noise scale wired as run.py does; ``after_step(hook)`` after each."""
    from largebatch.engine.loop import Hook, StepSettings, Trainer
    from largebatch.engine.noise_scale_hook import NoiseScaleHook, plan_noise_scale
    from tests.xla.common import ListLoader

    model = backend.prepare_model(noise_scale_model())
    start = {k: v.cpu() for k, v in model.state_dict().items()}
    wrapped = backend.wrap_model(model, tap_local_norm=True)
    train_model, tap = wrapped.model, wrapped.local_norm_tap
    opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0)
    micro = batches[0][0].shape[0]
    plan = plan_noise_scale(world_size=backend.world_size, accumulation_steps=1, per_device_batch=micro,
                            local_norm_tap=tap)
    hook = NoiseScaleHook(plan, beta=0.5, local_norm_tap=tap)

    class Record(Hook):
        def after_step(self) -> None:
            after_step(hook)

    Trainer(model=train_model, optimizer=opt, scheduler=sched, train_loader=backend.wrap_loader(ListLoader(batches)),
            backend=backend, settings=StepSettings(epochs=1, global_batch_size=micro * backend.world_size,
                                                   log_every=log_every),
            hooks=[hook, Record()]).train()
    return {"plan": plan, "updates": hook.tracker.updates, "start_state": start}


def scenario_noise_scale(backend: Any, out: dict[str, Any]) -> None:
    """The noise scale from the replicas: the averages after each step (read every step); the
    compile count after each step of a run with log steps every 3 steps; the device-to-host
    transfers of this replica's steps 3 to 10 of a run that logs at its end only."""
    import torch_xla.core.xla_model as xm
    import torch_xla.debug.metrics as met

    from tests.xla.common import compile_count

    r, world = backend.rank, backend.world_size
    steps: list[tuple[float, float, float]] = []

    def read(hook: Any) -> None:
        t = hook.tracker
        steps.append((float(t.grad_sq_norm()), float(t.noise_trace()), float(t.noise_scale())))

    out.update(_noise_scale_run(backend, noise_scale_batches(NS_STEPS)[r::world], log_every=NS_STEPS, after_step=read))
    out["steps"] = steps

    counted = noise_scale_batches(NS_COUNTED_STEPS, NS_COUNTED_MICRO)[r::world]
    compiles: list[int] = []

    def wait_for_step() -> None:
        # this replica's step ran, so every replica had launched it (its all-reduce); not
        # backend.synchronize(), which waits for every device, the other replica's next step too
        xm.wait_device_ops([xm.xla_real_devices([backend.device])[0]])

    def count(hook: Any) -> None:
        wait_for_step()
        compiles.append(compile_count())

    wait_for_step()
    out["compiles_before"] = compile_count()
    _noise_scale_run(backend, counted, log_every=3, after_step=count)
    out["compiles"] = compiles

    # No log step between steps 2 and 10: the other replica reads nothing then either (it cannot
    # be a step ahead of this one's all-reduce by more than the device queue, nor behind it).
    transfers: list[int] = []

    def transferred(hook: Any) -> None:
        wait_for_step()  # the other replica is at least at this step
        data = met.metric_data("TransferFromDeviceTime")
        transfers.append(int(data[0]) if data else 0)

    _noise_scale_run(backend, counted, log_every=NS_COUNTED_STEPS, after_step=transferred)
    out["transfers"] = transfers


SCENARIOS: dict[str, Callable[[Any, dict[str, Any]], None]] = {
    "sync_bn": scenario_sync_bn,
    "train": scenario_train,
    "collectives": scenario_collectives,
    "ema": scenario_ema,
    "noise_scale": scenario_noise_scale,
}


def _replica(index: int, names: list[str], out_dir: str) -> None:
    from largebatch.backends import build_backend

    torch.set_num_threads(1)
    backend = build_backend("xla")
    backend.start()
    for name in names:
        out: dict[str, Any] = {"rank": backend.rank, "world_size": backend.world_size}
        SCENARIOS[name](backend, out)
        torch.save(out, Path(out_dir) / f"{name}_{backend.rank}.pt")
    backend.shutdown()


def main(argv: list[str]) -> int:
    from largebatch.launch.xla import launch_replicas

    names, out_dir = argv[0].split(","), argv[1]
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        print(f"unknown scenario(s) {unknown}; known: {sorted(SCENARIOS)}", file=sys.stderr)
        return 2
    launch_replicas(_replica, args=(names, out_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
