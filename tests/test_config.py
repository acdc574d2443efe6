"""The config tree composes, and the schema rejects mistakes with a message naming the key."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from enum import Enum
from pathlib import Path
from typing import Any

import pytest
import yaml
from omegaconf import OmegaConf

from largebatch.config import ConfigError, compose_config, config_keys, to_train_config
from largebatch.config.schema import TrainConfig
from largebatch import defaults

CONF = Path(__file__).resolve().parents[1] / "conf"
GROUPS = sorted(p.name for p in CONF.iterdir() if p.is_dir() and p.name not in ("__pycache__",))


def _presets() -> list[tuple[str, str]]:
    return [(g, f.stem) for g in GROUPS for f in sorted((CONF / g).glob("*.yaml"))]


@pytest.mark.parametrize("group,name", _presets(), ids=lambda x: str(x))
def test_every_preset_composes(group: str, name: str) -> None:
    overrides = [f"{group}={name}"]
    if group == "data" or (group == "experiment"):
        overrides.append("data.root=/some/imagenet")
    cfg = to_train_config(compose_config(overrides))
    assert isinstance(cfg, TrainConfig)


def test_default_is_the_embedded_run() -> None:
    cfg = to_train_config(compose_config([]))
    assert cfg.data.root is None
    assert cfg.global_batch_size == 64 and cfg.base_batch_size == 256
    assert (cfg.data.image_size, cfg.optimizer.lr, cfg.epochs, cfg.target_top1) == (32, 0.2, 8, 90.0)
    assert cfg.schedule.warmup_epochs == 1 and cfg.data.crop_scale == [0.5, 1.0]
    assert (cfg.data.synthetic.train_per_class, cfg.data.synthetic.val_per_class) == (520, 100)


def _leaves(node: Any, prefix: str = "") -> dict[str, Any]:
    """Dotted key -> value of every leaf of a YAML mapping."""
    out: dict[str, Any] = {}
    for k, v in node.items():
        if isinstance(v, dict):
            out.update(_leaves(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def test_train_yaml_shows_what_the_default_run_does() -> None:
    """Every value conf/train.yaml writes is the default run's value: no later layer (a
    default experiment) replaces it out of the reader's sight."""
    text = yaml.safe_load((CONF / "train.yaml").read_text())
    written = {k: v for k, v in _leaves(text).items() if not k.startswith(("defaults", "hydra."))}
    composed = compose_config([])
    assert {"global_batch_size", "optimizer.lr", "epochs", "target_top1"} <= set(written)
    for key, value in written.items():
        assert OmegaConf.select(composed, key) == value, key
    # the default group files' values reach the run unless train.yaml names them
    for entry in text["defaults"]:
        if isinstance(entry, dict) and not any(str(k).startswith(("override", "optional")) for k in entry):
            (group, option), = entry.items()
            for key, value in _leaves(yaml.safe_load((CONF / group / f"{option}.yaml").read_text())).items():
                full = f"{group}.{key}"
                assert OmegaConf.select(composed, full) == written.get(full, value), full


def test_no_schema_default_contradicts_the_default_run() -> None:
    """One source per value: a schema default either is MISSING (the YAML holds the value) or
    equals what the default run uses (data.image_size was 224 in the schema, 40 in the data
    preset and 32 in the default experiment)."""
    schema = OmegaConf.structured(TrainConfig)
    composed = compose_config([])
    for key in config_keys():
        parent, _, leaf = key.rpartition(".")
        container = OmegaConf.select(schema, parent) if parent else schema
        if OmegaConf.is_config(container._get_node(leaf)) or OmegaConf.is_missing(container, leaf):
            continue
        default = container[leaf]
        if default is not None:  # None: "not set", the library's own default applies
            assert OmegaConf.select(composed, key) == default, key
    for key in ("global_batch_size", "data.image_size", "optimizer.lr", "target_top1", "epochs"):
        parent, _, leaf = key.rpartition(".")
        assert OmegaConf.is_missing(OmegaConf.select(schema, parent) if parent else schema, leaf), key


def test_choices_reach_the_library_as_plain_strings() -> None:
    """The Enums of the schema end at to_train_config: nothing downstream unwraps ``.value``."""
    cfg = to_train_config(compose_config(["schedule=poly", "precision=bf16", "comm=hierarchical"]))

    def walk(node: Any) -> None:
        for f in dataclasses.fields(node):
            value = getattr(node, f.name)
            if dataclasses.is_dataclass(value):
                walk(value)
            else:
                assert not isinstance(value, Enum), f.name

    walk(cfg)
    assert type(cfg.schedule.name) is str and cfg.schedule.name == "poly"
    assert (cfg.precision.name, cfg.comm.algorithm, cfg.lr_scaling) == ("bf16", "hierarchical", "linear")


def test_mistyped_key_names_the_closest_valid_key() -> None:
    with pytest.raises(ConfigError, match=r"optimizer\.lrr.*did you mean 'optimizer\.lr'"):
        compose_config(["optimizer.lrr=0.2"])


def test_mistyped_key_in_a_yaml_file_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="foo"):
        compose_config(["+model.foo=1"])


def test_wrong_type_names_the_key() -> None:
    with pytest.raises(ConfigError, match=r"epochs"):
        compose_config(["epochs=many"])
    with pytest.raises(ConfigError, match=r"lr_scaling"):
        compose_config(["lr_scaling=cubic"])


def test_unknown_group_option_lists_the_choices() -> None:
    with pytest.raises(ConfigError, match=r"resnet50"):
        compose_config(["model=resnet51"])


def test_imagenet_preset_requires_a_root() -> None:
    with pytest.raises(ConfigError, match=r"data\.root"):
        compose_config(["data=imagenet"])


def test_embedded_yaml_writes_the_sizes_of_the_embedded_module() -> None:
    written = yaml.safe_load((CONF / "data" / "embedded.yaml").read_text())["synthetic"]
    sizes = {key: written[key] for key in ("classes", "train_per_class", "val_per_class", "image_size")}
    assert sizes == {
        "classes": defaults.DEFAULT_CLASSES,
        "train_per_class": defaults.DEFAULT_TRAIN_PER_CLASS,
        "val_per_class": defaults.DEFAULT_VAL_PER_CLASS,
        "image_size": defaults.DEFAULT_IMAGE_SIZE,
    }


@pytest.mark.parametrize(
    "module", ["largebatch.config", "largebatch.data", "largebatch.defaults"],
)
def test_importing_the_config_and_its_leaves_loads_no_torch(module: str) -> None:
    """A config error is one line in well under a second: nothing on this path loads torch."""
    code = f"import sys, {module}; assert 'torch' not in sys.modules, sorted(sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], cwd=CONF.parent, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_keys_cover_nested_groups() -> None:
    keys = set(config_keys())
    assert {"optimizer.lr", "data.synthetic.classes", "bn.group_size", "comm.algorithm"} <= keys
