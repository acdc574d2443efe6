"""Typed Hydra configuration."""

from largebatch.config.compose import ConfigError, compose_config, config_keys, to_train_config
from largebatch.config.schema import TrainConfig

__all__ = ["ConfigError", "TrainConfig", "compose_config", "config_keys", "to_train_config"]
