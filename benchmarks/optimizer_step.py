"""Optimizer step time on ResNet-50's parameters: our LARS/LAMB against timm and the torch floors.

Builds the 161 parameter tensors of timm ``resnet50`` (25.6 M parameters) with random gradients, split by
``largebatch.optim.param_groups`` (BN/bias excluded), and times ``step()`` of every optimizer with
``foreach`` on and off (and torch's ``fused`` SGD and AdamW on CUDA), round-robin in one run so that a noisy
machine slows every entry alike and each optimizer's peer is measured beside it. Prints one table and
the ratios the optimizers are held to: our LARS (both momentum forms) against the faster ``torch.optim.SGD``
(momentum + weight decay, its fastest path), our LAMB against the fastest ``torch.optim.AdamW``, ours against timm's ``Lars`` / ``Lamb``.

``LAMB e1b6366 layout`` is our LAMB with one bias-correction 0-dim tensor per parameter, the layout of
commit e1b6366 that took its foreach step off torch's multi-tensor path (issue 86: 421 launches a step
instead of 101): LAMB's own per-tensor fallback (the one it takes where a group's step counts differ),
forced for every group as ``tests/test_foreach_launches.py`` forces it, so the old and new layouts are
timed in one run.

Run:
    python benchmarks/optimizer_step.py                  # CPU
    python benchmarks/optimizer_step.py --device cuda    # synchronises around every timed step
"""

from __future__ import annotations

import argparse
import inspect
import statistics
import time
from typing import Callable

import timm
import timm.optim
import torch

from largebatch.optim import LAMB, LARS, param_groups

def _foreach(cls: type, foreach: bool) -> dict[str, bool]:
    """``{'foreach': foreach}`` where the optimizer takes it (timm before 1.0.30 has none)."""
    return {"foreach": foreach} if "foreach" in inspect.signature(cls).parameters else {}


def lamb_e1b6366_layout(groups: list[dict], foreach: bool) -> LAMB:
    """Our LAMB on its per-tensor bias corrections for every group: its cohort tracker (which says
    whether a group's step counts are equal) answers no, so each step takes the fallback path."""
    opt = LAMB(groups, lr=1e-3, foreach=foreach)
    opt._cohorts.step = lambda params: False  # type: ignore[method-assign]
    return opt


# name -> (family, factory(groups, foreach)); one hyper-parameter set per family, as in the recipes
CANDIDATES: dict[str, tuple[str, Callable[[list[dict], bool], torch.optim.Optimizer]]] = {
    "torch SGD": ("sgd", lambda g, fe: torch.optim.SGD(g, lr=0.1, momentum=0.9, foreach=fe)),
    "largebatch LARS": ("lars", lambda g, fe: LARS(g, lr=10.0, momentum=0.9, foreach=fe)),
    # the form the paper presets use (lr x trust ratio inside the momentum buffer)
    "LARS lr_in_momentum": (
        "lars", lambda g, fe: LARS(g, lr=10.0, momentum=0.9, lr_in_momentum=True, foreach=fe)
    ),
    "timm Lars": ("lars", lambda g, fe: timm.optim.Lars(g, lr=10.0, momentum=0.9, **_foreach(timm.optim.Lars, fe))),
    "torch AdamW": ("adam", lambda g, fe: torch.optim.AdamW(g, lr=1e-3, foreach=fe)),
    "largebatch LAMB": ("lamb", lambda g, fe: LAMB(g, lr=1e-3, foreach=fe)),
    "LAMB e1b6366 layout": ("lamb", lamb_e1b6366_layout),
    # max_grad_norm=None: timm clips inside Lamb by default, ours does not; compare the same algorithm
    "timm Lamb": ("lamb", lambda g, fe: timm.optim.Lamb(g, lr=1e-3, max_grad_norm=None, **_foreach(timm.optim.Lamb, fe))),
}


# torch's fused kernels (one launch for every tensor), timed beside foreach where the device has them
FUSED: dict[str, Callable[[list[dict]], torch.optim.Optimizer]] = {
    "torch SGD": lambda g: torch.optim.SGD(g, lr=0.1, momentum=0.9, fused=True),
    "torch AdamW": lambda g: torch.optim.AdamW(g, lr=1e-3, fused=True),
}
PATHS = ("foreach", "per-tensor", "fused")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(device: torch.device, rounds: int, warmup: int, model_name: str = "resnet50") -> dict[tuple[str, str], float]:
    """Median step time in ms of every (optimizer, path) pair, measured round-robin in one run:
    path is ``foreach``, ``per-tensor`` or (torch SGD and AdamW on CUDA) ``fused``."""
    model = timm.create_model(model_name).to(device)
    params = list(model.parameters())
    gen = torch.Generator(device="cpu").manual_seed(0)
    for p in params:
        p.grad = (torch.randn(p.shape, generator=gen) * 1e-2).to(device)
    weight_decay = {"sgd": 5e-5, "lars": 5e-5, "adam": 0.01, "lamb": 0.01}
    optimizers: dict[tuple[str, str], torch.optim.Optimizer] = {}
    for name, (family, build) in CANDIDATES.items():
        for foreach in (True, False):
            groups = param_groups(model, weight_decay[family])
            optimizers[(name, "foreach" if foreach else "per-tensor")] = build(groups, foreach)
        if device.type == "cuda" and name in FUSED:
            optimizers[(name, "fused")] = FUSED[name](param_groups(model, weight_decay[family]))
    times: dict[tuple[str, str], list[float]] = {key: [] for key in optimizers}
    for r in range(warmup + rounds):
        for key, opt in optimizers.items():
            _sync(device)
            start = time.perf_counter()
            opt.step()
            _sync(device)
            if r >= warmup:
                times[key].append(time.perf_counter() - start)
    return {key: statistics.median(ts) * 1e3 for key, ts in times.items()}


def report(ms: dict[tuple[str, str], float], device: torch.device, n_tensors: int, n_params: int,
           model_name: str = "resnet50") -> None:
    """One markdown table (a column per path) and the ratios the optimizers are held to."""
    print(
        f"optimizer step, timm {model_name} ({n_tensors} tensors, {n_params / 1e6:.2f} M params), "
        f"device={device}, torch {torch.__version__}, timm {timm.__version__}, threads={torch.get_num_threads()}"
    )
    default_path = "per-tensor" if device.type == "cpu" else "foreach"  # what foreach=None picks here
    print("\n| optimizer step (median ms) | foreach | per-tensor | fused |\n|---|---:|---:|---:|")
    for name in CANDIDATES:
        cells = [f"{ms[(name, path)]:.2f}" if (name, path) in ms else "-" for path in PATHS]
        print(f"| {name} | " + " | ".join(cells) + " |")

    def best(name: str) -> float:
        return min(v for (n, _), v in ms.items() if n == name)

    def ours(name: str) -> float:
        return ms[(name, default_path)]

    print(f"\nratios (ours = the {default_path} path foreach=None picks here; torch and timm = their fastest path):")
    for mine, other, target in (
        ("largebatch LARS", "torch SGD", 1.3),
        ("LARS lr_in_momentum", "torch SGD", 1.3),
        ("largebatch LAMB", "torch AdamW", 1.3),
        ("largebatch LARS", "timm Lars", 1.0),
        ("largebatch LAMB", "timm Lamb", 1.0),
        ("largebatch LAMB", "LAMB e1b6366 layout", 1.0),
    ):
        ratio = ours(mine) / best(other)
        verdict = "ok" if ratio <= target else "OVER"
        print(f"  {mine:<19} / {other:<19} = {ratio:5.2f}x   (target <= {target:.1f}x: {verdict})")


def argument_parser() -> argparse.ArgumentParser:
    """The command line (tests/test_gpu_campaign.py parses the GPU campaign's command line with it)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")
    parser.add_argument("--rounds", type=int, default=None, help="timed rounds (default: 30 CPU, 200 CUDA)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed rounds first (default: 3)")
    parser.add_argument("--model", default="resnet50", help="timm model whose parameters step (default: resnet50)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = argument_parser().parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    rounds = args.rounds or (30 if device.type == "cpu" else 200)
    model = timm.create_model(args.model)
    n_tensors = sum(1 for _ in model.parameters())
    n_params = sum(p.numel() for p in model.parameters())
    del model
    ms = measure(device, rounds, args.warmup, args.model)
    report(ms, device, n_tensors, n_params, args.model)


if __name__ == "__main__":
    main()
