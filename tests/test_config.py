"""The config tree composes, and the schema rejects mistakes with a message naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from largebatch.config import ConfigError, compose_config, config_keys, to_train_config
from largebatch.config.schema import TrainConfig

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
    assert cfg.global_batch_size == 64 and cfg.base_batch_size == 256  # experiment=embedded_cpu


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


def test_keys_cover_nested_groups() -> None:
    keys = set(config_keys())
    assert {"optimizer.lr", "data.synthetic.classes", "bn.group_size", "comm.algorithm"} <= keys
