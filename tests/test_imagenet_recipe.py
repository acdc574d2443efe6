"""ImageNet at the user's own batch: the published recipe, derived per batch (issue 68).

Sources of the expected values (each cited where it is used):
- Goyal et al. 2017, arXiv 1706.02677, sec. 2.1, 2.2, 5.1: SGD, lr 0.1 x kn/256, 5 warmup
  epochs from 0.1, /10 at epochs 30, 60, 80, 90 epochs, weight decay 1e-4, Nesterov momentum 0.9.
- MLPerf Training ResNet-50 reference (mlcommons/training resnet-tf2 README): batch 2,048 lr 8.5,
  batch 4,096 lr 10.0, 5 warmup epochs, 41 / 42 epochs, label smoothing 0.1, target 75.90%.
- tensorflow/tpu models/official/resnet/lars_util.py @b13e6b6 poly_rate_schedule: <= 16,384:
  25 / 5 warmup epochs; 32,768: 34 / 12; 65,536: 35 / 34.
- Wongpanich et al. 2020, arXiv 2011.00071: EfficientNet-B2 at 32K, B5 at 64K, LARS, lr per 256
  images scaled linearly, 350 epochs.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from largebatch.cli import main
from largebatch.config import compose_config
from largebatch.imagenet_recipe import FAMILIES, derive
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
    (16384, 25.0, 5, 90, 0.1),  # tensorflow/tpu lars_util.py @b13e6b6, <= 16,384 row; resnet_main.py 90 epochs
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


def test_between_two_points_lr_and_warmup_are_interpolated_in_log2_batch() -> None:
    cfg = _compose("model=resnet50", "global_batch_size=12288")  # above 8K: LARS by default
    t = (math.log2(12288) - 12) / (14 - 12)  # between 4K (10.0, 5) and 16K (25.0, 5)
    assert cfg.optimizer.name == "lars" and cfg.optimizer.lr == round(10.0 + t * 15.0, 2)
    assert cfg.epochs == 90  # the nearer point's (16K): log2 distance 0.415 against 1.585
    source = cfg.recipe.derived["optimizer.lr"]
    assert "interpolated" in source and "4K" in source and "16K" in source
    cfg = _compose("global_batch_size=49152")  # between 32K (34, 12) and 64K (35, 34)
    t = math.log2(49152 / 32768)
    assert cfg.optimizer.lr == round(34 + t, 2) and cfg.schedule.warmup_epochs == round(12 + t * 22, 2)


def test_a_batch_beyond_every_point_warns_naming_the_nearest() -> None:
    cfg = _compose("global_batch_size=131072")
    assert cfg.optimizer.lr == 35.0 and cfg.schedule.warmup_epochs == 34
    [warning] = cfg.recipe.warnings
    assert "131072" in warning and "64K" in warning and "beyond every published point" in warning
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
