"""The start-up record: the run directory the run writes into, the config and what the run
resolved (``resolved`` in summary.json and the checkpoints) and, on rank 0, ``config.yaml`` and
the lines that state the batch and lr arithmetic once."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, cast

from omegaconf import DictConfig, OmegaConf

from largebatch import __version__

if TYPE_CHECKING:
    from largebatch.backends.base import Backend
    from largebatch.batch_schedule import BatchSchedule
    from largebatch.config.schema import TrainConfig
    from largebatch.engine.batch_plan import BatchPlan
    from largebatch.engine.run_dir import RunDir

__all__ = ["announce", "config_of", "resolved_of", "run_dir_of"]

log = logging.getLogger("largebatch")


def run_dir_of(cfg: TrainConfig, backend: Backend, config: Optional[dict[str, Any]] = None) -> RunDir:
    """The run directory (``run_dir``; a bare ``resume=auto``: the newest unfinished run of
    ``config``, the composed config as a plain dict, under ``output_root``; else a new one there;
    rank 0 chooses and locks it, every rank gets its path), the log written into it, and rank 0's
    notes about it logged there (``largebatch.engine.run_dir.make_run_dir``)."""
    from largebatch.engine.run_dir import make_run_dir
    from largebatch.engine.run_log import log_into_run_dir

    run_dir = make_run_dir(run_dir=cfg.run_dir, output_root=cfg.output_root, model_name=cfg.model.name,
                           resume=cfg.resume, backend=backend, config=config)
    log_into_run_dir(run_dir.path)
    for note in run_dir.notes:
        log.warning("%s", note)
    return run_dir


def config_of(raw_cfg: Optional[DictConfig]) -> Optional[dict[str, Any]]:
    """The composed config as a plain dict (the checkpoints' record, resume's same-run check), or
    None where the run was given only a ``TrainConfig``."""
    if raw_cfg is None:
        return None
    # a DictConfig becomes a dict with str keys (the config schema's)
    return cast(dict[str, Any], OmegaConf.to_container(raw_cfg, resolve=True))


def resolved_of(cfg: TrainConfig, backend: Backend, plan: BatchPlan, *, lr: float, steps_per_epoch: int,
                precision: str, batches: Optional[BatchSchedule], num_classes: int, data_root: Path, run_dir: Path,
                channels_last: bool, loader: str) -> dict[str, Any]:
    """What the run resolved (summary.json, checkpoints): sizes, lr, precision, the loader that
    read the data (``data.loader=auto``'s answer), paths."""
    return {
        "version": __version__,
        "backend": backend.describe(),
        "world_size": backend.world_size,
        "global_batch_size": plan.global_batch_size,
        "per_device_batch_size": plan.per_device,
        "accumulation_steps": plan.accumulation_steps,
        "lr_per_base_batch": cfg.optimizer.lr,
        "base_batch_size": cfg.base_batch_size,
        "lr_scaling": cfg.lr_scaling,
        "lr": lr,
        "optimizer": cfg.optimizer.name,
        "steps_per_epoch": steps_per_epoch,
        "warmup_epochs": cfg.schedule.warmup_epochs,
        "warmup_steps": int(round(cfg.schedule.warmup_epochs * steps_per_epoch)),
        # batch-size control: the global batch per epoch, or null (global_batch_size every epoch)
        "batch_schedule": batches.describe() if batches is not None else None,
        "precision": precision,
        "model": cfg.model.name,
        "compile": cfg.model.compile,
        "channels_last": channels_last,
        "num_classes": num_classes,
        "bn_group_size": cfg.bn.group_size,
        "ema_decay": cfg.ema.decay if cfg.ema.enabled else None,
        "top1_of": cfg.ema.target,  # raw | ema: the weights best_top1 and time_to_target_s measure
        "data_root": str(data_root),
        "image_size": cfg.data.image_size,
        "loader": loader,
        "run_dir": str(run_dir),
        # the ImageNet recipe's derived values, each with its source (recipe.mode=auto), or null
        "recipe": dict(cfg.recipe.derived) or None,
        "recipe_warnings": list(cfg.recipe.warnings),
    }


def announce(resolved: dict[str, Any], run_dir: Path, raw_cfg: Optional[DictConfig], epochs: int, *,
             devices: bool = False) -> None:
    """Rank 0: write config.yaml and log the batch and lr arithmetic once, the recipe's lines and
    warnings, with ``devices`` (a data set of the user's, not the embedded one) the images, BN
    batch and memory per device (``largebatch.imagenet_recipe.device_lines``), and a warmup the
    run cannot finish (``largebatch.lr.long_warmup_warning``)."""
    from largebatch.lr import long_warmup_warning

    if raw_cfg is not None:
        path = run_dir / "config.yaml"
        try:
            path.write_text(OmegaConf.to_yaml(raw_cfg), encoding="utf-8")
        except OSError as e:
            from largebatch.engine.run_files import run_file_error

            raise run_file_error("the config", path, e, "nothing was trained; free space (or make it writable) and run again") from None
    r = resolved
    log.info(
        "global batch %d = %d per device x %d devices x %d accumulation; lr %.4g per %d "
        "images, %s-scaled to %.4g; %d steps/epoch, %d warmup steps; %s, %s; run dir %s",
        r["global_batch_size"], r["per_device_batch_size"], r["world_size"], r["accumulation_steps"],
        r["lr_per_base_batch"], r["base_batch_size"], r["lr_scaling"], r["lr"], r["steps_per_epoch"],
        r["warmup_steps"], r["precision"], r["backend"], run_dir,
    )
    if r["batch_schedule"] is not None:
        log.info("batch schedule: global batch %s; steps/epoch and warmup steps above are the first "
                 "batch's, the schedule runs on epochs", r["batch_schedule"])
    if r["recipe"]:
        from largebatch.imagenet_recipe import describe

        log.info("%s", "\n".join(describe(r["recipe"], r["global_batch_size"], r["model"])))
    if devices:
        from largebatch.imagenet_recipe import device_lines

        for line in device_lines(model=r["model"], optimizer=r["optimizer"], global_batch_size=r["global_batch_size"],
                                 world_size=r["world_size"], accumulation_steps=r["accumulation_steps"],
                                 bn_group_size=r["bn_group_size"], precision=r["precision"],
                                 image_size=r["image_size"]):
            (log.warning if "WARNING" in line else log.info)("%s", line)
    for warning in r["recipe_warnings"]:
        log.warning("%s", warning)
    too_long = long_warmup_warning(warmup_epochs=r["warmup_epochs"], warmup_steps=r["warmup_steps"],
                                   steps_per_epoch=r["steps_per_epoch"], epochs=epochs, lr=r["lr"])
    if too_long:
        log.warning("%s", too_long)
