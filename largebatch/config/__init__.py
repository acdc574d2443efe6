"""Typed Hydra configuration."""

from largebatch.config.compose import (
    ConfigError,
    check_composed,
    check_overrides,
    compose_config,
    compose_with_recipe,
    config_keys,
    hydra_errors,
    hydra_session,
    to_train_config,
)
from largebatch.config.schema import TrainConfig

__all__ = [
    "ConfigError", "TrainConfig", "check_composed", "check_overrides", "compose_config", "compose_with_recipe", "config_keys",
    "hydra_errors", "hydra_session", "to_train_config",
]
