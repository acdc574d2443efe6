"""ImageNet at the user's own batch: the published recipe at the global batch, or the references' rule.

``data=imagenet`` without an ``experiment=`` preset used to compose the embedded run's toy
values (8 epochs, 1 warmup epoch, a 90% target). With ``recipe.mode=auto`` (the default) the
recipe is derived instead from the published large-batch runs, for the model and the global
batch the user chose, and every value a key on the command line sets wins:

- ResNet-50 with SGD: Goyal et al. 2017 (arXiv 1706.02677), lr 0.1 per 256 scaled linearly,
  5 warmup epochs from 0.1, steps at 30/60/80, 90 epochs; no accuracy loss from 256 to 8K
  (their Fig. 1 and Table 1). The default optimizer up to 8K.
- ResNet-50 with LARS: the MLPerf reference's 2K and 4K sets, tensorflow/tpu's 16K config and
  32K run (Ying et al. 2018), Jia et al. 2018's 64K run with tensorflow/tpu's 64K row. The
  default optimizer above 8K.
- EfficientNet-B2 and -B5 with LARS: Wongpanich et al. 2020 (arXiv 2011.00071), lr per 256
  scaled linearly, 5 warmup epochs, 350 epochs, weight EMA.

Between the LARS points the rule is the references' own: a lookup by batch range, not an
interpolation. mlcommons/training ``retired_benchmarks/resnet-tf2/tensorflow2/lars_util.py``
@3c81f6f L77-85 (< 16384: 10.0 / 5 warmup epochs; < 32768: 25.0 / 5; else 31.2 / 25) and
tensorflow/tpu ``models/official/resnet/lars_util.py`` @f59154b L48-59 (< 16384: 10 / 5;
< 32768: 25 / 5; < 65536: 32 / 14; else 35.6 / 40; the same file to today) agree below 32K.
Above it they differ, and our 32K and 64K points are tensorflow/tpu's, so its rows are used.
A batch inside a range gets one coherent set: the row's peak lr and warmup, and every other
value from the published run of the same reference in that range (:data:`_RN50_LARS`), and a
warning says that no run at that batch was reported. Below the first point the point's values
are used (a LARS peak scaled down linearly); past the last point of a family without a range
there, the last point's, with a warning. SGD's rule is Goyal et al.'s linear one at every batch.

Each value carries a label naming the file and commit (and line), or the paper's section, it
comes from, or saying ``chosen``; :func:`describe` writes them as the block a run logs at start,
each value as the override that reproduces it. ``tests/test_imagenet_recipe.py`` holds the
labels against a table of what each cited line holds, and the points against the presets in
``conf/experiment/``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

from largebatch.errors import ConfigError

__all__ = ["CARDS", "FAMILIES", "MEASURED_MEMORY", "Derivation", "Family", "MemoryFigure", "Point", "Range", "UserLr",
           "bn_batch_of", "derive", "describe", "device_lines", "families_for", "memory_figure"]

MLPERF_TARGET = 75.9  # MLPerf Training ResNet-50: 75.90% top-1 (training_rules.adoc)
DEFAULT_MODEL = "resnet50"  # the model of Goyal et al., MLPerf and the records: when no model is named
DEFAULT_BATCH = 256  # Goyal et al. 2017's reference batch (kn = 256, sec. 5.1): when no batch is given
# a user's own lr whose peak is this many times the family's largest published peak is refused
REFUSE_ABOVE = 10.0

Values = Mapping[str, tuple[Any, str]]  # config key -> (value, label: where it comes from, or "chosen: ...")


@dataclass(frozen=True)
class Point:
    """One published run: its global batch, the values it sets with their labels, its short name."""

    batch: int
    values: Values  # its own lr and warmup among them
    source: str  # short name for warnings, e.g. "MLPerf reference, its 2K set"
    top1: Optional[float] = None  # the accuracy the source reports at this batch [percent]


@dataclass(frozen=True)
class Range:
    """A row of a reference's lookup by batch range, ``low < batch < high`` (high None: no end),
    with the set a batch there gets where no published run is at that batch."""

    low: int
    high: Optional[int]
    values: Values
    rule: str  # the row, named with its file, commit and lines


@dataclass(frozen=True)
class Family:
    """A model and optimizer with published points; the keys every point shares."""

    models: tuple[str, ...]
    optimizer: str
    schedule: str
    schedule_source: str
    common: Values  # values (with labels) every point and range shares
    points: tuple[Point, ...]
    # True: the lr is per base_batch_size images and scales linearly (the same values at every
    # batch); False: the lr is the peak at the batch, looked up (lr_scaling none).
    linear_lr: bool
    ranges: tuple[Range, ...] = ()  # the references' rule between and past the points
    beyond: str = ""  # what the sources say past the last point (the warning's second half)
    # the images each BN normalises over in the published runs, with its source; None: not published
    bn_batch: Optional[tuple[int, str]] = None


# --- ResNet-50, SGD: Goyal et al. 2017 ------------------------------------------------------------
_GOYAL = "Goyal et al. 2017 (arXiv 1706.02677)"
_RN50_SGD = Family(
    models=("resnet50",), optimizer="sgd", schedule="step", schedule_source=f"{_GOYAL} sec. 5.1",
    common={
        "optimizer.lr": (0.1, f"{_GOYAL} sec. 2.1, 5.1: 0.1 per 256 images, scaled linearly"),
        "base_batch_size": (256, f"{_GOYAL} sec. 2.1"), "lr_scaling": ("linear", f"{_GOYAL} sec. 2.1"),
        "optimizer.momentum": (0.9, f"{_GOYAL} sec. 5.1"), "optimizer.nesterov": (True, f"{_GOYAL} sec. 5.1"),
        "optimizer.weight_decay": (1.0e-4, f"{_GOYAL} sec. 5.1"),
        "optimizer.exclude_bn_bias": (True, f"{_GOYAL} sec. 5.1 for BN gamma/beta; chosen for the fc bias"),
        "schedule.warmup_epochs": (5, f"{_GOYAL} sec. 2.2"), "schedule.warmup_start": ("base_lr", f"{_GOYAL} sec. 2.2"),
        "schedule.milestones": ([30, 60, 80], f"{_GOYAL} sec. 5.1"), "schedule.gamma": (0.1, f"{_GOYAL} sec. 5.1"),
        "epochs": (90, f"{_GOYAL} sec. 5.1"), "label_smoothing": (0.0, f"chosen: {_GOYAL} name none"),
        "model.zero_init_last_bn": (True, f"{_GOYAL} sec. 5.1"),
        "bn.group_size": (1, f"{_GOYAL} sec. 2.3, 5.1: BN over each worker's own n = 32 images"),
    },
    points=(
        Point(256, {}, "Goyal et al. 2017 at 256 (Table 1)", 76.4),
        Point(8192, {}, "Goyal et al. 2017 at 8K (Table 1)", 76.26),
    ),
    linear_lr=True,
    beyond="Goyal et al. 2017 Fig. 1: the error rises past 8K with SGD; optimizer=lars follows the LARS points to 64K",
    bn_batch=(32, f"{_GOYAL} sec. 2.3, 5.1: n = 32 images per worker"),
)

# --- ResNet-50, LARS: the MLPerf reference and tensorflow/tpu --------------------------------------
_ML = "mlcommons/training@3c81f6f retired_benchmarks/resnet-tf2/"
_TPU = "tensorflow/tpu@b13e6b6 models/official/resnet/"
_TPU_NOW = "tensorflow/tpu@f59154b models/official/resnet/"
_TPU_CFG = "tensorflow/tpu@8055210 models/official/resnet/configs/cloud/"
_TF_LARS = "tensorflow/tensorflow@5c8077a tensorflow/contrib/opt/python/training/lars_optimizer.py"

# what both references do alike (each cited in both)
_LARS_RN50_COMMON: Values = {
    "lr_scaling": ("none", f"{_ML}tensorflow2/lars_util.py L77-89 and {_TPU}lars_util.py L44-59: the peak is "
                           "looked up by batch, not scaled"),
    "optimizer.momentum": (0.9, f"{_ML}README.md L119, L233 (--momentum=0.9); {_TPU}resnet_main.py L206"),
    "optimizer.trust_coefficient": (0.001, f"{_ML}tensorflow2/lars_optimizer.py L58; {_TF_LARS} L53 (eeta)"),
    "optimizer.lr_in_momentum": (True, f"{_ML}tensorflow2/lars_optimizer.py L141-158; {_TF_LARS} "
                                       "_apply_dense: lr x trust ratio into the momentum update"),
    "optimizer.exclude_bn_bias": (True, f"{_ML}tensorflow2/common.py L228; {_TPU}lars_util.py L83 (skip_list)"),
    "optimizer.weight_decay": (2.0e-4, f"{_ML}README.md L137, L231 (--weight_decay=0.0002); {_TPU}resnet_main.py "
                                       "L210 (1e-4 as loss L2 and 1e-4 in LARS)"),
    "schedule.warmup_start_factor": (0.0, f"{_ML}tensorflow2/lars_util.py L151; {_TPU}lars_util.py L61 (from 0)"),
    "schedule.power": (2.0, f"{_ML}tensorflow2/lars_util.py L125; {_TPU}lars_util.py L70"),
    "schedule.end_lr": (1.0e-4, f"{_ML}tensorflow2/lars_util.py L94; {_TPU}lars_util.py L66-70 "
                                "(tf.train.polynomial_decay's default end)"),
}
_MLPERF_OPT: Values = {
    "optimizer.eps": (1.0e-7, f"{_ML}tensorflow2/lars_optimizer.py L109 (epsilon 0 is falsy: Keras's 1e-7)"),
    "model.zero_init_last_bn": (False, f"{_ML}tensorflow2/resnet_model.py L119 (BatchNormalization, gamma 1)"),
}
_TPU_OPT: Values = {
    "optimizer.eps": (0.0, f"{_TF_LARS} L54 (epsilon default)"),
    "model.zero_init_last_bn": (True, f"{_TPU}resnet_model.py L168, L219 (init_zero=True)"),
}
_MLPERF_4K: Values = {  # the README's TPU-v3-64 set: lr 10.0 / 5 is also lars_util.py's row below 16,384
    **_MLPERF_OPT, "epochs": (42, f"{_ML}README.md L224 (--train_epochs=42)"),
    "label_smoothing": (0.1, f"{_ML}README.md L213 (--label_smoothing=0.1)"),
}
_TPU_16K: Values = {  # configs/cloud/v3-128.yaml: 7,116 steps x 16,384 / 1,281,167 = 91.0 epochs
    **_TPU_OPT, "epochs": (91, f"{_TPU_CFG}v3-128.yaml L2-3 (7116 steps at 16384)"),
    "label_smoothing": (0.1, f"{_TPU_CFG}v3-128.yaml L9"),
}
_TPU_32K: Values = {  # configs/cloud/v3-2048.yaml: 3,558 steps x 32,768 / 1,281,167 = 91.0 epochs
    **_TPU_OPT, "epochs": (91, f"{_TPU_CFG}v3-2048.yaml L2-3 (3558 steps at 32768)"),
    "label_smoothing": (0.1, f"{_TPU_CFG}v3-2048.yaml L9"),
}

_RN50_LARS = Family(
    models=("resnet50",), optimizer="lars", schedule="poly",
    schedule_source=f"{_ML}tensorflow2/lars_util.py L121-125; {_TPU}lars_util.py L66-71",
    common=_LARS_RN50_COMMON,
    points=(
        Point(2048, {**_MLPERF_OPT, "optimizer.lr": (8.5, f"{_ML}README.md L100 (--base_learning_rate=8.5)"),
                     "schedule.warmup_epochs": (5, f"{_ML}README.md L136"),
                     "epochs": (41, f"{_ML}README.md L132 (--train_epochs=41)"),
                     "label_smoothing": (0.1, f"{_ML}README.md L114 (--label_smoothing=0.1)")},
              "MLPerf reference, its 2K set"),
        Point(4096, {**_MLPERF_4K, "optimizer.lr": (10.0, f"{_ML}README.md L199 (--base_learning_rate=10.0)"),
                     "schedule.warmup_epochs": (5, f"{_ML}README.md L230")},
              "MLPerf reference, its 4K set"),
        Point(16384, {**_TPU_16K, "optimizer.lr": (25.0, f"{_TPU}lars_util.py L44-46 (batch <= 16384)"),
                      "schedule.warmup_epochs": (5, f"{_TPU}lars_util.py L44-46 (batch <= 16384)")},
              "tensorflow/tpu, its 16K config"),
        Point(32768, {**_TPU_32K, "optimizer.lr": (34.0, f"{_TPU}lars_util.py L47-49 (batch == 32768)"),
                      "schedule.warmup_epochs": (12, f"{_TPU}lars_util.py L47-49 (batch == 32768)")},
              "Ying et al. 2018 at 32K", 76.3),
        Point(65536, {**_TPU_OPT,
                      "optimizer.lr": (35.0, f"{_TPU}lars_util.py L50-52 (batch == 65536), as jia2018_rn50_64k"),
                      "schedule.warmup_epochs": (34, f"{_TPU}lars_util.py L50-52 (batch == 65536), "
                                                     "as jia2018_rn50_64k"),
                      "epochs": (90, "Jia et al. 2018 (arXiv 1807.11205), abstract"),
                      "label_smoothing": (0.0, "chosen: jia2018_rn50_64k (not among Jia et al.'s changes)")},
              "Jia et al. 2018 at 64K", 75.8),
    ),
    ranges=(
        Range(2048, 16384, {**_MLPERF_4K, "optimizer.lr": (10.0, f"{_ML}tensorflow2/lars_util.py L77-79"),
                            "schedule.warmup_epochs": (5, f"{_ML}tensorflow2/lars_util.py L77-79")},
              f"the row batch < 16384, 10.0 / 5 ({_ML}tensorflow2/lars_util.py L77-79; {_TPU_NOW}lars_util.py "
              "L48-50 agrees), with the rest of the MLPerf reference's 4K set"),
        Range(16384, 32768, {**_TPU_16K, "optimizer.lr": (25.0, f"{_TPU_NOW}lars_util.py L51-53"),
                             "schedule.warmup_epochs": (5, f"{_TPU_NOW}lars_util.py L51-53")},
              f"the row batch < 32768, 25 / 5 ({_TPU_NOW}lars_util.py L51-53; {_ML}tensorflow2/lars_util.py "
              "L80-82 agrees), with the rest of tensorflow/tpu's 16K config"),
        Range(32768, 65536, {**_TPU_32K, "optimizer.lr": (32.0, f"{_TPU_NOW}lars_util.py L54-56"),
                             "schedule.warmup_epochs": (14, f"{_TPU_NOW}lars_util.py L54-56")},
              f"the row batch < 65536, 32 / 14 ({_TPU_NOW}lars_util.py L54-56; the MLPerf reference's row, "
              "31.2 / 25, is not used: our 32K and 64K points are tensorflow/tpu's), with the rest of "
              "tensorflow/tpu's 32K config"),
        Range(65536, None, {**_TPU_OPT, "optimizer.lr": (35.6, f"{_TPU_NOW}lars_util.py L57-59"),
                            "schedule.warmup_epochs": (40, f"{_TPU_NOW}lars_util.py L57-59"),
                            "epochs": (90, "chosen: Jia et al. 2018's epochs at 64K (abstract)"),
                            "label_smoothing": (0.0, f"{_TPU_NOW}configs/resnet_config.py L38 (default)")},
              f"the row batch >= 65536, 35.6 / 40 ({_TPU_NOW}lars_util.py L57-59)"),
    ),
    linear_lr=False,
    beyond="no published ResNet-50 run trained past 64K to the target",
)

# --- EfficientNet, LARS: Wongpanich et al. 2020 ---------------------------------------------------
_WONG = "Wongpanich et al. 2020 (arXiv 2011.00071, their code)"
_EFFNET_COMMON: Values = {
    "optimizer.lr": (0.1, "chosen: 0.1 per 256 images, untuned"),
    **{k: (v, _WONG) for k, v in {
        "base_batch_size": 256, "lr_scaling": "linear", "optimizer.momentum": 0.9,
        "optimizer.trust_coefficient": 0.001, "optimizer.eps": 0.0, "optimizer.lr_in_momentum": True,
        "optimizer.weight_decay": 2.0e-5, "optimizer.exclude_bn_bias": True, "schedule.warmup_epochs": 5,
        "schedule.warmup_start_factor": 0.0, "schedule.power": 2.0, "schedule.end_lr": 0.1, "epochs": 350,
        "label_smoothing": 0.1, "model.zero_init_last_bn": False, "ema.enabled": True, "ema.decay": 0.9999,
        "ema.warmup": True, "ema.warmup_gamma": 9.0, "ema.warmup_power": 1.0, "ema.update_after_step": -2,
        "ema.target": "ema"}.items()},
}


def _effnet(model: str, batch: int, top1: float, drop_rate: float, image_size: int, beyond: str = "") -> Family:
    name = f"Wongpanich et al. 2020, {model[-2:].upper()} at {batch // 1024}K"
    values = {"target_top1": (top1, name), "model.drop_rate": (drop_rate, _WONG),
              "data.image_size": (image_size, _WONG)}
    return Family(models=(model,), optimizer="lars", schedule="poly", schedule_source=_WONG, common=_EFFNET_COMMON,
                  points=(Point(batch, values, name, top1),), linear_lr=True, beyond=beyond)


_EFFNET_B2 = _effnet("efficientnet_b2", 32768, 79.7, 0.3, 260)
_EFFNET_B5 = _effnet("efficientnet_b5", 65536, 83.0, 0.4, 456,
                     beyond="Wongpanich et al. 2020 trained B5 at 64K, their largest batch")

FAMILIES: tuple[Family, ...] = (_RN50_SGD, _RN50_LARS, _EFFNET_B2, _EFFNET_B5)

# Above this batch ResNet-50's default optimizer is LARS (Goyal et al.'s SGD holds to 8K).
SGD_UP_TO = 8192
_TARGET = (MLPERF_TARGET, "chosen: MLPerf Training's ResNet-50 target (training_rules.adoc)")

# base_batch_size's label where lr_scaling is none: no source, the arithmetic of the rule
PEAK_AT_BATCH = "follows from lr_scaling none: optimizer.lr is the peak at this batch"

# keys that set the lr together: a user who writes one of them writes the lr rule
LR_KEYS = ("optimizer.lr", "base_batch_size", "lr_scaling")
# keys of one decay: derived only when the schedule is the family's
_SCHEDULE_ONLY = {"step": ("schedule.milestones", "schedule.gamma"),
                  "poly": ("schedule.power", "schedule.end_lr")}


def families_for(model: str) -> list[Family]:
    return [f for f in FAMILIES if model in f.models]


@dataclass(frozen=True)
class UserLr:
    """The lr rule as the user's command composed it: ``optimizer.lr`` per ``base_batch_size`` images."""

    lr: float
    base_batch_size: int
    lr_scaling: str


@dataclass
class Derivation:
    """What the recipe sets: overrides to compose before the user's, and each value's source."""

    overrides: list[str] = field(default_factory=list)
    sources: dict[str, str] = field(default_factory=dict)  # key -> "value: label"
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
           schedule: Optional[str], written: Sequence[str], user_lr: Optional[UserLr] = None) -> Derivation:
    """The published recipe for ``model`` at ``global_batch_size``.

    ``optimizer`` and ``schedule`` are the group options the user chose (None: the recipe's);
    ``written`` the keys the user set (``optimizer.lr``, ``epochs``, ...), which the recipe
    leaves alone. ``global_batch_size`` None: the user did not set it (the recipe's default, 256).
    ``user_lr``: the user's lr rule where they set ``optimizer.lr``; a warning says what peak it
    becomes, and a peak over :data:`REFUSE_ABOVE` times every published peak is refused.
    """
    out = Derivation()
    if global_batch_size is None:
        global_batch_size = DEFAULT_BATCH
        out.overrides.append(f"global_batch_size={DEFAULT_BATCH}")
        out.sources["global_batch_size"] = f"{DEFAULT_BATCH}: {_GOYAL} sec. 5.1, the reference batch (set yours)"
    batch = global_batch_size
    fam = _family(model, optimizer, batch)
    skip = _group_choices(out, fam, batch, optimizer=optimizer, schedule=schedule, written=written)
    values = _values_at(out, fam, batch)
    values.setdefault("target_top1", _TARGET)
    if user_lr is not None:
        out.warnings.append(_user_lr_line(fam, batch, user_lr, values))
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
        out.sources["optimizer"] = f"{fam.optimizer}: {_optimizer_reason(fam)}"
    if schedule is None:
        out.overrides.append(f"schedule={fam.schedule}")
        out.sources["schedule"] = f"{fam.schedule}: {fam.schedule_source}"
        schedule = fam.schedule
    skip = set(written) | ({k for k in LR_KEYS} if lr_written else set())
    if "bn" in written:  # bn=global: the user's group, whose group_size a value override would replace
        skip.add("bn.group_size")
    for other, keys in _SCHEDULE_ONLY.items():
        if other != schedule:
            skip.update(keys)
    return skip


def _range_at(fam: Family, batch: int) -> Optional[Range]:
    for r in fam.ranges:
        if r.low < batch and (r.high is None or batch < r.high):
            return r
    return None


def _values_at(out: Derivation, fam: Family, batch: int) -> dict[str, tuple[Any, str]]:
    """Each key's value at ``batch`` with its label: the family's common values, then the published
    point at ``batch``; else the range row that holds ``batch`` (a warning says no run at that batch
    was reported); else the nearest point's (a warning names it where ``batch`` is outside the
    points), and the lr rule of a looked-up peak (:func:`_peak_rule`)."""
    values: dict[str, tuple[Any, str]] = dict(fam.common)
    at = [p for p in fam.points if p.batch == batch]
    row = None if at else _range_at(fam, batch)
    if at:
        values.update(at[0].values)
    elif row is not None:
        values.update(row.values)
        beyond = batch > fam.points[-1].batch
        out.warnings.append(
            f"global batch {batch}: no published run at this batch" + (" (beyond every published point)" if beyond
                                                                       else "") +
            f"; the references' rule: {row.rule}" + (f"; {fam.beyond}" if beyond and fam.beyond else ""))
    else:
        below = [p for p in fam.points if p.batch < batch]
        point = below[-1] if below else fam.points[0]
        values.update(point.values)
        if batch < fam.points[0].batch or batch > fam.points[-1].batch:
            where = "beyond every" if batch > point.batch else "below every"
            out.warnings.append(
                f"global batch {batch} is {where} published point of this recipe: using the nearest, "
                f"{_k(point.batch)} ({point.source})" + (f"; {fam.beyond}" if batch > point.batch and fam.beyond else ""))
    if not fam.linear_lr:
        values.update(_peak_rule(fam, batch))
    return values


def _peak_rule(fam: Family, batch: int) -> dict[str, tuple[Any, str]]:
    """A family whose lr is a peak looked up per batch, not a rate per ``base_batch_size`` images:
    ``base_batch_size`` (and ``lr_scaling``) that make the scaled lr that peak at ``batch``."""
    first = fam.points[0]
    if batch < first.batch:  # below the first point: its peak, scaled down by Goyal et al.'s linear rule
        return {"base_batch_size": (first.batch, f"chosen: {_k(first.batch)}'s peak ..."),
                "lr_scaling": ("linear", f"chosen: ... scaled linearly to this batch ({_GOYAL} sec. 2.1)")}
    return {"base_batch_size": (batch, PEAK_AT_BATCH)}


def _peak(lr: float, batch: int, base_batch_size: int, rule: str) -> float:
    """The lr at ``batch`` by ``lr_scaling``'s rule (``largebatch.lr.scaling.scale_lr``, which this
    ground module may not import: ``largebatch.lr`` imports torch, and the config pages are built
    without it)."""
    ratio = batch / base_batch_size
    return lr * {"linear": ratio, "sqrt": ratio ** 0.5, "none": 1.0}[rule]


def _largest_peak(fam: Family) -> tuple[float, str]:
    """The largest peak lr a published point or range row of ``fam`` gives, and where."""
    peaks = []
    for p in fam.points:
        v = {**fam.common, **p.values}
        lr = v["optimizer.lr"][0]
        peak = _peak(lr, p.batch, v["base_batch_size"][0], "linear") if fam.linear_lr else lr
        peaks.append((peak, f"at {_k(p.batch)}"))
    peaks += [(r.values["optimizer.lr"][0], f"past {_k(r.low)}") for r in fam.ranges]
    return max(peaks)


def _user_lr_line(fam: Family, batch: int, user: UserLr, values: Mapping[str, tuple[Any, str]]) -> str:
    """One line: the peak the user's lr becomes at ``batch`` against the recipe's; refused when far
    above every published peak (a user who typed the block's peak without its lr rule)."""
    peak = _peak(user.lr, batch, user.base_batch_size, user.lr_scaling)
    lr, base, rule = (values[k][0] for k in LR_KEYS)
    recipe = _peak(lr, batch, base, rule)
    largest, where = _largest_peak(fam)
    own = (f"optimizer.lr={_fmt(float(user.lr))} is per base_batch_size={user.base_batch_size} images, "
           f"lr_scaling={user.lr_scaling}: a peak of {peak:.4g} at global batch {batch}")
    theirs = (f"the recipe's peak here is {recipe:.4g} (optimizer.lr={_fmt(float(lr))} base_batch_size={base} "
              f"lr_scaling={rule})")
    if peak > REFUSE_ABOVE * largest:
        raise ConfigError(
            f"{own}, {peak / largest:.0f}x the largest published peak ({largest:.4g}, {where}); {theirs}: write "
            f"those three, or set recipe.mode=off to train with yours")
    if peak > largest:
        return f"WARNING: {own}, above every published peak (at most {largest:.4g}, {where}); {theirs}"
    return f"{own}; {theirs}"


# the block's order: what a reader checks first
_FIRST = ("optimizer.lr", "base_batch_size", "lr_scaling", "schedule.warmup_epochs", "epochs", "label_smoothing",
          "optimizer.weight_decay", "target_top1")


def _order(key: str) -> tuple[int, str]:
    return (_FIRST.index(key), "") if key in _FIRST else (len(_FIRST), key)


def _optimizer_reason(fam: Family) -> str:
    if fam.optimizer == "sgd":
        return f"{_GOYAL} Table 1, Fig. 1: SGD holds its accuracy up to {_k(SGD_UP_TO)}"
    if "resnet50" in fam.models:
        return (f"chosen: above {_k(SGD_UP_TO)} the published ResNet-50 runs use LARS (MLPerf reference, "
                "tensorflow/tpu, Jia et al. 2018)")
    return f"{_WONG}: LARS instead of RMSProp at large batch"


def describe(sources: Mapping[str, str], global_batch_size: int, model: str) -> list[str]:
    """The start-up block: one line per derived value, written as the override that reproduces it,
    with its label. The lr's line holds the whole lr rule (optimizer.lr, base_batch_size,
    lr_scaling) and the peak it gives at the batch."""
    if not sources:
        return []
    parsed = {k: text.split(": ", 1) for k, text in sources.items()}
    rows = []
    for key, (value, label) in parsed.items():
        if key in LR_KEYS[1:] and "optimizer.lr" in parsed:
            continue  # on the lr's line
        override = f"{key}={value}"
        if key == "optimizer.lr" and all(k in parsed for k in LR_KEYS):
            (base, _), (rule, _) = parsed["base_batch_size"], parsed["lr_scaling"]
            peak = _peak(float(value), global_batch_size, int(base), rule)
            override = f"optimizer.lr={value} base_batch_size={base} lr_scaling={rule}"
            # the lr's label, and the rule's where it is a choice (a LARS peak scaled below its first point)
            labels = [label] + [parsed[k][1] for k in LR_KEYS[1:] if parsed[k][1].startswith("chosen")]
            label = f"peak {peak:.4g} at {global_batch_size}: " + "; ".join(labels)
        rows.append((override, label))
    width = max(len(o) for o, _ in rows)
    lines = [f"ImageNet recipe for {model} at global batch {global_batch_size}, each value as the override "
             f"that reproduces it (recipe.mode=auto; a key you set wins, recipe.mode=off derives nothing):"]
    lines += [f"  {override:<{width}}  {label}" for override, label in rows]
    return lines


# --- The batch on each device, its BN batch and its memory -----------------------------------------
# The one measured memory figure: ResNet-50 at 224 px, bf16 (fp16 the same), channels-last, 256
# images per H100, a peak of 11.0 GiB allocated (torch.cuda.max_memory_allocated;
# benchmarks/README.md, "Training throughput", shown on docs/results.md). No second batch was measured, so its split is
# derived, not measured: a fixed part, the fp32 weights, gradients and momentum (3 x 102.2 MB, the
# gradient size in benchmarks/README.md's all-reduce table), and the rest, activations, taken as
# linear in the images per device (per micro-batch: accumulation does not keep them).
@dataclass(frozen=True)
class MemoryFigure:
    """A measured peak of device memory, split into a fixed part and a part per image."""

    model: str
    image_size: int
    precisions: tuple[str, ...]  # the measured precisions (auto: bf16 on every card of CARDS)
    batch: int  # images per device when measured
    peak_gib: float
    fixed_gib: float  # weights, gradients, optimizer state: not per image
    basis: str  # what was measured and where, and how it is split

    @property
    def per_image_gib(self) -> float:
        return (self.peak_gib - self.fixed_gib) / self.batch

    def estimate(self, images: int) -> float:
        return self.fixed_gib + self.per_image_gib * images


_RN50_FIXED_GIB = 3 * 102.2e6 / 2 ** 30
MEASURED_MEMORY: tuple[MemoryFigure, ...] = (
    MemoryFigure("resnet50", 224, ("bf16", "fp16", "auto"), 256, 11.0, _RN50_FIXED_GIB,
                 "estimate from resnet50 bf16 NHWC 224 px at 256 per H100, a peak of 11.0 GiB allocated "
                 f"(docs/results.md, its H100 throughput table): {_RN50_FIXED_GIB:.2f} GiB of fp32 weights, "
                 "gradients and momentum "
                 "(3 x 102.2 MB) plus the rest taken as linear in the images per device, "
                 f"{(11.0 - _RN50_FIXED_GIB) / 256 * 1024:.1f} MiB an image; the CUDA context and the "
                 "allocator's cache come on top"),
)
# Known cards and their memory, nominal GB (10^9 bytes, NVIDIA's data sheets), compared in GiB
CARDS: tuple[tuple[str, float], ...] = (("A100 40GB", 40.0), ("A100 80GB", 80.0), ("H100 80GB", 80.0),
                                         ("H200 141GB", 141.0))
# world sizes the block shows where the run's is not known yet (--cfg job): one node of 8 GPUs,
# and the README's and docs/scaling-out.md's sbatch --nodes=8 --gpus-per-node=8
EXAMPLE_WORLDS: tuple[tuple[int, str], ...] = ((8, "1 node x 8 GPUs"), (64, "8 nodes x 8 GPUs, the README's sbatch"))


def memory_figure(model: str, image_size: int, precision: str) -> Optional[MemoryFigure]:
    for m in MEASURED_MEMORY:
        if (m.model, m.image_size) == (model, image_size) and precision in m.precisions:
            return m
    return None


def bn_batch_of(model: str, optimizer: str) -> Optional[tuple[int, str]]:
    """The images each BN normalises over in the published runs of ``model`` with ``optimizer``,
    with its source (Goyal et al.'s 32 per worker for ResNet-50 with SGD), or None."""
    for f in families_for(model):
        if f.optimizer == optimizer:
            return f.bn_batch
    return None


def _fits(gib: float) -> str:
    short = [f"{name} ({gb * 1e9 / 2 ** 30:.1f} GiB)" for name, gb in CARDS if gib > gb * 1e9 / 2 ** 30]
    if not short:
        return ""
    return "; WARNING: does not fit " + (" or ".join(short) if len(short) < len(CARDS) else "any known card")


def _device_row(*, global_batch_size: int, world_size: int, accumulation_steps: int, bn_group_size: int,
                figure: Optional[MemoryFigure], bn_batch: Optional[tuple[int, str]]) -> str:
    """One line: the images per device at this world size, the BN batch, the memory estimate and
    the cards it does not fit, and the accumulation that keeps the published BN batch."""
    parts = world_size * accumulation_steps
    if global_batch_size % parts:
        return (f"{global_batch_size} is not a multiple of {world_size} devices x accumulation_steps "
                f"{accumulation_steps}: the run refuses it")
    per = global_batch_size // parts
    group = world_size if bn_group_size == -1 else min(bn_group_size, world_size)
    text = (f"{per} images per device x {world_size} devices x accumulation_steps {accumulation_steps}; BN over "
            f"{per * group} (bn.group_size={bn_group_size})")
    if figure is not None:
        gib = figure.estimate(per)
        text += f"; ~{gib:.1f} GiB a device{_fits(gib)}"
    if bn_batch is not None and per * group != bn_batch[0]:
        n = bn_batch[0]
        if n % group == 0 and global_batch_size % (world_size * (n // group)) == 0:
            keep = global_batch_size // (world_size * (n // group))
            text += (f"; accumulation_steps={keep} keeps BN over {n}"
                     + (f" (~{figure.estimate(n // group):.1f} GiB)" if figure is not None else ""))
        else:
            text += f"; no accumulation_steps gives BN over {n} at this world size"
    return text


def device_lines(*, model: str, optimizer: str, global_batch_size: int, world_size: Optional[int],
                 accumulation_steps: int, bn_group_size: int, precision: str, image_size: int) -> list[str]:
    """The per-device part of the start-up block: the images each device takes (global batch /
    (world size x accumulation_steps)), the images each BN normalises over, the accumulation that
    keeps the published runs' BN batch, and the memory a device needs, estimated from
    :data:`MEASURED_MEMORY`, with a warning for each card of :data:`CARDS` it does not fit.
    ``world_size`` None (``--cfg job``: the run's is known only when it starts): a line per
    :data:`EXAMPLE_WORLDS`."""
    figure = memory_figure(model, image_size, precision)
    bn_batch = bn_batch_of(model, optimizer)

    def row(world: int) -> str:
        return _device_row(global_batch_size=global_batch_size, world_size=world, accumulation_steps=accumulation_steps,
                           bn_group_size=bn_group_size, figure=figure, bn_batch=bn_batch)

    head = "per device"
    if bn_batch is not None:
        head += f" (the published BN batch: {bn_batch[0]}, {bn_batch[1]})"
    if world_size is not None:
        lines = [f"{head}: {row(world_size)}"]
    else:
        lines = [f"{head}: global batch {global_batch_size} / (world size x accumulation_steps), the world size "
                 f"known when the run starts; at"]
        lines += [f"  {world:>3} devices ({what}): {row(world)}"
                  for world, what in EXAMPLE_WORLDS]
    measured = ", ".join(f"{m.model} {m.image_size} px in {m.precisions[0]}" for m in MEASURED_MEMORY)
    lines.append(f"memory per device: {figure.basis}" if figure is not None else
                 f"memory per device: not estimated, no measured figure for {model} at {image_size} px in "
                 f"{precision} (measured: {measured})")
    return lines
