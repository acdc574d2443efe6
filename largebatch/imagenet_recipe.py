"""ImageNet at the user's own batch: the published recipe nearest the global batch.

``data=imagenet`` without an ``experiment=`` preset used to compose the embedded run's toy
values (8 epochs, 1 warmup epoch, a 90% target). With ``recipe.mode=auto`` (the default) the
recipe is derived instead from the published large-batch runs, for the model and the global
batch the user chose, and every value a key on the command line sets wins:

- ResNet-50 with SGD: Goyal et al. 2017 (arXiv 1706.02677), lr 0.1 per 256 scaled linearly,
  5 warmup epochs from 0.1, steps at 30/60/80, 90 epochs; no accuracy loss from 256 to 8K
  (their Fig. 1 and Table 1). The default optimizer up to 8K.
- ResNet-50 with LARS: the MLPerf ResNet-50 reference (2K and 4K) and the LARS table of
  tensorflow/tpu (16K, 32K: Ying et al. 2018; 64K: the row Jia et al.'s preset reads), peak lr
  and warmup looked up per batch, polynomial decay. The default optimizer above 8K.
- EfficientNet-B2 and -B5 with LARS: Wongpanich et al. 2020 (arXiv 2011.00071), lr per 256
  scaled linearly, 5 warmup epochs, 350 epochs, weight EMA.

The rule between published points (no source gives one, so it is ours): the peak lr and the
warmup epochs are interpolated linearly in log2(batch) between the two neighbouring points;
every other value is the nearer point's (in log2(batch); a tie takes the smaller batch).
Outside the points the nearest point's values are used as they are (SGD and EfficientNet:
with their linear lr rule) and one warning names that point. Each derived value carries its
source; :func:`describe` writes them as the block a run logs at start.

The values below are those of the presets in ``conf/experiment/`` (which cite the commits
and lines they come from); ``tests/test_imagenet_recipe.py`` holds the two together.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

from largebatch.errors import ConfigError

__all__ = ["Derivation", "Family", "Point", "FAMILIES", "derive", "describe", "families_for"]

MLPERF_TARGET = 75.9  # MLPerf Training ResNet-50: 75.90% top-1 (training_rules.adoc)
DEFAULT_MODEL = "resnet50"  # the model of Goyal et al., MLPerf and the records: when no model is named
DEFAULT_BATCH = 256  # Goyal et al. 2017's reference batch (kn = 256, sec. 5.1): when no batch is given


@dataclass(frozen=True)
class Point:
    """One published run: its global batch, the values it sets, where they come from."""

    batch: int
    values: Mapping[str, Any]  # config key -> value (its own lr and warmup among them)
    source: str  # short citation, e.g. "MLPerf ResNet-50 reference, GPU-V100-8 set"
    top1: Optional[float] = None  # the accuracy the source reports at this batch [percent]


@dataclass(frozen=True)
class Family:
    """A model and optimizer with published points; the keys every point shares."""

    models: tuple[str, ...]
    optimizer: str
    schedule: str
    common: Mapping[str, Any]  # values every point shares
    common_source: str
    points: tuple[Point, ...]
    # True: the lr is per base_batch_size images and scales linearly (the same values at every
    # batch); False: the lr is the peak at the batch, looked up per point (lr_scaling none).
    linear_lr: bool
    beyond: str = ""  # what the sources say past the last point (the warning's second half)


_RN50_SGD = Family(
    models=("resnet50",), optimizer="sgd", schedule="step",
    common={
        "optimizer.lr": 0.1, "base_batch_size": 256, "lr_scaling": "linear",
        "optimizer.momentum": 0.9, "optimizer.nesterov": True, "optimizer.weight_decay": 1.0e-4,
        "optimizer.exclude_bn_bias": True, "schedule.warmup_epochs": 5, "schedule.warmup_start": "base_lr",
        "schedule.milestones": [30, 60, 80], "schedule.gamma": 0.1, "epochs": 90, "label_smoothing": 0.0,
        "model.zero_init_last_bn": True,
    },
    common_source="Goyal et al. 2017 (sec. 2.1, 2.2, 5.1)",
    points=(
        Point(256, {}, "Goyal et al. 2017 at 256 (Table 1)", 76.4),
        Point(8192, {}, "Goyal et al. 2017 at 8K (Table 1)", 76.26),
    ),
    linear_lr=True,
    beyond="Goyal et al. 2017 Fig. 1: the error rises past 8K with SGD; optimizer=lars follows the LARS points to 64K",
)

# LARS, ResNet-50: settings every point shares (MLPerf reference and tensorflow/tpu alike).
_LARS_RN50_COMMON = {
    "lr_scaling": "none", "optimizer.momentum": 0.9, "optimizer.trust_coefficient": 0.001,
    "optimizer.lr_in_momentum": True, "optimizer.exclude_bn_bias": True, "optimizer.weight_decay": 2.0e-4,
    "schedule.warmup_start_factor": 0.0, "schedule.power": 2.0, "schedule.end_lr": 1.0e-4,
}
_MLPERF = {"optimizer.eps": 1.0e-7, "label_smoothing": 0.1, "model.zero_init_last_bn": False}
_TF_TPU = {"optimizer.eps": 0.0, "model.zero_init_last_bn": True}

_RN50_LARS = Family(
    models=("resnet50",), optimizer="lars", schedule="poly",
    common=_LARS_RN50_COMMON,
    common_source="every LARS point (MLPerf reference, tensorflow/tpu)",
    points=(
        Point(2048, {**_MLPERF, "optimizer.lr": 8.5, "schedule.warmup_epochs": 5, "epochs": 41},
              "MLPerf reference, its 2K set"),
        Point(4096, {**_MLPERF, "optimizer.lr": 10.0, "schedule.warmup_epochs": 5, "epochs": 42},
              "MLPerf reference, its 4K set"),
        Point(16384, {**_TF_TPU, "optimizer.lr": 25.0, "schedule.warmup_epochs": 5, "epochs": 90,
                      "label_smoothing": 0.1},
              "tensorflow/tpu LARS table, 16K row"),
        Point(32768, {**_TF_TPU, "optimizer.lr": 34.0, "schedule.warmup_epochs": 12, "epochs": 91,
                      "label_smoothing": 0.1},
              "Ying et al. 2018 at 32K", 76.3),
        Point(65536, {**_TF_TPU, "optimizer.lr": 35.0, "schedule.warmup_epochs": 34, "epochs": 90,
                      "label_smoothing": 0.0},
              "Jia et al. 2018 at 64K (tensorflow/tpu LARS table)", 75.8),
    ),
    linear_lr=False,
    beyond="no published ResNet-50 run trained past 64K to the target",
)

_EFFNET_COMMON = {
    "optimizer.lr": 0.1, "base_batch_size": 256, "lr_scaling": "linear", "optimizer.momentum": 0.9,
    "optimizer.trust_coefficient": 0.001, "optimizer.eps": 0.0, "optimizer.lr_in_momentum": True,
    "optimizer.weight_decay": 2.0e-5, "optimizer.exclude_bn_bias": True, "schedule.warmup_epochs": 5,
    "schedule.warmup_start_factor": 0.0, "schedule.power": 2.0, "schedule.end_lr": 0.1, "epochs": 350,
    "label_smoothing": 0.1, "model.zero_init_last_bn": False, "ema.enabled": True, "ema.decay": 0.9999,
    "ema.warmup": True, "ema.warmup_gamma": 9.0, "ema.warmup_power": 1.0, "ema.update_after_step": -2,
    "ema.target": "ema",
}
_EFFNET_SOURCE = "Wongpanich et al. 2020 (their code; lr 0.1 per 256 is our choice, untuned)"

_EFFNET_B2 = Family(
    models=("efficientnet_b2",), optimizer="lars", schedule="poly", common=_EFFNET_COMMON,
    common_source=_EFFNET_SOURCE,
    points=(Point(32768, {"target_top1": 79.7, "model.drop_rate": 0.3, "data.image_size": 260},
                  "Wongpanich et al. 2020, B2 at 32K", 79.7),),
    linear_lr=True,
)
_EFFNET_B5 = Family(
    models=("efficientnet_b5",), optimizer="lars", schedule="poly", common=_EFFNET_COMMON,
    common_source=_EFFNET_SOURCE,
    points=(Point(65536, {"target_top1": 83.0, "model.drop_rate": 0.4, "data.image_size": 456},
                  "Wongpanich et al. 2020, B5 at 64K", 83.0),),
    linear_lr=True,
    beyond="Wongpanich et al. 2020 trained B5 at 64K, their largest batch",
)

FAMILIES: tuple[Family, ...] = (_RN50_SGD, _RN50_LARS, _EFFNET_B2, _EFFNET_B5)

# Above this batch ResNet-50's default optimizer is LARS (Goyal et al.'s SGD holds to 8K).
SGD_UP_TO = 8192

# keys that set the lr together: a user who writes one of them writes the lr rule
LR_KEYS = ("optimizer.lr", "base_batch_size", "lr_scaling")
# keys of one decay: derived only when the schedule is the family's
_SCHEDULE_ONLY = {"step": ("schedule.milestones", "schedule.gamma"),
                  "poly": ("schedule.power", "schedule.end_lr")}


def families_for(model: str) -> list[Family]:
    return [f for f in FAMILIES if model in f.models]


@dataclass
class Derivation:
    """What the recipe sets: overrides to compose before the user's, and each value's source."""

    overrides: list[str] = field(default_factory=list)
    sources: dict[str, str] = field(default_factory=dict)  # key -> "value: source"
    warnings: list[str] = field(default_factory=list)


def _fmt(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ",".join(_fmt(v) for v in value) + "]"
    if isinstance(value, float):
        return repr(value) if value != int(value) or abs(value) >= 1e16 else f"{value:.1f}"
    return str(value)


def _k(batch: int) -> str:
    return f"{batch // 1024}K" if batch >= 1024 and batch % 1024 == 0 else str(batch)


def _neighbours(points: Sequence[Point], batch: int) -> tuple[Point, Optional[Point]]:
    """The point at ``batch``, or the two around it, or the nearest outer point (and None)."""
    for p in points:
        if p.batch == batch:
            return p, None
    below = [p for p in points if p.batch < batch]
    above = [p for p in points if p.batch > batch]
    if below and above:
        return below[-1], above[0]
    return (below[-1] if below else above[0]), None


def _nearer(a: Point, b: Point, batch: int) -> Point:
    da, db = abs(math.log2(batch / a.batch)), abs(math.log2(batch / b.batch))
    return a if da <= db else b


def _interpolate(a: Point, b: Point, batch: int, key: str) -> float:
    t = (math.log2(batch) - math.log2(a.batch)) / (math.log2(b.batch) - math.log2(a.batch))
    value = a.values[key] + t * (b.values[key] - a.values[key])
    return round(value, 2)


def _family(model: str, optimizer: Optional[str], batch: int) -> Family:
    families = families_for(model)
    if not families:
        published = sorted({m for f in FAMILIES for m in f.models})
        raise ConfigError(
            f"model {model} has no published ImageNet recipe (published: {', '.join(published)}); choose one of "
            f"them, or set recipe.mode=off and name the recipe yourself (epochs, optimizer.lr, schedule.*, "
            f"target_top1)")
    if optimizer is None:
        default = "sgd" if batch <= SGD_UP_TO and any(f.optimizer == "sgd" for f in families) else "lars"
        optimizer = default if any(f.optimizer == default for f in families) else families[0].optimizer
    for f in families:
        if f.optimizer == optimizer:
            return f
    names = " or ".join(f"optimizer={f.optimizer}" for f in families)
    raise ConfigError(
        f"optimizer={optimizer} has no published ImageNet recipe for {model} ({names} has); choose it, or set "
        f"recipe.mode=off and name the recipe yourself (optimizer.lr, schedule.*, epochs)")


def derive(*, model: str, global_batch_size: Optional[int], optimizer: Optional[str],
           schedule: Optional[str], written: Sequence[str]) -> Derivation:
    """The published recipe for ``model`` at ``global_batch_size``.

    ``optimizer`` and ``schedule`` are the group options the user chose (None: the recipe's);
    ``written`` the keys the user set (``optimizer.lr``, ``epochs``, ...), which the recipe
    leaves alone. ``global_batch_size`` None: the user did not set it (the recipe's default, 256).
    """
    out = Derivation()
    if global_batch_size is None:
        global_batch_size = DEFAULT_BATCH
        out.overrides.append(f"global_batch_size={DEFAULT_BATCH}")
        out.sources["global_batch_size"] = f"{DEFAULT_BATCH}: Goyal et al. 2017's reference batch (set yours)"
    batch = global_batch_size
    fam = _family(model, optimizer, batch)
    skip = _group_choices(out, fam, batch, optimizer=optimizer, schedule=schedule, written=written)
    values = _values_at(out, fam, batch)
    values.setdefault("target_top1", (MLPERF_TARGET, "MLPerf Training's ResNet-50 target"))
    for key, (value, source) in sorted(values.items(), key=lambda kv: _order(kv[0])):
        if key in skip:
            continue
        out.overrides.append(f"{key}={_fmt(value)}")
        out.sources[key] = f"{_fmt(value)}: {source}"
    return out


def _group_choices(out: Derivation, fam: Family, batch: int, *, optimizer: Optional[str], schedule: Optional[str],
                   written: Sequence[str]) -> set[str]:
    """The family's optimizer and schedule where the user chose none (added to ``out``), and the
    keys the recipe leaves alone: those written, the lr rule's once the user wrote the lr, and the
    other schedule's. The lr rule is the user's whole or not at all."""
    lr_written = [k for k in LR_KEYS if k in written]
    if lr_written and "optimizer.lr" not in lr_written:
        raise ConfigError(
            f"{lr_written[0]} is set but optimizer.lr is not: the recipe's lr belongs to its own rule; set "
            f"optimizer.lr too (the lr per base_batch_size images), or leave {' and '.join(lr_written)} to the recipe")
    if optimizer is None:
        out.overrides.append(f"optimizer={fam.optimizer}")
        out.sources["optimizer"] = f"{fam.optimizer}: {_optimizer_reason(fam, batch)}"
    if schedule is None:
        out.overrides.append(f"schedule={fam.schedule}")
        out.sources["schedule"] = f"{fam.schedule}: {fam.common_source}"
        schedule = fam.schedule
    skip = set(written) | ({k for k in LR_KEYS} if lr_written else set())
    for other, keys in _SCHEDULE_ONLY.items():
        if other != schedule:
            skip.update(keys)
    return skip


def _values_at(out: Derivation, fam: Family, batch: int) -> dict[str, tuple[Any, str]]:
    """Each key's value at ``batch`` with its source: the family's common values, the published
    point's (the nearest where ``batch`` lies outside them, with a warning added to ``out``), the lr
    and warmup interpolated in log2(batch) between two points, and the lr rule (:func:`_peak_rule`)."""
    first, second = _neighbours(fam.points, batch)
    values: dict[str, tuple[Any, str]] = {k: (v, fam.common_source) for k, v in fam.common.items()}
    if second is None:
        point = first
        values.update({k: (v, point.source) for k, v in point.values.items()})
        if point.batch != batch:
            where = "beyond every" if batch > point.batch else "below every"
            out.warnings.append(
                f"global batch {batch} is {where} published point of this recipe: using the nearest, "
                f"{_k(point.batch)} ({point.source})" + (f"; {fam.beyond}" if batch > point.batch and fam.beyond else ""))
    else:
        point = _nearer(first, second, batch)
        values.update({k: (v, point.source) for k, v in point.values.items()})
        for key in ("optimizer.lr", "schedule.warmup_epochs"):
            if key in first.values and key in second.values:
                a, b = first.values[key], second.values[key]
                values[key] = (_interpolate(first, second, batch, key),
                               f"interpolated in log2(batch): {_fmt(a)} at {_k(first.batch)} ({first.source}), "
                               f"{_fmt(b)} at {_k(second.batch)} ({second.source})")
    if not fam.linear_lr:
        values.update(_peak_rule(point, batch, interpolated=second is not None))
    return values


def _peak_rule(point: Point, batch: int, *, interpolated: bool) -> dict[str, tuple[Any, str]]:
    """A family whose lr is a peak looked up per batch, not a rate per ``base_batch_size`` images:
    ``base_batch_size`` (and ``lr_scaling``) that make the scaled lr that peak at ``batch``."""
    if point.batch == batch or interpolated:
        return {"base_batch_size": (batch, "the lr is the peak at this batch (lr_scaling none)")}
    if batch < point.batch:  # below the first point: its peak, scaled down by Goyal et al.'s linear rule
        return {"base_batch_size": (point.batch, f"the lr is {_k(point.batch)}'s peak ..."),
                "lr_scaling": ("linear", "... scaled linearly to this batch (Goyal et al. 2017's rule)")}
    # beyond the last point: its peak as it is (no source scales it further)
    return {"base_batch_size": (batch, f"the lr is {_k(point.batch)}'s peak, used as is (lr_scaling none)")}


# the block's order: what a reader checks first
_FIRST = ("optimizer.lr", "base_batch_size", "lr_scaling", "schedule.warmup_epochs", "epochs", "label_smoothing",
          "optimizer.weight_decay", "target_top1")


def _order(key: str) -> tuple[int, str]:
    return (_FIRST.index(key), "") if key in _FIRST else (len(_FIRST), key)


def _optimizer_reason(fam: Family, batch: int) -> str:
    if fam.optimizer == "sgd":
        return f"Goyal et al. 2017's SGD holds its accuracy up to {_k(SGD_UP_TO)}"
    if "resnet50" in fam.models:
        return f"above {_k(SGD_UP_TO)} the published ResNet-50 runs use LARS"
    return "Wongpanich et al. 2020 use LARS instead of RMSProp at large batch"


def describe(sources: Mapping[str, str], global_batch_size: int, model: str) -> list[str]:
    """The start-up block: one line per derived value with its source."""
    if not sources:
        return []
    width = max(len(k) for k in sources)
    lines = [f"ImageNet recipe for {model} at global batch {global_batch_size} "
             f"(recipe.mode=auto; a key you set wins, recipe.mode=off derives nothing):"]
    lines += [f"  {key:<{width}}  {text}" for key, text in sources.items()]
    return lines
