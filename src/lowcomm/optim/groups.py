"""Parameter groups routed by `algorithm`: 2-D hidden matrices get the matrix algorithm, the rest AdamW."""

from __future__ import annotations

from typing import Any

from torch import nn


def hidden_matrices(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """(name, parameter) of the 2-D attention and MLP weights; models without `hidden_matrices` use ndim == 2
    minus embeddings and output heads."""
    if hasattr(model, "hidden_matrices"):
        return list(model.hidden_matrices())
    return [
        (n, p) for n, p in model.named_parameters()
        if p.ndim == 2 and not any(k in n for k in ("embed", "lm_head", "wte", "wpe"))
    ]


def param_groups(model: nn.Module, matrix_algorithm: str, weight_decay: float, **matrix_options: Any) -> list[dict]:
    """Groups: hidden matrices with `algorithm=matrix_algorithm` (+ options); other >=2-D weights (embeddings,
    head) as AdamW with weight decay; 1-D parameters (norms) as AdamW without it. Each group keeps `names`."""
    matrix_ids = {id(p) for _, p in hidden_matrices(model)}
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    matrices = [(n, p) for n, p in named if id(p) in matrix_ids]
    decayed = [(n, p) for n, p in named if id(p) not in matrix_ids and p.ndim >= 2]
    flat = [(n, p) for n, p in named if id(p) not in matrix_ids and p.ndim < 2]
    groups = [
        dict(params=[p for _, p in matrices], names=[n for n, _ in matrices], algorithm=matrix_algorithm,
             weight_decay=weight_decay, **matrix_options),
        dict(params=[p for _, p in decayed], names=[n for n, _ in decayed], algorithm="adamw",
             weight_decay=weight_decay),
        dict(params=[p for _, p in flat], names=[n for n, _ in flat], algorithm="adamw", weight_decay=0.0),
    ]
    return [g for g in groups if g["params"]]
