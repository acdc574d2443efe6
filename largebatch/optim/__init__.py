"""Large-batch optimizers (LARS, LARC, LAMB), the BN/bias parameter split, and a registry by name."""

from .factory import OPTIMIZERS, build_optimizer, optimizer_names
from .lamb import LAMB
from .lars import LARS
from .param_groups import param_groups

__all__ = ["LARS", "LAMB", "param_groups", "build_optimizer", "OPTIMIZERS", "optimizer_names"]
