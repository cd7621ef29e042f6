"""The shapes the cost models read: a model's low-rank (2-D hidden) matrices p x q and every other parameter."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable

import torch
from torch import nn

from lowcomm.model import Transformer, model_config
from lowcomm.optim.groups import hidden_matrices


@dataclass(frozen=True)
class ParamShapes:
    """Shapes of the low-rank (2-D hidden) matrices and of every other parameter."""

    lowrank: tuple[tuple[int, int], ...]
    other: tuple[tuple[int, ...], ...]

    @property
    def matrix_elements(self) -> int:
        """Numbers in the low-rank matrices: sum pq."""
        return sum(math.prod(s) for s in self.lowrank)

    @property
    def other_elements(self) -> int:
        """Numbers in every other parameter."""
        return sum(math.prod(s) for s in self.other)

    @property
    def elements(self) -> int:
        """Numbers in every parameter."""
        return self.matrix_elements + self.other_elements


def param_shapes(model: nn.Module, lowrank: Iterable[nn.Parameter] | None = None) -> ParamShapes:
    """ParamShapes of a model's trainable parameters; the low-rank ones are `lowrank` (default: the hidden matrices)."""
    lowrank_ids = {id(p) for p in (lowrank if lowrank is not None else (p for _, p in hidden_matrices(model)))}
    params = [p for p in model.parameters() if p.requires_grad]
    return ParamShapes(
        lowrank=tuple(tuple(p.shape) for p in params if id(p) in lowrank_ids),
        other=tuple(tuple(p.shape) for p in params if id(p) not in lowrank_ids),
    )


def meta_model(size: str, **overrides: Any) -> Transformer:
    """The model of a named size with any ModelConfig field overridden, on the meta device (shapes, no memory)."""
    with torch.device("meta"):
        return Transformer(model_config(size, **overrides))


def model_shapes(size: str, **overrides: Any) -> ParamShapes:
    """ParamShapes of a named model size with any ModelConfig field overridden."""
    return param_shapes(meta_model(size, **overrides))
