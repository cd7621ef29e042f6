"""Full-rank AdamW baseline: torch.optim.AdamW over the same parameter groups as every other method."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .groups import param_groups
from .registry import register


@dataclass(frozen=True)
class AdamWOptions:
    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    weight_decay: float = 0.1


@register("adamw", AdamWOptions)
def build_adamw(opts: AdamWOptions, model) -> torch.optim.Optimizer:
    groups = param_groups(model, "adamw", opts.weight_decay)
    for g in groups:
        g.pop("names")
        g.pop("algorithm")
    return torch.optim.AdamW(groups, lr=opts.lr, betas=opts.betas, eps=opts.eps, foreach=True)
