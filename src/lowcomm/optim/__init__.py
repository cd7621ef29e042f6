"""Pure PyTorch optimizers (no Lightning) and the registry that builds them from a config."""

from . import adamw  # noqa: F401  (registers "adamw")
from . import dion, muon  # noqa: F401  (register "dion", "orth_dion", "ada_orth_dion", "muon")
from . import lowrank_adam  # noqa: F401  (registers "galore", "ldadam", "lordo_local_step")
from .dion import Dion
from .groups import hidden_matrices, param_groups
from .lowrank_adam import LowRankAdam
from .muon import MuonAdamW
from .registry import OPTIMIZERS, build_optimizer, optimizer_options, register

__all__ = [
    "Dion", "MuonAdamW", "OPTIMIZERS", "LowRankAdam", "build_optimizer", "hidden_matrices", "optimizer_options",
    "param_groups", "register",
]
