"""Muon baseline: torch.optim.Muon on the hidden matrices, torch.optim.AdamW on the other parameters.

Muon: B <- mu B + G;  O = NS_5(G + mu B) (Nesterov);  X <- (1 - lr wd) X - lr sqrt(max(1, m/n)) O.
It is the full-rank (r = min(m, n)) reference of Orth-Dion. It does not synchronize itself: use it with
an ordinary gradient all-reduce.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from lowcomm.optim.adamw import AdamWPart, check_adamw_options
from lowcomm.optim.groups import param_groups
from lowcomm.optim.registry import register, require

ADJUST_LR_FNS = ("original", "match_rms_adamw")


class MuonAdamW(torch.optim.Optimizer):
    """One optimizer over groups routed by `algorithm`: "muon" groups step with torch.optim.Muon, "adamw" groups
    with torch.optim.AdamW (lr `adamw_lr`, or `lr`). Both share this optimizer's group dicts and state, so
    schedulers, state_dict() and load_state_dict() see one optimizer."""

    def __init__(self, params, lr: float = 0.02, momentum: float = 0.95, nesterov: bool = True, ns_steps: int = 5,
                 adjust_lr_fn: str | None = None, weight_decay: float = 0.01, adamw_lr: float | None = None,
                 betas: tuple[float, float] = (0.9, 0.95), eps: float = 1e-8):
        groups = [dict(g) for g in params]
        unknown = sorted({g.get("algorithm") for g in groups} - {"muon", "adamw"})
        if unknown:
            raise ValueError(f"MuonAdamW: param groups need algorithm 'muon' or 'adamw', got {unknown}")
        super().__init__(groups, {})
        muon_groups = [g for g in self.param_groups if g["algorithm"] == "muon"]
        self._muon = (torch.optim.Muon(muon_groups, lr=lr, weight_decay=weight_decay, momentum=momentum,
                                       nesterov=nesterov, ns_steps=ns_steps, adjust_lr_fn=adjust_lr_fn)
                      if muon_groups else None)
        self._adamw = AdamWPart(self, lr=lr if adamw_lr is None else adamw_lr, betas=tuple(betas), eps=eps,
                                weight_decay=weight_decay)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self._muon is not None:
            self._muon.param_groups = [g for g in self.param_groups if g["algorithm"] == "muon"]
            self._muon.state = self.state
            self._muon.step()
        self._adamw.step()
        return loss


@dataclass(frozen=True)
class MuonOptions:
    lr: float = 0.02
    momentum: float = 0.95
    nesterov: bool = True
    ns_steps: int = 5
    adjust_lr_fn: str | None = None
    weight_decay: float = 0.01
    adamw_lr: float | None = None
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8

    def __post_init__(self) -> None:
        """What torch.optim.Muon and AdamW reject, as `optim.<key>` errors (momentum >= 0, a known adjust_lr_fn)."""
        check_adamw_options(self)
        require(self.momentum >= 0, f"optim.momentum={self.momentum} is invalid: use momentum >= 0")
        require(self.ns_steps >= 1, f"optim.ns_steps={self.ns_steps} is invalid: use an integer >= 1")
        require(self.adjust_lr_fn is None or self.adjust_lr_fn in ADJUST_LR_FNS,
                f"optim.adjust_lr_fn={self.adjust_lr_fn!r} is invalid: use one of {ADJUST_LR_FNS} or null")


@register("muon", MuonOptions)
def build_muon(opts: MuonOptions, model) -> MuonAdamW:
    options = {f.name: getattr(opts, f.name) for f in fields(opts)}
    return MuonAdamW(param_groups(model, "muon", opts.weight_decay), **options)
