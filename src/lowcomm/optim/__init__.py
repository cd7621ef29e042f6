"""Pure PyTorch optimizers (no Lightning) and the registry that builds them from a config."""

from . import adamw  # noqa: F401  (registers "adamw")
from .groups import hidden_matrices, param_groups
from .registry import OPTIMIZERS, build_optimizer, optimizer_options, register

__all__ = ["OPTIMIZERS", "build_optimizer", "hidden_matrices", "optimizer_options", "param_groups", "register"]
