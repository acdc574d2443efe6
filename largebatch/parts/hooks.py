"""The hooks section: evaluation (``eval_every``, ``target_top1``), checkpoints (``checkpoint.*``),
logs (``progress``, ``tensorboard``) and the optional hooks, as ``largebatch.engine.assemble``'s
``RunHooks``."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Optional

if TYPE_CHECKING:
    from largebatch.backends.base import Backend
    from largebatch.config.schema import TrainConfig
    from largebatch.engine.assemble import OptionalHooks, RunHooks
    from largebatch.engine.checkpoint_format import RunIdentity
    from largebatch.resolution import ResolutionSchedule

__all__ = ["run_hooks_of"]


def run_hooks_of(cfg: TrainConfig, backend: Backend, run_dir: Path, val_loader: Iterable, identity: RunIdentity,
                 optional: OptionalHooks, train_sizes: Optional[ResolutionSchedule]) -> RunHooks:
    """The run's hooks (``largebatch.engine.assemble.build_run_hooks``), their settings read from the config."""
    from largebatch.engine.assemble import LogSettings, build_run_hooks
    from largebatch.engine.hooks import CheckpointSettings, EvalSettings

    channels_last = identity.resolved["channels_last"]  # resolved once (channels_last_of)
    ckpt = cfg.checkpoint
    return build_run_hooks(
        run_dir=run_dir, is_main=backend.is_main,
        val_loader=backend.wrap_loader(val_loader, channels_last=channels_last),
        # Agree on a stop every step on CPU/gloo (cheap), every log step on accelerators.
        agree_every=1 if backend.device.type == "cpu" else cfg.log_every,
        identity=identity,
        evaluation=EvalSettings(every=cfg.eval_every, target_top1=cfg.target_top1, stop_at_target=cfg.stop_at_target,
                                channels_last=channels_last, top1_of=cfg.ema.target),
        checkpointing=CheckpointSettings(every_epochs=ckpt.every_epochs, every_steps=ckpt.every_steps, keep=ckpt.keep),
        logging=LogSettings(progress=cfg.progress, tensorboard=cfg.tensorboard, train_sizes=train_sizes),
        optional=optional,
    )
