"""The low-rank Adam family: GaLore-Adam, LDAdam and LoRDO's local step as options of one optimizer.

Per 2-D matrix W (p x q) with orthonormal basis Q (LoRDO's local step; G is the gradient, already clipped):
    A = G + E;  g = project(A, Q);  E = A - lift(g, Q)                 (error feedback, optional)
    u = b1 u + (1 - b1) g;  v = b2 v + (1 - b2) g*g;  uh, vh bias-corrected
    low  = lift(uh / (sqrt(vh) + eps), Q)
    full = G / (mu (sqrt(lift(vh)) + eps))                             (quasi-hyperbolic term, D3; mu = qh_scale)
    W   <- W (1 - lr wd) - lr ((1 - omega) full + omega low)
Other parameters (embeddings, head, norms) take torch.optim.AdamW steps, the same in every method (D7).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

from lowcomm.optim.adamw import AdamWOptions, AdamWPart, check_adamw_options
from lowcomm.optim.groups import hidden_matrices, param_groups
from lowcomm.optim.projection import (
    BASIS_METHODS,
    ROTATIONS,
    add_lifted,
    basis_rows,
    check_rank,
    lift_second_moment,
    project,
    projected_shape,
    projection_side,
    rotate_moments,
    top_basis,
)
from lowcomm.optim.registry import register, require

ALGORITHMS = ("lowrank", "adamw")
QH_DENOMINATORS = ("rank_mean", "lift", "scalar")
BASIS_SOURCES = ("external", "local")
ProjectedGradientHook = Callable[[list[torch.Tensor]], None]


def _nbytes(tensor: torch.Tensor | None) -> int:
    return 0 if tensor is None else tensor.numel() * tensor.element_size()


def lowrank_rules(options: Mapping[str, Any]) -> list[tuple[bool, str, str]]:
    """(holds, key, fix) of the low-rank options' rules, the same for a param group and for the config's options."""
    refresh = options["refresh_every"]
    return [
        (0 <= options["omega"] <= 1, "omega", "use omega in [0, 1] (1 removes the full-rank term)"),
        (options["qh_scale"] > 0, "qh_scale", "use qh_scale > 0"),
        (options["qh_denominator"] in QH_DENOMINATORS, "qh_denominator", f"use one of {QH_DENOMINATORS}"),
        (options["rotation"] in ROTATIONS, "rotation", f"use one of {ROTATIONS}"),
        (options["basis"] in BASIS_SOURCES, "basis", f"use one of {BASIS_SOURCES}"),
        (options["basis_method"] in BASIS_METHODS, "basis_method", f"use one of {BASIS_METHODS}"),
        (isinstance(refresh, int) and not isinstance(refresh, bool) and refresh >= 1, "refresh_every",
         "use an integer >= 1"),
        (isinstance(options["error_feedback"], bool), "error_feedback", "use True or False"),
    ]


class LowRankAdam(torch.optim.Optimizer):
    """Adam on rank-r projections of 2-D matrices (groups with algorithm='lowrank') and AdamW on the
    rest (algorithm='adamw'). See the module docstring for the update; the options are the spec's.

    Low-rank state: 'basis' Q (fp32), 'exp_avg' u and 'exp_avg_sq' v (shape of g), 'error' E (full
    shape, only with error feedback), 'step' (the global step counter, never reset, D5).
    """

    def __init__(
        self,
        params: Iterable[dict],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.95),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        rank: int | None = None,
        error_feedback: bool = True,
        omega: float = 0.7,
        qh_denominator: str = "rank_mean",
        qh_scale: float = 1.0,
        bias_correction: bool = True,
        rotation: str = "rotate",
        basis: str = "external",
        refresh_every: int = 1,
        basis_method: str = "svd",
    ):
        defaults = dict(
            lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, rank=rank,
            error_feedback=error_feedback, omega=omega, qh_denominator=qh_denominator, qh_scale=qh_scale,
            bias_correction=bias_correction, rotation=rotation, basis=basis, refresh_every=refresh_every,
            basis_method=basis_method,
        )
        super().__init__(params, defaults)
        self._adamw = AdamWPart(self)
        self.projected_gradient_hook: ProjectedGradientHook | None = None
        # per low-rank matrix of the last measured step: (name, numel, ||(1 - omega) full||^2 or None at omega = 1,
        # ||omega low||^2)
        self._last_terms: list[tuple[str, int, torch.Tensor | None, torch.Tensor]] | None = None
        self.measure_update_rms = True  # False: the next steps skip the norms (a trainer reads them on log steps only)

    # ----------------------------------------------------------------------------------- validation
    def add_param_group(self, param_group: dict) -> None:
        """torch's add_param_group, then a check of the group's algorithm, options and shapes."""
        super().add_param_group(param_group)
        self._validate_group(self.param_groups[-1], len(self.param_groups) - 1)

    @staticmethod
    def _names(group: dict) -> list[str]:
        """The group's parameter names (its 'names' key), or params[i] when it has none."""
        names = group.get("names")
        if names is None or len(names) != len(group["params"]):
            return [f"params[{i}]" for i in range(len(group["params"]))]
        return list(names)

    def _validate_group(self, group: dict, index: int) -> None:
        where = f"param group {index}"
        algorithm = group.get("algorithm")
        if algorithm not in ALGORITHMS:
            raise ValueError(
                f"{where} has algorithm={algorithm!r}: set 'lowrank' for 2-D hidden matrices or 'adamw' for "
                "the rest (lowcomm.optim.param_groups(model, 'lowrank', weight_decay, rank=...) does this)"
            )
        self._validate_adam_options(group, where)
        if algorithm == "lowrank":
            for ok, key, fix in lowrank_rules(group):
                if not ok:
                    raise ValueError(f"{where}: {key}={group[key]!r} is invalid: {fix}")
            for name, p in zip(self._names(group), group["params"]):
                self._validate_lowrank_param(name, p, group["rank"])

    @staticmethod
    def _validate_adam_options(group: dict, where: str) -> None:
        beta1, beta2 = group["betas"]
        checks = [
            (group["lr"] >= 0, f"lr={group['lr']}", "use lr >= 0"),
            (0 <= beta1 < 1 and 0 <= beta2 < 1, f"betas={group['betas']}", "use betas in [0, 1)"),
            (group["eps"] >= 0, f"eps={group['eps']}", "use eps >= 0"),
            (group["weight_decay"] >= 0, f"weight_decay={group['weight_decay']}", "use weight_decay >= 0"),
            (isinstance(group["bias_correction"], bool), f"bias_correction={group['bias_correction']!r}",
             "use True or False"),
        ]
        for ok, what, fix in checks:
            if not ok:
                raise ValueError(f"{where}: {what} is invalid: {fix}")

    @staticmethod
    def _validate_lowrank_param(name: str, p: torch.Tensor, rank: int | None) -> None:
        if p.ndim != 2:
            raise ValueError(
                f"parameter {name!r} has shape {tuple(p.shape)}: algorithm='lowrank' needs a 2-D matrix; "
                "put it in a group with algorithm='adamw'"
            )
        if p.dtype != torch.float32:
            raise ValueError(
                f"parameter {name!r} is {p.dtype}: low-rank matrices are updated as fp32 master weights; "
                "keep parameters in fp32 and use autocast for low-precision compute"
            )
        check_rank(tuple(p.shape), rank, what=f"parameter {name!r}")

    # ------------------------------------------------------------------------------------ bases
    def lowrank_params(self) -> list[torch.Tensor]:
        """The low-rank parameters, in group order (the order of the projected-gradient hook's list)."""
        return [p for group in self.param_groups if group["algorithm"] == "lowrank" for p in group["params"]]

    basis_key = "basis"  # state[p]["basis"]: Q of a low-rank parameter (lowcomm.optim.protocols.CarriesBasis)

    def basis_params(self) -> list[torch.Tensor]:
        """The parameters whose bases set_bases_from replaces: the low-rank ones."""
        return self.lowrank_params()

    def _lowrank_group(self, p: torch.Tensor) -> dict:
        for group in self.param_groups:
            if group["algorithm"] == "lowrank" and any(p is q for q in group["params"]):
                return group
        raise ValueError("the tensor is not a low-rank parameter of this optimizer: pass one of lowrank_params()")

    def _name_in(self, group: dict, p: torch.Tensor) -> str:
        return next(name for name, q in zip(self._names(group), group["params"]) if q is p)

    def _lowrank_state(self, p: torch.Tensor, group: dict) -> dict:
        """The state of low-rank p, with zero moments (and E) created on first use."""
        state = self.state[p]
        if "exp_avg" not in state:
            shape = projected_shape(p.shape, group["rank"], projection_side(p.shape))
            state["step"] = torch.tensor(0.0)
            state["exp_avg"] = torch.zeros(shape, device=p.device, dtype=torch.float32)
            state["exp_avg_sq"] = torch.zeros(shape, device=p.device, dtype=torch.float32)
            if group["error_feedback"]:
                state["error"] = torch.zeros_like(p, memory_format=torch.contiguous_format)
        return state

    def _install_basis(self, p: torch.Tensor, group: dict, Q_new: torch.Tensor) -> None:
        """Q <- Q_new, moving u, v by the group's rotation rule (nothing to move without a previous Q)."""
        state = self._lowrank_state(p, group)
        if "basis" in state:
            u, v = rotate_moments(
                state["exp_avg"], state["exp_avg_sq"], state["basis"], Q_new, projection_side(p.shape),
                int(state["step"].item()), group["betas"], group["rotation"], group["bias_correction"],
            )
            state["exp_avg"].copy_(u)
            state["exp_avg_sq"].copy_(v)
        state["basis"] = Q_new

    def set_basis(self, p: torch.Tensor, Q: torch.Tensor) -> None:
        """Install the orthonormal basis Q (p x r on the left, q x r on the right) for low-rank p,
        rotating its moments per the group's `rotation` (D4). Q is copied to fp32 on p's device."""
        group = self._lowrank_group(p)
        expected = (basis_rows(p.shape, projection_side(p.shape)), group["rank"])
        if tuple(Q.shape) != expected:
            raise ValueError(
                f"basis for parameter {self._name_in(group, p)!r} (shape {tuple(p.shape)}, rank {group['rank']}) "
                f"has shape {tuple(Q.shape)}: pass an orthonormal {expected[0]} x {expected[1]} matrix "
                "(top_basis(matrix, rank, projection_side(p.shape)) returns one)"
            )
        self._install_basis(p, group, Q.detach().to(device=p.device, dtype=torch.float32, copy=True))

    def set_bases_from(self, matrices: Sequence[torch.Tensor]) -> None:
        """For each low-rank p (order of lowrank_params()), Q = top_basis(M, rank, side) of the matching
        matrix M (an all-reduced gradient at D1, the pseudo-gradient Delta at a sync), installed by set_basis."""
        params = self.lowrank_params()
        if len(matrices) != len(params):
            raise ValueError(
                f"set_bases_from got {len(matrices)} matrices for {len(params)} low-rank parameters: "
                "pass one matrix per entry of lowrank_params(), in that order"
            )
        for p, matrix in zip(params, matrices):
            group = self._lowrank_group(p)
            side = projection_side(p.shape)
            self.set_basis(p, top_basis(matrix, group["rank"], side, group["basis_method"]))

    # ------------------------------------------------------------------------------------- step
    @staticmethod
    def _bias_corrections(group: dict, step: float) -> tuple[float, float]:
        if not group["bias_correction"]:
            return 1.0, 1.0
        beta1, beta2 = group["betas"]
        return 1 - beta1**step, 1 - beta2**step

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None):
        """One step: project every low-rank gradient (updating E), call `projected_gradient_hook` once with
        the list of all projected gradients (lowrank_params() order, those with a gradient; it may edit them in
        place, e.g. all-reduce them), then update the moments and weights of every parameter."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        lowrank = [
            (group, [p for p in group["params"] if p.grad is not None])
            for group in self.param_groups if group["algorithm"] == "lowrank"
        ]
        projected = [[self._project_gradient(p, group) for p in params] for group, params in lowrank]
        every_g = [g for gs in projected for g in gs]
        if self.projected_gradient_hook is not None:
            self.projected_gradient_hook(every_g)
        terms = []
        for (group, params), gs in zip(lowrank, projected):
            if params:
                full_sq, low_sq = self._lowrank_update(group, params, gs)
                names = [self._name_in(group, p) for p in params]
                terms += [(name, p.numel(), full, low) for name, p, full, low
                          in zip(names, params, full_sq or [None] * len(params), low_sq)]
        if self.measure_update_rms:
            self._last_terms = terms or None
        self._adamw.step()
        return loss

    def _project_gradient(self, p: torch.Tensor, group: dict) -> torch.Tensor:
        """g = project(G + E, Q) and E <- G + E - lift(g); refreshes a local basis from G + E when due."""
        state = self._lowrank_state(p, group)
        local = group["basis"] == "local"
        if not local and "basis" not in state:
            raise RuntimeError(
                f"parameter {self._name_in(group, p)!r} has no basis: with basis='external' the caller must call "
                "set_basis(p, Q) (or set_bases_from) before the first step; the sync engine installs the basis of "
                "the first all-reduced gradient (D1)"
            )
        side = projection_side(p.shape)
        accumulated = state["error"].add_(p.grad) if group["error_feedback"] else p.grad
        if local and int(state["step"].item()) % group["refresh_every"] == 0:
            self._install_basis(p, group, top_basis(accumulated, group["rank"], side, group["basis_method"]))
        Q = state["basis"]
        g = project(accumulated, Q, side)
        if group["error_feedback"]:
            add_lifted(accumulated, g, Q, side, -1.0)
        return g

    def _lowrank_update(
        self, group: dict, params: list[torch.Tensor], gs: list[torch.Tensor]
    ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Moment updates (foreach over the group) and weight steps of low-rank `params` with projected
        gradients `gs`; returns the squared Frobenius norms of the applied terms (1 - omega) full and
        omega low, per parameter (no 'full' entries when omega = 1; none at all without measure_update_rms)."""
        states = [self.state[p] for p in params]
        lr, omega = group["lr"], group["omega"]
        corrections, denominators = self._adam_moments(group, states, gs)
        xs = torch._foreach_div([s["exp_avg"] for s in states], denominators)  # c1 uh / (sqrt(vh) + eps)
        low_scales = [omega / c1 for c1, _ in corrections]
        measure = self.measure_update_rms
        # ||Q x|| = ||x||: the low term's norm is that of its coordinates
        low_sq = [n.square() * s**2 for n, s in zip(torch._foreach_norm(xs), low_scales)] if measure else []
        decay = 1 - lr * group["weight_decay"]
        full_sq = []
        for p, state, x, low_scale, (_, c2) in zip(params, states, xs, low_scales, corrections):
            Q, side = state["basis"], projection_side(p.shape)
            add_lifted(p, x, Q, side, -lr * low_scale, beta=decay)  # W <- (1 - lr wd) W - lr omega low
            if omega < 1:
                denominator = self._full_term_denominator(group, state["exp_avg_sq"], Q, side, c2)
                if measure:  # the applied term's norm, on logged steps only (a full-shape temporary)
                    full_sq.append(torch.linalg.vector_norm(p.grad / denominator).square())
                p.addcdiv_(p.grad, denominator, value=-lr)  # one pass over W
        return full_sq, low_sq

    def _full_term_denominator(
        self, group: dict, v: torch.Tensor, Q: torch.Tensor, side: str, c2: float
    ) -> torch.Tensor:
        """mu (sqrt(lift(vh)) + eps) / (1 - omega), mu = qh_scale: the full-rank term is
        W -= lr (1 - omega) G / (mu (sqrt(lift(vh)) + eps))."""
        vh_lifted = self._qh_second_moment(group, v, Q, side).div_(c2)
        return vh_lifted.sqrt_().add_(group["eps"]).mul_(group["qh_scale"] / (1 - group["omega"]))

    def _qh_second_moment(self, group: dict, v: torch.Tensor, Q: torch.Tensor, side: str) -> torch.Tensor:
        """lift(v) of the full-rank term (D3), before bias correction: 'rank_mean' averages v over the rank
        axis (broadcast over the projected axis), 'lift' is (Q o Q) v, 'scalar' is mean(v)."""
        kind = group["qh_denominator"]
        if kind == "rank_mean":
            return v.mean(dim=0 if side == "left" else 1, keepdim=True)
        if kind == "lift":
            return lift_second_moment(v, Q, side)
        return v.mean()

    def _adam_moments(
        self, group: dict, states: list[dict], grads: list[torch.Tensor]
    ) -> tuple[list[tuple[float, float]], list[torch.Tensor]]:
        """u = b1 u + (1 - b1) g, v = b2 v + (1 - b2) g*g, step += 1 (foreach over the states); returns the
        bias corrections (c1, c2) and the denominators sqrt(v / c2) + eps."""
        beta1, beta2 = group["betas"]
        exp_avg_sqs = [s["exp_avg_sq"] for s in states]
        torch._foreach_lerp_([s["exp_avg"] for s in states], grads, 1 - beta1)
        torch._foreach_mul_(exp_avg_sqs, beta2)
        torch._foreach_addcmul_(exp_avg_sqs, grads, grads, 1 - beta2)
        torch._foreach_add_([s["step"] for s in states], 1)
        corrections = [self._bias_corrections(group, s["step"].item()) for s in states]
        denominators = torch._foreach_sqrt(exp_avg_sqs)
        torch._foreach_div_(denominators, [math.sqrt(c2) for _, c2 in corrections])
        torch._foreach_add_(denominators, group["eps"])
        return corrections, denominators

    # -------------------------------------------------------------------------------- reporting
    def state_bytes(self) -> dict[str, int]:
        """Bytes of optimizer state held now, by kind: low-rank 'moments' (u, v), 'bases' (Q),
        'error_feedback' (E), 'adamw_moments' (the AdamW params' two moments). Step counters are excluded."""
        totals = dict(moments=0, bases=0, error_feedback=0, adamw_moments=0)
        for group in self.param_groups:
            lowrank = group["algorithm"] == "lowrank"
            for p in group["params"]:
                state = self.state.get(p, {})
                moments = _nbytes(state.get("exp_avg")) + _nbytes(state.get("exp_avg_sq"))
                if lowrank:
                    totals["moments"] += moments
                    totals["bases"] += _nbytes(state.get("basis"))
                    totals["error_feedback"] += _nbytes(state.get("error"))
                else:
                    totals["adamw_moments"] += moments
        return totals

    def last_update_rms(self) -> dict[str, float]:
        """RMS of the applied terms of the last measured step (measure_update_rms), 'full' = (1 - omega) full and
        'low' = omega low: over all low-rank matrices, and per matrix as 'full/<name>', 'low/<name>' (NaN before the
        first measured step; 0 for 'full' at omega = 1)."""
        if self._last_terms is None:
            return {"full": math.nan, "low": math.nan}
        names, numels, full_sq, low_sq = zip(*self._last_terms)
        zero = torch.zeros(())
        squares = {"full": torch.stack([zero if f is None else f for f in full_sq]), "low": torch.stack(low_sq)}
        numel = torch.tensor(numels, dtype=squares["low"].dtype)
        out = {term: math.sqrt(sq.sum().item() / numel.sum().item()) for term, sq in squares.items()}
        for term, sq in squares.items():
            out.update({f"{term}/{name}": rms for name, rms in zip(names, (sq / numel).sqrt().tolist())})
        return out


# ---------------------------------------------------------------------------------- registry entries
@dataclass(frozen=True)
class LowRankAdamOptions(AdamWOptions):
    """Config keys of the low-rank Adam family; these defaults are LoRDO's local step. The rank is `rank` when
    given, else r = round(rank_share_of_smallest_dim * d) with d the smallest min(p, q) of the hidden matrices
    (d_model in a transformer: the paper's r = d/8). qh_scale is the mu of the full-rank term (D3; the lordo and
    lordo_local method presets set mu = 6, tuned in experiments/lordo_balance/):
        full = G / (mu (sqrt(lift(vh)) + eps))"""

    rank: int | None = None
    rank_share_of_smallest_dim: float = 0.125
    error_feedback: bool = True
    omega: float = 0.7
    qh_denominator: str = "rank_mean"
    qh_scale: float = 1.0
    bias_correction: bool = True
    rotation: str = "rotate"
    basis: str = "external"
    refresh_every: int = 1
    basis_method: str = "svd"

    def __post_init__(self) -> None:
        check_adamw_options(self)
        require(self.rank is None or self.rank >= 1,
                f"optim.rank={self.rank} is invalid: use an integer rank >= 1, or leave optim.rank unset for "
                "round(optim.rank_share_of_smallest_dim x d)")
        require(0 < self.rank_share_of_smallest_dim <= 1,
                f"optim.rank_share_of_smallest_dim={self.rank_share_of_smallest_dim} is invalid: use a share in "
                "(0, 1] or set optim.rank")
        for ok, key, fix in lowrank_rules(asdict(self)):
            require(ok, f"optim.{key}={getattr(self, key)!r} is invalid: {fix}")


@dataclass(frozen=True)
class GaLoreOptions(LowRankAdamOptions):
    """GaLore-Adam: basis from the worker's own gradient every 200 steps, moments kept as they are,
    no error feedback, no full-rank term. (GaLore's scale alpha is a factor on lr.)"""

    error_feedback: bool = False
    omega: float = 1.0
    rotation: str = "none"
    basis: str = "local"
    refresh_every: int = 200


@dataclass(frozen=True)
class LDAdamOptions(LowRankAdamOptions):
    """LDAdam: basis from G + E every step, moments rotated to each new basis, error feedback, no
    full-rank term."""

    omega: float = 1.0
    rotation: str = "rotate"
    basis: str = "local"
    refresh_every: int = 1


def resolve_rank(opts: LowRankAdamOptions, model: nn.Module) -> int:
    """`opts.rank` (at most d), or round(rank_share_of_smallest_dim * d) and at least 1, with d the smallest min(p, q)
    over the hidden matrices."""
    matrices = hidden_matrices(model)
    if not matrices:
        raise ValueError("the model has no 2-D hidden matrices for a low-rank optimizer: use optim.name=adamw")
    name, smallest = min(matrices, key=lambda named: min(named[1].shape))
    d = min(smallest.shape)
    if opts.rank is None:
        return max(1, round(opts.rank_share_of_smallest_dim * d))
    require(opts.rank <= d, f"optim.rank={opts.rank} is invalid for the hidden matrix {name!r} of shape "
                            f"{tuple(smallest.shape)}: use an integer rank between 1 and min(p, q) = {d}")
    return opts.rank


@register("lordo_local_step", LowRankAdamOptions)
@register("ldadam", LDAdamOptions)
@register("galore", GaLoreOptions)
def build_lowrank_adam(opts: LowRankAdamOptions, model: nn.Module) -> LowRankAdam:
    groups = param_groups(model, "lowrank", opts.weight_decay, rank=resolve_rank(opts, model))
    options = {k: v for k, v in asdict(opts).items() if k not in ("rank", "rank_share_of_smallest_dim", "weight_decay")}
    return LowRankAdam(groups, **options)
