"""The data section: the data folder (``data.root``, ``data.synthetic``) and this rank's loaders
(``largebatch.data.build``), from one ``LoaderSpec`` (``data.*``, ``data.resolution``)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, Optional, cast

import torch

from largebatch.engine.batch_plan import BatchPlan, batch_too_large
from largebatch.errors import TooFewSamplesError
from largebatch.resolution import resolution_of

if TYPE_CHECKING:
    from largebatch.backends.base import Backend
    from largebatch.config.schema import TrainConfig
    from largebatch.data.contract import Loader, LoaderSpec

__all__ = ["RunData", "channels_last_of", "data_of", "data_root_of", "loader_spec", "resolution_options"]

log = logging.getLogger("largebatch")


class RunData(NamedTuple):
    """The data folder, this rank's training and evaluation loaders, and the number of classes."""

    root: Path
    train: Loader
    val: Loader
    num_classes: int

    def close(self) -> None:
        """Close both loaders now, not in the garbage collection of the process-group shutdown."""
        for loader in (self.train, self.val):
            loader.close()

    def warn_skipped(self, is_main: bool) -> None:
        """Rank 0: one line counting the unreadable image files the loaders skipped (each named
        in the log as it was skipped)."""
        skipped = self.train.skipped + self.val.skipped
        if skipped and is_main:
            log.warning("%d unreadable image file(s) were skipped (named above in the log)", skipped)


def channels_last_of(cfg: TrainConfig, backend: Backend) -> bool:
    """``model.channels_last``; unset: on CUDA devices (NHWC convolutions use the tensor cores).
    Called once per run; the model, the loaders (``LoaderSpec``) and the hooks get the answer."""
    if cfg.model.channels_last is None:
        return backend.device.type == "cuda"
    return bool(cfg.model.channels_last)


def data_of(cfg: TrainConfig, backend: Backend, plan: BatchPlan, dtype: Optional[torch.dtype],
            channels_last: bool) -> RunData:
    """The data folder and this rank's loaders (``largebatch.data.build``), from one ``LoaderSpec``;
    a data set the batch cannot fill (whole micro-batches, but no optimizer step) is one line in
    terms of ``global_batch_size``."""
    from largebatch.data.build import build_run_loaders

    data = cfg.data
    root = data_root_of(cfg, backend, loader=data.loader)
    device = backend.device
    if device.type == "cuda" and device.index is None:  # DALI's mixed decode needs the GPU's index
        device = torch.device("cuda", backend.local_rank)  # gpu-only
    elif device.type != "cuda":  # pipelines decode on a GPU or on the host (an XLA device: the host)
        device = torch.device("cpu")
    spec = loader_spec(cfg, batch_size=plan.per_device, accumulation_steps=plan.accumulation_steps,
                       rank=backend.rank, world_size=backend.world_size, device=device, dtype=dtype or torch.float32,
                       channels_last=channels_last)
    try:
        train, val, num_classes = build_run_loaders(root, spec, loader=data.loader, shards=data.shards,
                                                    backend=backend)
    except TooFewSamplesError as err:
        raise batch_too_large(plan, num_samples=err.num_samples) from None
    run_data = RunData(root, train, val, num_classes)
    if len(train) < plan.accumulation_steps:
        run_data.close()
        raise batch_too_large(plan, batches_per_rank=len(train))
    return run_data


def data_root_of(cfg: TrainConfig, backend: Backend, *, loader: str) -> Path:
    """``data.root``, or the embedded set of ``data.synthetic`` made by rank 0
    (``largebatch.data.build.resolve_data_root``), for a run or a tool reading with ``loader``."""
    from largebatch.data.build import resolve_data_root

    data = cfg.data
    syn = data.synthetic
    return resolve_data_root(
        data.root, loader=loader, workers=data.workers, backend=backend,
        synthetic=dict(num_classes=syn.classes, train_per_class=syn.train_per_class,
                       val_per_class=syn.val_per_class, image_size=syn.image_size, seed=syn.seed),
    )


def loader_spec(cfg: TrainConfig, *, batch_size: int, accumulation_steps: int = 1, rank: int = 0,
                world_size: int = 1, device: torch.device = torch.device("cpu"), dtype: torch.dtype = torch.float32,
                channels_last: bool = False) -> LoaderSpec:
    """What every pipeline is told, from ``data.*`` and ``data.resolution``; the batch, the rank
    and the device are the run's (``data_of``), or a tool's that only needs the sides
    (``largebatch-make-decoded``)."""
    from largebatch.data.contract import LoaderSpec

    data = cfg.data
    return LoaderSpec(
        image_size=data.image_size, batch_size=batch_size, workers=data.workers, seed=cfg.seed,
        crop_scale=cast(tuple[float, float], tuple(data.crop_scale)),  # a pair: check_ranges
        val_crop_ratio=data.val_crop_ratio, rank=rank, world_size=world_size, device=device, dtype=dtype,
        channels_last=channels_last, shuffle_buffer=data.shuffle_buffer, accumulation_steps=accumulation_steps,
        **resolution_options(cfg),
    )


def resolution_options(cfg: TrainConfig) -> dict[str, Any]:
    """The ``LoaderSpec`` options of ``data.resolution``: the training side and crop scale per
    epoch, the evaluation side and shape per epoch."""
    res = cfg.data.resolution
    return dict(train_sizes=resolution_of(cfg), eval_size=res.eval_size, rect_val=res.rect_val,
                crop_scale_steps=tuple((int(e), float(m)) for e, m in res.crop_scale_steps),
                eval_follows_train=res.eval_follows_train, rect_val_from_epoch=res.rect_val_from_epoch)
