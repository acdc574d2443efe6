"""Value ranges of the composed config, checked before anything is created.

The schema (``largebatch.config.schema``) fixes keys and types; this module fixes what the
values may be: ``epochs=0``, ``optimizer.lr=nan`` or ``optimizer.momentum=2`` fail at
compose time, naming the key, before a run directory exists or a step runs. Values with
aliases (``model.compile=true``) are written back in their canonical form.

Three passes (``largebatch.config.compose.check_composed`` runs them in this order):
:func:`check_ranges` reads one key at a time from the composed ``DictConfig``;
:func:`canonicalise_choices` writes aliased choices back; :func:`check_sections` reads the
sections whose keys go together from the typed config (choices as plain strings) and builds the
schedules with the builders the run calls, so a schedule the checks pass is the one that trains.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Callable, Mapping, MutableMapping

from largebatch.batch_schedule import batch_schedule_of
from largebatch.config.pairs import PAIR_KEYS, check_pair_list
from largebatch.defaults import COMPILE_MODES, CUDA_GRAPH_MODES, MAX_CLASSES, MAX_IMAGE_SIZE, MIN_IMAGE_SIZE, parse_compile_mode
from largebatch.errors import ConfigError, UsageError
from largebatch.resolution import check_crop_scale_steps, resolution_of

if TYPE_CHECKING:
    from largebatch.config.schema import TrainConfig

__all__ = ["canonicalise_choices", "check_ranges", "check_sections", "value_ranges"]


def _num(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _int_at_least(low: int) -> tuple[Callable[[Any], bool], str]:
    return (lambda x: _num(x) and x >= low), f"an integer >= {low}"


def _int_in(low: int, high: int, unit: str = "") -> tuple[Callable[[Any], bool], str]:
    return (lambda x: _num(x) and low <= x <= high), f"an integer in {low}..{high}{unit}"


def _finite(cond: Callable[[float], bool], text: str) -> tuple[Callable[[Any], bool], str]:
    return (lambda x: _num(x) and cond(x)), text


_POSITIVE = _finite(lambda x: x > 0, "a finite number > 0")
_NON_NEGATIVE = _finite(lambda x: x >= 0, "a finite number >= 0")
_FRACTION = _finite(lambda x: 0 <= x < 1, "a number in [0, 1)")

# key -> (test, what the value must be); None values pass for the Optional keys listed below.
_RULES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "epochs": _int_at_least(1),
    "max_steps": _int_at_least(1),
    "global_batch_size": _int_at_least(1),
    "base_batch_size": _int_at_least(1),
    "accumulation_steps": _int_at_least(1),
    "label_smoothing": _FRACTION,
    "eval_every": _int_at_least(1),
    "log_every": _int_at_least(1),
    "max_skipped_steps": _int_at_least(0),
    # above 100 is allowed: an unreachable target runs every epoch (tests use 100.5)
    "target_top1": _finite(lambda x: x >= 0, "a finite percentage >= 0"),
    "optimizer.lr": _POSITIVE,
    "optimizer.weight_decay": _NON_NEGATIVE,
    "optimizer.momentum": _FRACTION,
    "optimizer.trust_coefficient": _POSITIVE,
    # >= 0: LARS takes 0 (the MLPerf reference's lars_epsilon); LAMB refuses 0 itself (its
    # Adam denominator), naming the option, when the optimizer is built.
    "optimizer.eps": _NON_NEGATIVE,
    "schedule.warmup_epochs": _NON_NEGATIVE,
    "schedule.warmup_start_factor": _finite(lambda x: 0 <= x <= 1, "a number in [0, 1]"),
    "schedule.gamma": _POSITIVE,
    "schedule.power": _POSITIVE,
    "schedule.end_factor": _NON_NEGATIVE,
    "data.image_size": _int_at_least(1),
    "data.workers": _int_at_least(0),
    "data.shuffle_buffer": _int_at_least(1),
    "data.val_crop_ratio": _finite(lambda x: 0 < x <= 1, "a number in (0, 1]"),
    "data.synthetic.classes": _int_in(2, MAX_CLASSES),
    "data.synthetic.train_per_class": _int_at_least(1),
    "data.synthetic.val_per_class": _int_at_least(1),
    "data.synthetic.seed": _int_at_least(0),
    "data.synthetic.image_size": _int_in(MIN_IMAGE_SIZE, MAX_IMAGE_SIZE, " (pixels)"),
    "model.drop_rate": _FRACTION,
    "model.drop_path_rate": _FRACTION,
    "model.fc_init_std": _POSITIVE,
    "precision.init_scale": _POSITIVE,
    "precision.growth_interval": _int_at_least(1),
    "backend.timeout_s": _int_at_least(1),
    "comm.bucket_mb": _POSITIVE,
    "checkpoint.keep": _int_at_least(0),
    "checkpoint.every_epochs": _int_at_least(0),
    "checkpoint.every_steps": _int_at_least(0),
    "ema.decay": _FRACTION,
    "ema.min_decay": _FRACTION,
    "ema.warmup_gamma": _POSITIVE,
    "ema.warmup_power": _POSITIVE,
    "ema.every": _int_at_least(1),
    "ema.update_after_step": _int_at_least(-2),  # -2: TensorFlow's EMA (schema comment)
    # 0 would be no average (one step's estimates, spread of order 1), 1 never moves
    "diagnostics.noise_scale.beta": _finite(lambda x: 0 < x < 1, "a number in (0, 1)"),
    "diagnostics.noise_scale.probe_every": _int_at_least(0),  # 0: no probe
}
_OPTIONAL = {"max_steps", "target_top1", "optimizer.momentum", "optimizer.trust_coefficient", "optimizer.eps",
             "model.fc_init_std"}
# what check_ranges says of the keys it checks beyond _RULES (several values, or another key)
_CROP_SCALE = "[min, max] with 0 < min <= max <= 1 (area fractions)"
_BETAS = "two numbers in [0, 1)"
_MIN_DECAY = "<= ema.decay"
_GROUP_SIZE = "-1 (the whole world) or an integer >= 1"
# data.resolution: checked together by ResolutionSchedule.of (its messages name the key)
_RESOLUTION = {
    "data.resolution.steps": "schedule=steps: [[epoch, pixels], ...], epochs ascending from 0 and < epochs",
    "data.resolution.start_epoch": "schedule=ramp: an integer >= 0",
    "data.resolution.end_epoch": "schedule=ramp: an integer > start_epoch and <= epochs",
    "data.resolution.start_size": "schedule=ramp: null or an integer >= multiple",
    "data.resolution.end_size": "schedule=ramp: null or an integer >= multiple",
    "data.resolution.multiple": "schedule=ramp: an integer >= 1",
    "data.resolution.eval_size": "null or an integer >= 1",
    "data.resolution.eval_follows_train": "true or false; true needs eval_size=null",
    "data.resolution.crop_scale_steps": "[[epoch, min_scale], ...], epochs ascending from >= 0 and < epochs, "
                                        "0 < min_scale <= data.crop_scale[1]",
    "data.resolution.rect_val_from_epoch": "an integer >= 0 and < epochs; > 0 needs rect_val=true",
}
_POINTS = "schedule=piecewise: [[epoch, factor], ...] with epochs ascending from >= 0 and factors >= 0"
# batch_schedule: checked together by BatchSchedule.of (its messages name the key)
_BATCH_SCHEDULE = {
    "batch_schedule.steps": "[[epoch, global_batch], ...], epochs ascending in 1..epochs-1, each batch a whole "
                            "multiple of global_batch_size",
}


def value_ranges() -> dict[str, str]:
    """Key -> what its value must be, as ``check_ranges`` words it (the configuration reference)."""
    ranges = {key: must for key, (_, must) in _RULES.items()}
    ranges.update({"data.crop_scale": _CROP_SCALE, "optimizer.betas": _BETAS,
                   "ema.min_decay": f"{ranges['ema.min_decay']}, {_MIN_DECAY}",
                   "bn.group_size": _GROUP_SIZE, **_RESOLUTION, **_BATCH_SCHEDULE, "schedule.points": _POINTS,
                   "model.compile": ", ".join(f"`{m}`" for m in COMPILE_MODES)
                   + "; `true`, `false`: `default`, `none`"})
    return ranges


def _get(cfg: Mapping[str, Any], key: str) -> Any:
    node: Any = cfg
    for part in key.split("."):
        node = node[part]
    return node


def _plain(value: Any) -> Any:
    """An OmegaConf list or map as plain Python (what the pair checker reads); anything else as is."""
    from omegaconf import Container, OmegaConf

    return OmegaConf.to_container(value) if isinstance(value, Container) else value


def _fail(key: str, value: Any, must: str) -> None:
    raise ConfigError(f"{key}={value} is out of range: it must be {must}; set {key}= to such a value")


def check_ranges(cfg: Mapping[str, Any]) -> None:
    """Raise ``ConfigError`` naming the first key whose value is out of its range.

    ``cfg`` is the composed config (a DictConfig or anything indexable by key parts).
    """
    for key in PAIR_KEYS:  # first: the checks below read each item as a pair
        check_pair_list(key, _plain(_get(cfg, key)))
    for key, (ok, must) in _RULES.items():
        value = _get(cfg, key)
        if value is None and key in _OPTIONAL:
            continue
        if not ok(value):
            _fail(key, value, must)
    scale = list(_get(cfg, "data.crop_scale"))
    if len(scale) != 2 or not all(_num(s) for s in scale) or not 0 < scale[0] <= scale[1] <= 1:
        _fail("data.crop_scale", scale, _CROP_SCALE)
    betas = _get(cfg, "optimizer.betas")
    if betas is not None and (len(betas) != 2 or not all(_num(b) and 0 <= b < 1 for b in betas)):
        _fail("optimizer.betas", list(betas), _BETAS)
    if _get(cfg, "ema.min_decay") > _get(cfg, "ema.decay"):
        _fail("ema.min_decay", _get(cfg, "ema.min_decay"), f"{_MIN_DECAY} ({_get(cfg, 'ema.decay')})")
    group = _get(cfg, "bn.group_size")
    if group != -1 and not (isinstance(group, int) and group >= 1):
        _fail("bn.group_size", group, _GROUP_SIZE)


def check_sections(cfg: TrainConfig) -> None:
    """Raise ``ConfigError`` naming the first key of a section whose values do not go together.

    ``cfg`` is the checked, canonical config with its choices as plain strings (``to_train_config``):
    the schedules are built here by the builders the run calls (:func:`batch_schedule_of`,
    :func:`resolution_of`), so each mapping from config to schedule is written once.
    """
    if cfg.ema.target == "ema" and not cfg.ema.enabled:
        raise ConfigError("ema.target=ema needs the weight EMA: set ema.enabled=true, or ema.target=raw")
    _check_points(cfg)
    _check_resolution(cfg)
    _check_rect_val(cfg)
    batches = batch_schedule_of(cfg)
    mode = cfg.model.compile
    if mode in CUDA_GRAPH_MODES and batches is not None and batches.via == "accumulation":
        raise ConfigError(
            f"model.compile={mode} (CUDA graphs) cannot be combined with a batch schedule raised by "
            "accumulation: each replay overwrites the gradients of the previous micro-step; set "
            "batch_schedule.via=per_device, or model.compile=max-autotune-no-cudagraphs (or default)"
        )


def _check_points(cfg: TrainConfig) -> None:
    """``schedule.points``: the piecewise schedule's knots, and only with it."""
    name = cfg.schedule.name
    points = [list(p) for p in cfg.schedule.points]
    if name != "piecewise":
        if points:
            raise ConfigError(f"schedule.points={points} is set but schedule.name={name}: set schedule.name=piecewise "
                              "to use it, or schedule.points=[]")
        return
    ok = bool(points) and all(len(p) == 2 and all(_num(v) and v >= 0 for v in p) for p in points)
    if not ok or any(b[0] < a[0] for a, b in zip(points, points[1:])):
        _fail("schedule.points", points, _POINTS)


def _check_resolution(cfg: TrainConfig) -> None:
    """``data.resolution``: ``eval_size`` or ``eval_follows_train``, ``crop_scale_steps``
    (:func:`check_crop_scale_steps`) and the schedule (:func:`resolution_of` names the bad key)."""
    res = cfg.data.resolution
    eval_size = res.eval_size
    if eval_size is not None and not (_num(eval_size) and eval_size >= 1):
        _fail("data.resolution.eval_size", eval_size, _RESOLUTION["data.resolution.eval_size"])
    if res.eval_follows_train and eval_size is not None:
        raise ConfigError(f"data.resolution.eval_follows_train=true and data.resolution.eval_size={eval_size} both "
                          "set the evaluation side: set data.resolution.eval_size=null, or "
                          "data.resolution.eval_follows_train=false")
    check_crop_scale_steps([list(p) for p in res.crop_scale_steps], max_scale=cfg.data.crop_scale[1],
                           epochs=cfg.epochs)
    resolution_of(cfg)


def _check_rect_val(cfg: TrainConfig) -> None:
    """``data.resolution.rect_val``: the torchvision loader reads it, and no backend compiling a graph per
    shape. ``data.loader=auto`` is checked where the loader is chosen (``largebatch.data.build``).
    ``rect_val_from_epoch``: an epoch of the run, and only with ``rect_val``."""
    start, epochs = cfg.data.resolution.rect_val_from_epoch, cfg.epochs
    if not (isinstance(start, int) and not isinstance(start, bool) and 0 <= start < epochs):
        _fail("data.resolution.rect_val_from_epoch", start, f"an integer >= 0 and < epochs ({epochs})")
    if not cfg.data.resolution.rect_val:
        if start:
            raise ConfigError(f"data.resolution.rect_val_from_epoch={start} is set but data.resolution.rect_val=false: "
                              "set data.resolution.rect_val=true to use it, or data.resolution.rect_val_from_epoch=0")
        return
    loader = cfg.data.loader
    if cfg.data.shards:
        raise ConfigError("data.resolution.rect_val=true is read by the torchvision loader only, not DALI's reader "
                          "of data.shards: drop data.shards and set data.loader=torchvision, or "
                          "data.resolution.rect_val=false")
    if loader in ("dali", "nvjpeg", "decoded"):
        raise ConfigError(f"data.resolution.rect_val=true is read by the torchvision loader only, not "
                          f"data.loader={loader}: set data.loader=torchvision, or data.resolution.rect_val=false")
    if cfg.backend.name == "xla":
        raise ConfigError("data.resolution.rect_val=true cannot run on backend=xla: each validation batch "
                          "shape would compile a graph of its own; set data.resolution.rect_val=false")


def canonicalise_choices(cfg: MutableMapping[str, Any]) -> None:
    """Check the string-valued choices the schema cannot type as Enums and write each back in
    its canonical form (``model.compile``: ``true``/``false`` -> ``default``/``none``).

    Raise ``ConfigError`` naming the key and the values to use.
    """
    try:
        cfg["model"]["compile"] = parse_compile_mode(_get(cfg, "model.compile"))
    except UsageError as err:
        raise ConfigError(str(err)) from None
    mode, accumulation = cfg["model"]["compile"], _get(cfg, "accumulation_steps")
    if mode in CUDA_GRAPH_MODES and accumulation > 1:
        # Each micro-step's replay reuses the buffers of the previous replay, .grad included
        # (pytorch issue 169545): accumulated gradients would be overwritten, silently.
        raise ConfigError(
            f"model.compile={mode} (CUDA graphs) cannot be combined with accumulation_steps="
            f"{accumulation}: each replay overwrites the gradients of the previous micro-step; "
            "use model.compile=max-autotune-no-cudagraphs (or default), or accumulation_steps=1"
        )
