"""ImageNet at the user's own batch: the published recipe, derived per batch (issues 68, 87).

Sources of the expected values (each cited where it is used; read with git show <commit>:<path>):
- Goyal et al. 2017, arXiv 1706.02677, sec. 2.1, 2.2, 5.1: SGD, lr 0.1 x kn/256, 5 warmup
  epochs from 0.1, /10 at epochs 30, 60, 80, 90 epochs, weight decay 1e-4, Nesterov momentum 0.9.
- MLPerf Training ResNet-50 reference, mlcommons/training@3c81f6f retired_benchmarks/resnet-tf2:
  README.md (2K: lr 8.5, 41 epochs; 4K: lr 10.0, 42 epochs; 5 warmup epochs, label smoothing 0.1),
  tensorflow2/lars_util.py L77-85 (< 16384: 10.0 / 5; < 32768: 25.0 / 5; else 31.2 / 25).
- tensorflow/tpu models/official/resnet/lars_util.py poly_rate_schedule @b13e6b6 L44-55
  (<= 16384: 25 / 5; == 32768: 34 / 12; == 65536: 35 / 34; else 41 / 16) and @f59154b L48-59
  (< 16384: 10 / 5; < 32768: 25 / 5; < 65536: 32 / 14; else 35.6 / 40); configs/cloud/v3-128.yaml
  and v3-2048.yaml @8055210 (7,116 steps at 16,384 and 3,558 at 32,768: 91.0 epochs; smoothing 0.1).
- Wongpanich et al. 2020, arXiv 2011.00071: EfficientNet-B2 at 32K, B5 at 64K, LARS, lr per 256
  images scaled linearly, 350 epochs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from largebatch.cli import main
from largebatch.config import compose_config
from largebatch.imagenet_recipe import CARDS, FAMILIES, PEAK_AT_BATCH, _fmt, derive, describe, device_lines
from largebatch.errors import ConfigError

ROOT = "data.root=/data/imagenet"


def _compose(*overrides: str) -> Any:
    return compose_config(["data=imagenet", ROOT, *overrides])


def _plain(cfg: Any, key: str) -> Any:
    value = OmegaConf.select(cfg, key)
    value = OmegaConf.to_container(value) if OmegaConf.is_config(value) else value
    return getattr(value, "value", value)  # a choice (Enum) as its string


def test_imagenet_without_a_batch_is_goyal_at_256_not_the_embedded_toy_recipe() -> None:
    cfg = _compose()
    # Goyal et al. 2017 sec. 5.1: ResNet-50, kn=256 reference, 90 epochs, lr 0.1 per 256, /10 at 30/60/80
    assert cfg.model.name == "resnet50" and cfg.global_batch_size == 256
    assert cfg.optimizer.name == "sgd" and cfg.optimizer.lr == 0.1 and _plain(cfg, "lr_scaling") == "linear"
    assert cfg.optimizer.nesterov is True and cfg.optimizer.weight_decay == 1e-4 and cfg.optimizer.exclude_bn_bias
    assert _plain(cfg, "schedule.name") == "step" and list(cfg.schedule.milestones) == [30, 60, 80]
    assert cfg.schedule.warmup_epochs == 5 and _plain(cfg, "schedule.warmup_start") == "base_lr"  # sec. 2.2
    assert cfg.epochs == 90 and cfg.label_smoothing == 0.0
    assert cfg.target_top1 == 75.9  # MLPerf's yardstick
    assert "epochs" in cfg.recipe.derived and "Goyal" in cfg.recipe.derived["epochs"]


def test_the_embedded_default_run_and_the_presets_are_unchanged() -> None:
    cfg = compose_config([])
    assert (cfg.epochs, cfg.schedule.warmup_epochs, cfg.target_top1, cfg.model.name) == (8, 1, 90.0, "resnet10t")
    assert dict(cfg.recipe.derived) == {}
    preset = compose_config(["experiment=mlperf_rn50", ROOT])
    assert dict(preset.recipe.derived) == {} and preset.optimizer.lr == 8.5 and preset.epochs == 41
    off = _compose("model=resnet50", "recipe.mode=off")
    assert off.epochs == 8 and dict(off.recipe.derived) == {}


@pytest.mark.parametrize("batch", [1024, 4096, 8192])
def test_resnet50_up_to_8k_is_goyal_sgd_scaled_linearly(batch: int) -> None:
    cfg = _compose("model=resnet50", f"global_batch_size={batch}")
    assert cfg.optimizer.name == "sgd" and cfg.base_batch_size == 256 and cfg.optimizer.lr == 0.1
    assert cfg.epochs == 90 and cfg.schedule.warmup_epochs == 5 and list(cfg.recipe.warnings) == []


@pytest.mark.parametrize("batch, lr, warmup, epochs, smoothing", [
    (2048, 8.5, 5, 41, 0.1),  # MLPerf reference, GPU-V100-8 set
    (4096, 10.0, 5, 42, 0.1),  # MLPerf reference, TPU-v3-64 set
    (16384, 25.0, 5, 91, 0.1),  # tensorflow/tpu lars_util.py @b13e6b6 L44-46; v3-128.yaml: 7,116 steps = 91.0 epochs
    (32768, 34.0, 12, 91, 0.1),  # Ying et al. 2018: the 32,768 row and v3-2048.yaml (3,558 steps)
    (65536, 35.0, 34, 90, 0.0),  # Jia et al. 2018 (90 epochs), the 65,536 row
])
def test_resnet50_lars_at_each_published_point(batch: int, lr: float, warmup: float, epochs: int,
                                                smoothing: float) -> None:
    cfg = _compose("model=resnet50", "optimizer=lars", f"global_batch_size={batch}")
    assert _plain(cfg, "schedule.name") == "poly" and cfg.schedule.power == 2.0 and cfg.schedule.end_lr == 1e-4
    assert _plain(cfg, "lr_scaling") == "none" and cfg.base_batch_size == batch  # the lr is the peak, looked up
    assert (cfg.optimizer.lr, cfg.schedule.warmup_epochs, cfg.epochs, cfg.label_smoothing) == (lr, warmup, epochs,
                                                                                               smoothing)
    assert cfg.schedule.warmup_start_factor == 0.0 and list(cfg.recipe.warnings) == []


# The references' rule between and past the points (issue 87): a lookup by batch range, one set per
# range from one reference. (batch, optimizer) -> lr, warmup, (epochs, smoothing, eps, zero-init),
# and whether a run at that batch was reported.
_MLPERF_4K = (42, 0.1, 1e-7, False)  # README L224, L213; lars_optimizer.py L109; resnet_model.py L119
_TPU_16K = (91, 0.1, 0.0, True)  # v3-128.yaml L2-3, L9; LARSOptimizer epsilon=0.0; init_zero=True
_TPU_32K = (91, 0.1, 0.0, True)  # v3-2048.yaml L2-3, L9


@pytest.mark.parametrize("batch, optimizer, lr, warmup, rest, published", [
    (2048, "lars", 8.5, 5, (41, 0.1, 1e-7, False), True),  # MLPerf README's 2K set (L100, L132, L136)
    (8192, "lars", 10.0, 5, _MLPERF_4K, False),  # MLPerf lars_util.py L77-79 (< 16384), tf/tpu @f59154b L48-50
    (12288, None, 10.0, 5, _MLPERF_4K, False),  # the same row (was 21.89, interpolated, with 90 epochs)
    (16384, None, 25.0, 5, _TPU_16K, True),  # tf/tpu @b13e6b6 L44-46 (<= 16384) and v3-128.yaml
    (24576, None, 25.0, 5, _TPU_16K, False),  # tf/tpu @f59154b L51-53 (< 32768); MLPerf L80-82 agrees
    (32768, None, 34.0, 12, _TPU_32K, True),  # Ying et al.: tf/tpu @b13e6b6 L47-49, v3-2048.yaml
    (49152, None, 32.0, 14, _TPU_32K, False),  # tf/tpu @f59154b L54-56 (< 65536)
    (65536, None, 35.0, 34, (90, 0.0, 0.0, True), True),  # Jia et al.'s 90 epochs, tf/tpu @b13e6b6 L50-52
    (131072, None, 35.6, 40, (90, 0.0, 0.0, True), False),  # tf/tpu @f59154b L57-59 (>= 65536)
])
def test_between_and_past_the_points_the_references_lookup_by_batch_range(
        batch: int, optimizer: str, lr: float, warmup: int, rest: tuple, published: bool) -> None:
    cfg = _compose(f"global_batch_size={batch}", *([f"optimizer={optimizer}"] if optimizer else []))
    assert cfg.optimizer.name == "lars" and _plain(cfg, "lr_scaling") == "none" and cfg.base_batch_size == batch
    got = (cfg.optimizer.lr, cfg.schedule.warmup_epochs, cfg.epochs, cfg.label_smoothing, cfg.optimizer.eps,
           cfg.model.zero_init_last_bn)
    assert got == (lr, warmup, *rest)
    notes = [w for w in cfg.recipe.warnings if "no published run at this batch" in w]
    assert len(notes) == (0 if published else 1)
    if not published:  # the note names the row it follows, with its file, commit and lines
        assert "lars_util.py" in notes[0] and "@" in notes[0] and " L" in notes[0]


def test_one_set_per_range_no_key_jumps_to_a_nearer_point() -> None:
    def values(batch: int) -> dict:
        cfg = _compose(f"global_batch_size={batch}", "optimizer=lars")
        return {k: _plain(cfg, k) for k in cfg.recipe.derived if k != "base_batch_size"}

    assert values(8192) == values(15360) and values(17408) == values(31744) and values(33792) == values(64512)


def test_a_batch_beyond_every_point_follows_the_last_row_and_says_no_run_reached_it() -> None:
    cfg = _compose("global_batch_size=131072")
    assert cfg.optimizer.lr == 35.6 and cfg.schedule.warmup_epochs == 40  # tf/tpu @f59154b L57-59
    [warning] = cfg.recipe.warnings
    assert "131072" in warning and "beyond every published point" in warning and "past 64K" in warning
    sgd = _compose("optimizer=sgd", "global_batch_size=16384")
    [warning] = sgd.recipe.warnings
    assert "8K" in warning and "optimizer=lars" in warning


def test_every_key_the_user_sets_wins_and_is_not_listed_as_derived() -> None:
    cfg = _compose("optimizer=lars", "global_batch_size=16384", "epochs=40", "schedule.warmup_epochs=8",
                   "optimizer.weight_decay=5e-5", "target_top1=76.5")
    assert (cfg.epochs, cfg.schedule.warmup_epochs, cfg.optimizer.weight_decay, cfg.target_top1) == (40, 8, 5e-5, 76.5)
    assert cfg.optimizer.lr == 25.0
    assert not {"epochs", "schedule.warmup_epochs", "optimizer.weight_decay", "target_top1"} & set(cfg.recipe.derived)
    # the lr as the user wrote it: per base_batch_size images, scaled by lr_scaling (conf/train.yaml)
    own = _compose("optimizer=lars", "global_batch_size=16384", "optimizer.lr=0.2")
    assert own.optimizer.lr == 0.2 and own.base_batch_size == 256 and _plain(own, "lr_scaling") == "linear"
    assert not {"optimizer.lr", "base_batch_size", "lr_scaling"} & set(own.recipe.derived)
    # the user's schedule: its warmup is derived, the recipe's decay-specific keys are not
    cosine = _compose("schedule=cosine", "global_batch_size=32768")
    assert _plain(cosine, "schedule.name") == "cosine" and cosine.schedule.warmup_epochs == 12
    assert "schedule.power" not in cosine.recipe.derived


@pytest.mark.parametrize("overrides, says", [
    (["model=resnet18"], "model resnet18 has no published ImageNet recipe"),
    (["model=resnet50", "optimizer=lamb"], "optimizer=lamb has no published ImageNet recipe"),
    (["lr_scaling=sqrt"], "lr_scaling is set but optimizer.lr is not"),
])
def test_what_no_recipe_covers_is_one_line(overrides: list[str], says: str) -> None:
    with pytest.raises(ConfigError, match=says) as e:
        _compose(*overrides)
    assert "\n" not in str(e.value) and "recipe.mode=off" in str(e.value) or "optimizer.lr" in str(e.value)


def test_no_recipe_exits_2_with_one_line_and_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "runs"
    assert main(["data=imagenet", f"data.root={tmp_path}", "model=resnet18", f"output_root={out}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no published ImageNet recipe" in err[0]
    assert not out.exists()


@pytest.mark.parametrize("model, batch", [("efficientnet_b2", 32768), ("efficientnet_b5", 65536)])
def test_efficientnet_at_its_published_point_is_the_wongpanich_preset(model: str, batch: int) -> None:
    preset = compose_config([f"experiment=wongpanich2020_effnet_{model[-2:]}", ROOT])
    cfg = _compose(f"model={model}", f"global_batch_size={batch}")
    for key in cfg.recipe.derived:
        assert _plain(cfg, key) == _plain(preset, key), key
    assert cfg.optimizer.name == "lars" and cfg.epochs == 350 and cfg.ema.enabled  # Wongpanich et al. 2020
    below = _compose(f"model={model}", "global_batch_size=4096")
    assert below.optimizer.lr == 0.1 and _plain(below, "lr_scaling") == "linear"  # per 256, scaled linearly
    assert "below every published point" in below.recipe.warnings[0]


# (preset, the user's command that lands on its point, the keys where the two differ and why)
_PRESETS = [
    ("goyal2017_rn50_8k", ["global_batch_size=8192"], set()),
    ("mlperf_rn50", ["optimizer=lars", "global_batch_size=2048"], set()),
    ("ying2018_rn50_32k_tpu", ["global_batch_size=32768"], set()),
    # the paper's own result is the preset's target; the recipe's is MLPerf's, as for every ResNet-50
    ("jia2018_rn50_64k", ["global_batch_size=65536"], {"target_top1"}),
]


@pytest.mark.parametrize("preset, command, differ", _PRESETS)
def test_each_resnet50_point_agrees_with_its_preset(preset: str, command: list[str], differ: set[str]) -> None:
    """The recipe's table and conf/experiment/ are written apart: this holds them together."""
    expected = compose_config([f"experiment={preset}", ROOT])
    cfg = _compose("model=resnet50", *command)
    keys = set(cfg.recipe.derived) - differ - {"optimizer", "schedule", "model"}
    assert keys, "the recipe derived nothing"
    mismatched = {k: (_plain(cfg, k), _plain(expected, k)) for k in keys if _plain(cfg, k) != _plain(expected, k)}
    assert mismatched == {}
    assert cfg.optimizer.name == expected.optimizer.name and _plain(cfg, "schedule.name") == _plain(expected, "schedule.name")


def test_every_family_derives_at_every_point() -> None:
    for family in FAMILIES:
        for point in family.points:
            out = derive(model=family.models[0], global_batch_size=point.batch, optimizer=family.optimizer,
                         schedule=None, written=[])
            assert out.warnings == [] and "optimizer.lr" in out.sources, (family.models, point.batch)


def test_a_run_logs_the_recipe_block_and_writes_it_to_summary_and_config(tmp_path: Path) -> None:
    from largebatch.data.synthetic import make_synthetic_imagenet

    root = make_synthetic_imagenet(tmp_path / "data", num_classes=2, train_per_class=8, val_per_class=2, image_size=36)
    run_dir = tmp_path / "run"
    code = main(["data=imagenet", f"data.root={root}", "global_batch_size=8", "data.image_size=32",
                 "data.workers=0", "data.loader=torchvision", "max_steps=1", "epochs=1", "progress=false",
                 "backend=cpu", "precision=fp32", f"run_dir={run_dir}", "tensorboard=false"])
    assert code == 0
    log = (run_dir / "train.log").read_text()
    assert "ImageNet recipe for resnet50 at global batch 8" in log
    assert "Goyal et al. 2017" in log and "below every published point" in log  # 8 < Goyal's 256
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["recipe"]["optimizer.lr"].startswith("0.1: ") and summary["recipe_warnings"]
    config = OmegaConf.load(run_dir / "config.yaml")
    assert config.recipe.derived["schedule.milestones"].startswith("[30,60,80]: ") and "epochs" not in config.recipe.derived


def test_a_multirun_job_gets_the_recipe_for_its_own_model(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Hydra's sweeper composes each job itself: the recipe must reach it as it reaches a single run."""
    from largebatch.data.synthetic import make_synthetic_imagenet

    root = make_synthetic_imagenet(tmp_path / "data", num_classes=2, train_per_class=8, val_per_class=2, image_size=36)
    sweep = tmp_path / "sweep"
    code = main(["-m", "data=imagenet", f"data.root={root}", "model=resnet18,resnet50", "global_batch_size=8",
                 "data.image_size=32", "data.workers=0", "data.loader=torchvision", "max_steps=1", "epochs=1",
                 "progress=false", "backend=cpu", "precision=fp32", "tensorboard=false", f"hydra.sweep.dir={sweep}"])
    assert code == 2  # the worst job's code: resnet18 has no published recipe
    assert "model resnet18 has no published ImageNet recipe" in capsys.readouterr().err
    summary = json.loads((sweep / "1" / "summary.json").read_text())
    assert summary["model"] == "resnet50" and summary["recipe"]["optimizer"].startswith("sgd: ")


def test_lars_below_its_first_point_scales_that_peak_linearly_and_says_so() -> None:
    cfg = _compose("optimizer=lars", "global_batch_size=1024")
    # the MLPerf reference's 2K peak, 8.5, scaled by 1024 / 2048 (Goyal et al.'s linear rule)
    assert (cfg.optimizer.lr, cfg.base_batch_size, _plain(cfg, "lr_scaling")) == (8.5, 2048, "linear")
    assert "below every published point" in cfg.recipe.warnings[0] and "2K" in cfg.recipe.warnings[0]


def _imagenet_commands() -> list[tuple[str, list[str]]]:
    """Every shell command of the README and the site that trains on ``data=imagenet`` without a
    preset: (where, its Hydra overrides), as a user would type it."""
    import re
    import shlex

    from tests.docs_text import doc_files

    found = []
    for page in doc_files():
        for block in re.findall(r"```bash\n(.*?)```", page.read_text(encoding="utf-8"), flags=re.S):
            for command in block.replace("\\\n", " ").splitlines():
                words = shlex.split(command, comments=True)
                if "data=imagenet" not in words or any(w.startswith("experiment=") for w in words):
                    continue
                overrides = [w for w in words if "=" in w and not w.startswith(("-", "hydra"))
                             and not re.match(r"^[A-Z_]+=", w) and w != "data=imagenet"]
                # a sweep (-m ... optimizer=sgd,lars): its first job
                overrides = [re.sub(r"^([\w.]+)=([^\[,]+),.*$", r"\1=\2", w) for w in overrides]
                found.append((f"{page.name}: {command.strip()[:60]}", ["data=imagenet", *overrides]))
    return found


def test_every_imagenet_command_of_the_docs_composes_a_published_recipe(capsys: pytest.CaptureFixture) -> None:
    import yaml

    commands = _imagenet_commands()
    assert len(commands) >= 10  # README, scaling-out, input pipelines, this recipe's own page, ...
    bad = []
    for where, overrides in commands:
        assert main(["--cfg", "job", *overrides]) == 0, where
        out, err = capsys.readouterr()
        cfg = yaml.safe_load(out)
        written = {o.split("=")[0] for o in overrides}
        # what the command does not set is the published recipe's, never the embedded run's (8, 1, 90.0)
        sane = ("ImageNet recipe for" in err and ("epochs" in written or cfg["epochs"] >= 40)
                and ("schedule.warmup_epochs" in written or cfg["schedule"]["warmup_epochs"] >= 5)
                and ("target_top1" in written or cfg["target_top1"] in (75.9, 79.7, 83.0)))
        if not sane:
            bad.append((where, cfg["epochs"], cfg["schedule"]["warmup_epochs"], cfg["target_top1"]))
    assert bad == []


# Each printed value's label names the file at a commit and its lines, or the paper's section, or says
# "chosen" (issue 87). (global batch, optimizer, key) -> the value, its label, and what the cited
# lines hold (read with git show <commit>:<path>; the label's commit and lines are those read).
_LABELS = [
    (2048, "lars", "optimizer.lr", 8.5, "mlcommons/training@3c81f6f retired_benchmarks/resnet-tf2/README.md L100",
     "--base_learning_rate=8.5"),
    (2048, "lars", "epochs", 41, "resnet-tf2/README.md L132", "--train_epochs=41"),
    (4096, "lars", "epochs", 42, "resnet-tf2/README.md L224", "--train_epochs=42"),
    (4096, "lars", "optimizer.eps", 1e-7, "tensorflow2/lars_optimizer.py L109",
     "self.epsilon = epsilon or backend_config.epsilon()"),
    (4096, "lars", "model.zero_init_last_bn", False, "tensorflow2/resnet_model.py L119", "layers.BatchNormalization("),
    (12288, "lars", "optimizer.lr", 10.0, "resnet-tf2/tensorflow2/lars_util.py L77-79",
     "if batch_size < 16384: self.initial_learning_rate = 10.0; warmup_epochs_ = 5"),
    (12288, "lars", "epochs", 42, "resnet-tf2/README.md L224", "--train_epochs=42"),
    (16384, "lars", "optimizer.lr", 25.0, "tensorflow/tpu@b13e6b6 models/official/resnet/lars_util.py L44-46",
     "if FLAGS.train_batch_size <= 16384: plr = 25.0; w_epochs = 5"),
    (16384, "lars", "epochs", 91, "tensorflow/tpu@8055210 models/official/resnet/configs/cloud/v3-128.yaml L2-3",
     "train_steps: 7116; train_batch_size: 16384 (91.0 epochs)"),
    (16384, "lars", "label_smoothing", 0.1, "configs/cloud/v3-128.yaml L9", "label_smoothing: 0.1"),
    (16384, "lars", "optimizer.eps", 0.0, "tensorflow/tensorflow@5c8077a tensorflow/contrib/opt/python/training/"
     "lars_optimizer.py L54", "epsilon=0.0,"),
    (16384, "lars", "model.zero_init_last_bn", True, "models/official/resnet/resnet_model.py L168, L219",
     "batch_norm_relu(inputs, is_training, relu=False, init_zero=True,"),
    (24576, "lars", "optimizer.lr", 25.0, "tensorflow/tpu@f59154b models/official/resnet/lars_util.py L51-53",
     "elif batch_size < 32768: plr = 25.0; w_epochs = 5"),
    (32768, "lars", "optimizer.lr", 34.0, "tensorflow/tpu@b13e6b6 models/official/resnet/lars_util.py L47-49",
     "elif FLAGS.train_batch_size == 32768: plr = 34.0; w_epochs = 12"),
    (32768, "lars", "epochs", 91, "configs/cloud/v3-2048.yaml L2-3", "train_steps: 3558; train_batch_size: 32768"),
    (49152, "lars", "schedule.warmup_epochs", 14, "tensorflow/tpu@f59154b models/official/resnet/lars_util.py L54-56",
     "elif batch_size < 65536: plr = 32.0; w_epochs = 14"),
    (65536, "lars", "optimizer.lr", 35.0, "tensorflow/tpu@b13e6b6 models/official/resnet/lars_util.py L50-52",
     "elif FLAGS.train_batch_size == 65536: plr = 35.0; w_epochs = 34"),
    (65536, "lars", "epochs", 90, "Jia et al. 2018 (arXiv 1807.11205), abstract", "90 epochs, 64K"),
    (65536, "lars", "label_smoothing", 0.0, "chosen: jia2018_rn50_64k", None),
    (131072, "lars", "optimizer.lr", 35.6, "tensorflow/tpu@f59154b models/official/resnet/lars_util.py L57-59",
     "else: plr = 35.6; w_epochs = 40"),
    (131072, "lars", "label_smoothing", 0.0, "tensorflow/tpu@f59154b models/official/resnet/configs/resnet_config.py "
     "L38", "'label_smoothing': 0.0,"),
    (8192, "sgd", "optimizer.exclude_bn_bias", True, "sec. 5.1 for BN gamma/beta; chosen for the fc bias", None),
    (8192, "sgd", "label_smoothing", 0.0, "chosen:", None),
    (8192, "sgd", "schedule.milestones", [30, 60, 80], "Goyal et al. 2017 (arXiv 1706.02677) sec. 5.1", None),
]


@pytest.mark.parametrize("batch, optimizer, key, value, label, holds", _LABELS)
def test_each_label_names_where_its_value_is(batch: int, optimizer: str, key: str, value: Any, label: str,
                                             holds: Any) -> None:
    out = derive(model="resnet50", global_batch_size=batch, optimizer=optimizer, schedule=None, written=[])
    shown, _, text = out.sources[key].partition(": ")
    assert shown == _fmt(value) and label in text


@pytest.mark.parametrize("batch", [256, 2048, 4096, 8192, 12288, 16384, 24576, 32768, 49152, 65536, 131072])
def test_every_resnet50_label_cites_a_file_at_a_commit_or_a_section_or_says_chosen(batch: int) -> None:
    import re

    for optimizer in ("sgd", "lars"):
        out = derive(model="resnet50", global_batch_size=batch, optimizer=optimizer, schedule=None, written=[])
        for key, source in out.sources.items():
            text = source.partition(": ")[2]
            cited = re.search(r"@[0-9a-f]{7} \S+ L\d+", text) or re.search(r"(sec\.|abstract|Table \d|Fig\. \d)", text)
            assert cited or text.startswith("chosen") or text == PEAK_AT_BATCH, (batch, optimizer, key, text)


def test_the_block_writes_each_value_as_the_override_that_reproduces_it() -> None:
    cfg = _compose("global_batch_size=32768")
    block = "\n".join(describe(cfg.recipe.derived, 32768, "resnet50"))
    assert "optimizer.lr=34.0 base_batch_size=32768 lr_scaling=none  peak 34 at 32768: tensorflow/tpu@b13e6b6" in block
    assert "\n  schedule.warmup_epochs=12 " in block and "\n  epochs=91 " in block
    again = _compose("global_batch_size=32768", "optimizer.lr=34.0", "base_batch_size=32768", "lr_scaling=none")
    assert (again.optimizer.lr, again.base_batch_size, _plain(again, "lr_scaling")) == (34.0, 32768, "none")


def test_a_users_own_lr_gets_one_line_saying_the_peak_it_becomes() -> None:
    cfg = _compose("global_batch_size=32768", "optimizer.lr=0.2")  # per 256, linear: 0.2 x 128
    [line] = [w for w in cfg.recipe.warnings if w.startswith("optimizer.lr=")]
    assert "a peak of 25.6 at global batch 32768" in line and "optimizer.lr=34.0 base_batch_size=32768" in line
    loud = _compose("global_batch_size=8192", "optimizer.lr=0.5")  # SGD: 16.0 against Goyal's 3.2 at 8K
    assert any(w.startswith("WARNING: ") and "above every published peak" in w for w in loud.recipe.warnings)


def test_the_block_peak_typed_as_the_lr_is_refused_in_one_line_exit_2(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(ConfigError, match=r"a peak of 4352 at global batch 32768"):
        _compose("global_batch_size=32768", "optimizer.lr=34.0")  # 34.0 per 256 images: 128x the peak
    assert main(["--cfg", "job", "data=imagenet", ROOT, "global_batch_size=32768", "optimizer.lr=34.0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "optimizer.lr=34.0 base_batch_size=32768 lr_scaling=none" in err[0]


@pytest.mark.parametrize("rule", ["linear", "sqrt", "none"])
def test_the_recipes_peak_is_lr_scalings_rule(rule: str) -> None:
    """The recipe (a ground module, no torch) writes lr_scaling's three rules again: held together here."""
    from largebatch.imagenet_recipe import _peak
    from largebatch.lr.scaling import scale_lr

    assert _peak(0.1, 32768, 256, rule) == pytest.approx(scale_lr(0.1, 32768, 256, rule))


def test_cfg_job_shows_the_derived_values_and_warnings_the_run_gets(capsys: pytest.CaptureFixture) -> None:
    import yaml

    assert main(["--cfg", "job", "data=imagenet", ROOT, "global_batch_size=49152"]) == 0
    shown = yaml.safe_load(capsys.readouterr().out)["recipe"]
    assert shown["derived"]["optimizer.lr"].startswith("32.0: tensorflow/tpu@f59154b")
    assert len(shown["warnings"]) == 1 and "no published run at this batch" in shown["warnings"][0]


# issue 87, item 5: the batch on each device, its BN batch and its memory
def _devices(batch: int, world: Any, *, optimizer: str = "sgd", accumulation: int = 1, group: int = 1,
             precision: str = "bf16") -> list[str]:
    return device_lines(model="resnet50", optimizer=optimizer, global_batch_size=batch, world_size=world,
                        accumulation_steps=accumulation, bn_group_size=group, precision=precision, image_size=224)


def test_the_readmes_sbatch_is_128_per_gpu_and_the_line_says_what_keeps_goyals_bn_batch(
        capsys: pytest.CaptureFixture) -> None:
    """README: sbatch --nodes=8 --gpus-per-node=8 launch/slurm.sbatch experiment=goyal2017_rn50_8k: 64
    GPUs at 8,192 is 128 per GPU; the preset's header asks for BN over 32 (Goyal et al. sec. 2.3, 5.1),
    i.e. accumulation_steps=4 at 64 GPUs (and =32 on the header's 8 GPUs)."""
    [line, basis] = _devices(8192, 64, precision="fp32")  # the preset trains in fp32
    assert "128 images per device x 64 devices x accumulation_steps 1; BN over 128 (bn.group_size=1)" in line
    assert "published BN batch: 32, Goyal et al. 2017" in line and "accumulation_steps=4 keeps BN over 32" in line
    assert "not estimated" in basis and "fp32" in basis  # no fp32 figure was measured
    assert main(["--cfg", "job", "experiment=goyal2017_rn50_8k", ROOT]) == 0
    err = capsys.readouterr().err
    assert "64 devices (8 nodes x 8 GPUs, the README's sbatch): 128 images per device" in err
    assert "8 devices (1 node x 8 GPUs): 1024 images per device" in err and "accumulation_steps=32 keeps BN over 32" in err
    kept = _devices(8192, 64, accumulation=4)[0]
    assert "32 images per device x 64 devices x accumulation_steps 4; BN over 32" in kept and "keeps" not in kept


def test_the_memory_estimate_is_the_measured_figure_split_and_warns_per_card() -> None:
    # 11.0 GiB at 256 per H100 (bf16, NHWC): 3 x 102.2 MB fixed, the rest per image
    [line, basis] = _devices(16384, 32, optimizer="lars")  # 512 per GPU
    assert "~21.7 GiB a device" in line and "WARNING" not in line and "11.0 GiB" in basis
    assert "~11.0 GiB a device" in _devices(256 * 8, 8, optimizer="lars")[0]  # the measured point itself
    big = _devices(8192, 8)[0]  # 1,024 per GPU: ~43 GiB
    assert "~43.1 GiB a device; WARNING: does not fit A100 40GB (37.3 GiB)" in big
    assert "accumulation_steps=32 keeps BN over 32 (~1.6 GiB)" in big
    none = _devices(65536, 16, optimizer="lars")[0]  # 4,096 per GPU
    assert "does not fit any known card" in none and len(CARDS) == 4


def test_the_sgd_recipe_carries_goyals_per_worker_bn_and_a_users_bn_wins() -> None:
    cfg = _compose("global_batch_size=4096")
    assert cfg.bn.group_size == 1 and "sec. 2.3, 5.1" in cfg.recipe.derived["bn.group_size"]
    mine = _compose("global_batch_size=4096", "bn=global")
    assert mine.bn.group_size == -1 and "bn.group_size" not in mine.recipe.derived


def test_the_docs_4k_example_normalises_over_goyals_32(capsys: pytest.CaptureFixture) -> None:
    """docs/imagenet.md: 8 GPUs at 4K with accumulation_steps=16 is 32 images per micro-batch."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "imagenet.md").read_text(encoding="utf-8")
    assert "global_batch_size=4096 accumulation_steps=16" in text
    line = _devices(4096, 8, accumulation=16)[0]
    assert "32 images per device x 8 devices x accumulation_steps 16; BN over 32" in line and "keeps" not in line


def test_the_run_start_says_the_batch_bn_batch_and_memory_of_each_device(tmp_path: Path,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    """Issue 87 item 5 at run start, where the world size is known: a run on a data set of the
    user's logs its per-device line (the run's own world size, not the examples) after the batch
    arithmetic, a card it will not fit as a warning; the embedded set's CPU run logs none."""
    from largebatch.parts.record import announce

    resolved = dict(global_batch_size=8192, per_device_batch_size=128, world_size=64, accumulation_steps=1,
                    lr_per_base_batch=0.1, base_batch_size=256, lr_scaling="linear", lr=3.2, steps_per_epoch=156,
                    warmup_steps=780, warmup_epochs=5, precision="bf16", backend="cuda", batch_schedule=None,
                    recipe=None, recipe_warnings=[], model="resnet50", optimizer="sgd", bn_group_size=1, image_size=224)
    with caplog.at_level("INFO", logger="largebatch"):
        announce(resolved, tmp_path, None, 90, devices=True)
    lines = [r.getMessage() for r in caplog.records]
    (per_device,) = [line for line in lines if line.startswith("per device")]
    assert "128 images per device x 64 devices x accumulation_steps 1" in per_device
    assert "accumulation_steps=4 keeps BN over 32" in per_device and "at\n" not in per_device
    assert any(line.startswith("memory per device") for line in lines)
    caplog.clear()
    with caplog.at_level("INFO", logger="largebatch"):
        announce(dict(resolved, world_size=1, per_device_batch_size=8192), tmp_path, None, 90, devices=True)
    assert any(r.levelname == "WARNING" and "does not fit" in r.getMessage() for r in caplog.records)
    caplog.clear()
    with caplog.at_level("INFO", logger="largebatch"):
        announce(resolved, tmp_path, None, 90, devices=False)
    assert not any(r.getMessage().startswith(("per device", "memory per device")) for r in caplog.records)
