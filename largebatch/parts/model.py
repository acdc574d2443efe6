"""The model section: the timm model (``model.*``, ``bn.group_size``), its wrapping for training
(``comm.*``, ``model.compile``) and the shapes it is compiled for."""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import nn

from largebatch.batch_schedule import AdaptiveBatchSchedule, batch_schedule_of
from largebatch.errors import ModelError
from largebatch.resolution import resolution_of

if TYPE_CHECKING:
    from largebatch.backends.base import Backend, WrappedModel
    from largebatch.config.schema import TrainConfig

__all__ = ["check_model_name", "model_of", "train_model_of", "training_shapes"]


def check_model_name(name: str) -> None:
    """``model.name`` is a timm model, checked before the data and the run directory are made;
    the error also names the presets of the ``model=`` config group."""
    from importlib import resources

    from largebatch.models import check_model_name as check_timm_name

    try:
        check_timm_name(name)
    except ModelError as err:
        presets = sorted(p.name[:-len(".yaml")] for p in (resources.files("largebatch.conf") / "model").iterdir()
                         if p.name.endswith(".yaml"))
        raise ModelError(f"{err}; set model.name= to a timm model, or choose a preset of the model= group: "
                         f"{', '.join(presets)} "
                         f"(model={presets[-1]})") from None


def model_of(cfg: TrainConfig, backend: Backend, num_classes: int, channels_last: bool) -> nn.Module:
    """The timm model on the device, with grouped BN (``bn.group_size``) across ranks."""
    # imported at call time: benchmarks/default_run_bf16_emulated.py replaces build_model first
    from largebatch.models import build_model
    from largebatch.nn import convert_group_sync_batchnorm

    m = cfg.model
    model = build_model(m.name, num_classes, zero_init_last_bn_gamma=m.zero_init_last_bn,
                        drop_rate=m.drop_rate, drop_path_rate=m.drop_path_rate, fc_init_std=m.fc_init_std)
    model = backend.prepare_model(model, channels_last=channels_last)
    if cfg.bn.group_size != 1 and backend.world_size > 1:
        model = convert_group_sync_batchnorm(model, cfg.bn.group_size, backend.bn_reducer(cfg.bn.group_size))
    return model


def train_model_of(cfg: TrainConfig, backend: Backend, model: nn.Module) -> WrappedModel:
    """The model as the loop calls it: DDP with the comm hook, then ``torch.compile``
    (``model.compile``); and the tap of the noise scale's local gradient norm
    (``diagnostics.noise_scale.enabled``; None where not asked for or not recorded), for
    ``parts.diagnostics.noise_scale_of``."""
    from largebatch.engine.compile import compile_model

    comm = cfg.comm
    wrapped = backend.wrap_model(model, bucket_mb=comm.bucket_mb, algorithm=comm.algorithm,
                                 compress=comm.compress, ranks_per_node=comm.ranks_per_node,
                                 tap_local_norm=cfg.diagnostics.noise_scale.enabled)
    shapes = training_shapes(cfg, backend.world_size)
    return wrapped._replace(model=compile_model(wrapped.model, cfg.model.compile, shapes=shapes))


def training_shapes(cfg: TrainConfig, world_size: int = 1) -> int:
    """Distinct (per-device batch, side) pairs the compiled model is fed over the run's epochs:
    progressive resizing's sides times a per-device batch schedule's factors, twice that where
    the noise scale's probe runs (its two half batches are another shape at every side)."""
    shapes = _batch_shapes(cfg)
    ns = cfg.diagnostics.noise_scale
    # plan_noise_scale's choice: the probe runs in one process without accumulation
    probe = ns.enabled and ns.probe_every > 0 and world_size == 1 and cfg.accumulation_steps == 1
    return 2 * shapes if probe else shapes


def _batch_shapes(cfg: TrainConfig) -> int:
    sizes, batches = resolution_of(cfg), batch_schedule_of(cfg)
    side_count = len({sizes.size_at(e) if sizes is not None else cfg.data.image_size for e in range(cfg.epochs)})
    if batches is None or batches.via != "per_device":
        return side_count
    if isinstance(batches, AdaptiveBatchSchedule):  # any side with any factor it may reach
        return side_count * len(batches.possible_factors())
    return len({(batches.factor_at(e), sizes.size_at(e) if sizes is not None else cfg.data.image_size)
                for e in range(cfg.epochs)})
