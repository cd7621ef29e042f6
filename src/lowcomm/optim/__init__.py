"""Pure PyTorch optimizers (no Lightning) and the registry that builds them from a config."""

from lowcomm.optim import (  # noqa: F401  (register "dion", "orth_dion", "ada_orth_dion", "muon")
    adamw,  # noqa: F401  (registers "adamw")
    dion,
    lowrank_adam,  # noqa: F401  (registers "galore", "ldadam", "lordo_local_step")
    muon,
)
from lowcomm.optim.dion import Dion
from lowcomm.optim.groups import hidden_matrices, param_groups
from lowcomm.optim.lowrank_adam import LowRankAdam
from lowcomm.optim.muon import MuonAdamW
from lowcomm.optim.registry import (
    OPTIMIZERS,
    build_optimizer,
    optimizer_options,
    register,
)

__all__ = [
    "Dion", "MuonAdamW", "OPTIMIZERS", "LowRankAdam", "build_optimizer", "hidden_matrices", "optimizer_options",
    "param_groups", "register",
]
