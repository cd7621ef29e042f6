"""A method as the cost models read it: its sync options (what the sync kind runs, lowcomm.distributed.options.SyncKind)
and its optimizer's rank r (a low-rank optimizer's) or rank fraction (a Dion-family optimizer's). The models also take
it as a mapping: the sync config keys plus `rank` or `rank_fraction`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from lowcomm.cost.shapes import ParamShapes
from lowcomm.distributed.options import SyncOptions, sync_options
from lowcomm.optim.dion import fixed_rank
from lowcomm.optim.projection import check_rank, projected_shape, projection_side

RANK_KEYS = ("rank", "rank_fraction")


@dataclass(frozen=True)
class AccountedMethod:
    """What a run sends and keeps: its sync options, and its optimizer's rank r of every matrix (a low-rank
    optimizer's `rank`; None: full-rank moments) or rank fraction (a Dion-family optimizer's `rank_fraction`). Under
    a sync kind whose optimizer synchronizes itself (SyncKind.optimizer_synchronizes) the optimizer is the Dion family,
    all-reducing its factors P and W every step."""

    sync: SyncOptions
    rank: int | None = None
    rank_fraction: float | None = None

    def __post_init__(self) -> None:
        if self.sync.kind.optimizer_basis is not None and self.rank is None:
            raise ValueError(f"method options of {self.sync.name!r} need 'rank': its messages and moments are rank-r")


MethodOptions = AccountedMethod | Mapping[str, Any]  # the models' input: an AccountedMethod or its mapping form


def accounted_method(method: MethodOptions) -> AccountedMethod:
    """`method` itself, or the AccountedMethod of a mapping: a sync config section plus `rank` or `rank_fraction`."""
    if isinstance(method, AccountedMethod):
        return method
    sync = sync_options({k: v for k, v in method.items() if k not in RANK_KEYS})
    return AccountedMethod(sync, method.get("rank"), method.get("rank_fraction"))


def matrix_rank(method: AccountedMethod, shape: tuple[int, int]) -> int:
    """The rank of a matrix: the optimizer's `rank`, or for the Dion family r = ceil(rank_fraction * min(p, q)), at
    most min(p, q) (lowcomm.optim.dion.fixed_rank)."""
    if method.rank is not None:
        check_rank(shape, method.rank)
        return method.rank
    if method.rank_fraction is not None:
        return fixed_rank(method.rank_fraction, *shape)
    raise ValueError(f"method options of {method.sync.name!r} need 'rank' (an integer; a Dion-family optimizer also "
                     "accepts 'rank_fraction') to count low-rank messages")


def projected_elements(method: AccountedMethod, shapes: ParamShapes) -> int:
    """Numbers in one rank-r projection (or low-rank moment) of every matrix: sum r max(p, q)."""
    return sum(math.prod(projected_shape(s, matrix_rank(method, s), projection_side(s))) for s in shapes.lowrank)
