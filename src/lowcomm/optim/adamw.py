"""Full-rank AdamW: the baseline optimizer, and the AdamW part of every other optimizer.

Every method steps its non-matrix parameters (embeddings, head, norms) with the same torch.optim.AdamW
(foreach kernels), so the part all methods share is bit-identical across them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from lowcomm.optim.groups import param_groups
from lowcomm.optim.registry import register, require


def check_adamw_options(opts: Any) -> None:
    """What torch.optim.AdamW rejects, in the config's words: lr >= 0 (and adamw_lr, where an optimizer has one),
    betas in [0, 1), eps >= 0, weight_decay >= 0."""
    for key in ("lr", "adamw_lr"):
        value = getattr(opts, key, None)
        require(value is None or value >= 0, f"optim.{key}={value} is invalid: use {key} >= 0")
    for index, beta in enumerate(opts.betas):
        require(0 <= beta < 1, f"optim.betas has {beta} at index {index}: use betas in [0, 1)")
    require(opts.eps >= 0, f"optim.eps={opts.eps} is invalid: use eps >= 0")
    require(opts.weight_decay >= 0, f"optim.weight_decay={opts.weight_decay} is invalid: use weight_decay >= 0")


@dataclass(frozen=True)
class AdamWOptions:
    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    weight_decay: float = 0.1

    def __post_init__(self) -> None:
        check_adamw_options(self)


class AdamWPart:
    """torch.optim.AdamW over the `algorithm="adamw"` groups of an outer optimizer, sharing its group dicts and
    state (so schedulers, state_dict() and load_state_dict() of the outer optimizer cover it)."""

    def __init__(self, outer: torch.optim.Optimizer, **defaults):
        self.outer = outer
        groups = self._groups()
        # AdamW's own keys (amsgrad, foreach, ...) are set into the shared group dicts here, once.
        self.inner = torch.optim.AdamW(groups, foreach=True, **defaults) if groups else None

    def _groups(self) -> list[dict]:
        return [g for g in self.outer.param_groups if g.get("algorithm") == "adamw"]

    def step(self) -> None:
        """One AdamW step of the groups' parameters that have gradients."""
        if self.inner is None:
            return
        self.inner.param_groups = self._groups()  # the outer optimizer's load_state_dict replaces the group dicts
        self.inner.state = self.outer.state
        self.inner.step()


@register("adamw", AdamWOptions)
def build_adamw(opts: AdamWOptions, model) -> torch.optim.Optimizer:
    groups = param_groups(model, "adamw", opts.weight_decay)
    for g in groups:
        g.pop("names")
        g.pop("algorithm")
    return torch.optim.AdamW(groups, lr=opts.lr, betas=opts.betas, eps=opts.eps, foreach=True)
