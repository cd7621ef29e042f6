"""Dion, Orth-Dion and Ada-Orth-Dion: low-rank orthonormalized updates with error feedback (arXiv 2605.16341;
the choices it leaves open: docs/decisions.md).

Per hidden matrix X (m x n = d_out x d_in), with B = tall(M) (a x b, a >= b: M, or M^T when m < n):
    M <- M + G;   P = orth(B Q);   W = B^T P
    M <- beta B - (beta - mu) P W^T                   (D15: beta = ef_beta, mu = captured_share; beta = 1 is Dion's)
    Q <- colnorm(W) (Dion)  or  orth(W) with diag(R) > 0 (Orth-Dion)
    X <- (1 - lr wd) X - lr sqrt(m / n) untall(P Q^T)
Embeddings, the output head and norms take AdamW steps in the same optimizer (param groups with `algorithm`).
Data parallel with M > 1 workers: P is averaged before orth and W after, instead of the gradient. Without a
Communicator it steps locally (K-step methods); set_bases_from then installs a right factor shared by every worker.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

import torch
from torch import Tensor

from lowcomm.optim.adamw import AdamWPart, check_adamw_options
from lowcomm.optim.collective import AllReduce
from lowcomm.optim.groups import param_groups
from lowcomm.optim.projection import top_basis
from lowcomm.optim.registry import register, require
from lowcomm.optim.spectral import dual_ky_fan_factor, effective_rank

ALGORITHMS = ("dion", "adamw")
NORMALIZATIONS = ("column", "qr")
QR_METHODS = ("householder", "cholesky_qr")
RANK_QUANTUM = 8
RANK_GROWTH_MAX = 16
RANK_SHRINK_MAX = 8
COLUMN_NORM_EPS = 1e-8
SINGULAR_VALUE_FLOOR = 1e-12


# ----------------------------------------------------------------------------------------------- linear algebra

def _signs_of(diagonal: Tensor) -> Tensor:
    """+1 where diagonal >= 0, -1 where it is negative."""
    return 1 - 2 * (diagonal < 0).to(diagonal.dtype)


def _cholesky_qr_pass(q: Tensor, gram: Tensor) -> Tensor | None:
    """Q R^{-1} with R^T R = gram = Q^T Q; None when gram is not positive definite."""
    r, info = torch.linalg.cholesky_ex(gram, upper=True)
    if info.item() != 0:
        return None
    return torch.linalg.solve_triangular(r, q, upper=True, left=False)


def _cholesky_qr2(a: Tensor) -> Tensor | None:
    """Q of A = Q R by two Cholesky-QR passes; None when A^T A is not positive definite or the first pass is
    too far from orthonormal (max |Q_1^T Q_1 - I| > 0.5) for the second to reach working-precision orthogonality."""
    q = _cholesky_qr_pass(a, a.T @ a)
    if q is None:
        return None
    gram = q.T @ q
    identity = torch.eye(gram.shape[0], dtype=gram.dtype, device=gram.device)
    if not bool((gram - identity).abs().amax() <= 0.5):
        return None
    return _cholesky_qr_pass(q, gram)


def orthonormalize(a: Tensor, method: str = "householder") -> Tensor:
    """Q of the thin QR A = Q R with diag(R) >= 0, in float32 (or wider) outside autocast.

    householder: torch.linalg.qr with the signs of Q's columns fixed; cholesky_qr: CholeskyQR2 (positive
    diag(R) by construction), falling back to Householder when A is too ill-conditioned for it."""
    if method not in QR_METHODS:
        raise ValueError(f"qr_method={method!r} is unknown: use one of {QR_METHODS}")
    a = a.to(torch.promote_types(a.dtype, torch.float32))
    with torch.autocast(a.device.type, enabled=False):
        if method == "cholesky_qr":
            q = _cholesky_qr2(a)
            if q is not None:
                return q
        return _householder_qr(a)


def _householder_qr(a: Tensor) -> Tensor:
    """Q of A = Q R (one matrix or a batch) by torch.linalg.qr, each column's sign flipped so that diag(R) >= 0."""
    q, r = torch.linalg.qr(a)
    return q * _signs_of(r.diagonal(dim1=-2, dim2=-1)).unsqueeze(-2)


def orthonormalize_all(matrices: list[Tensor], methods: list[str]) -> list[Tensor]:
    """[orthonormalize(a, method) for each pair], with the Householder QRs of same-shape matrices done as one
    batched torch.linalg.qr (the same LAPACK factorization per matrix, one dispatch per shape)."""
    out: list[Tensor | None] = [None] * len(matrices)
    batches: dict[tuple, list[int]] = {}
    for i, (a, method) in enumerate(zip(matrices, methods)):
        if method == "householder":
            batches.setdefault((tuple(a.shape), a.dtype, a.device), []).append(i)
        else:
            out[i] = orthonormalize(a, method)
    for (_, dtype, device), indices in batches.items():
        stacked = torch.stack([matrices[i] for i in indices]).to(torch.promote_types(dtype, torch.float32))
        with torch.autocast(device.type, enabled=False):
            for i, q in zip(indices, _householder_qr(stacked).unbind()):
                out[i] = q
    return out


def column_normalize(w: Tensor, eps: float = COLUMN_NORM_EPS) -> Tensor:
    """Each column w_j <- w_j / (||w_j||_2 + eps)."""
    return w / (w.norm(dim=0, keepdim=True) + eps)


def _add_tall_product(target: Tensor, left: Tensor, right: Tensor, transposed: bool, alpha: float,
                      beta: float = 1.0) -> None:
    """In place: target <- beta target + alpha untall(left @ right^T)."""
    left, right = left.to(target.dtype), right.to(target.dtype)
    if transposed:
        target.addmm_(right, left.T, beta=beta, alpha=alpha)
    else:
        target.addmm_(left, right.T, beta=beta, alpha=alpha)


# ----------------------------------------------------------------------------------------------- ranks and seeds

def fixed_rank(rank_fraction: float, m: int, n: int) -> int:
    """r = ceil(rank_fraction * min(m, n)), at most min(m, n)."""
    return min(min(m, n), math.ceil(rank_fraction * min(m, n)))


def rank_bounds(rank_fraction_max: float, r_min: int, m: int, n: int) -> tuple[int, int]:
    """(r_min, r_cap) of Ada-Orth-Dion: r_cap = ceil(rank_fraction_max * min(m, n)); r_min is lowered to r_cap
    where it is larger."""
    cap = fixed_rank(rank_fraction_max, m, n)
    return min(r_min, cap), cap


def _round_half_up(x: float) -> int:
    return math.floor(x + 0.5)


def next_rank(rank: int, erank_ema: float, gamma: float, low: int, high: int) -> int:
    """The Ada-Orth-Dion controller: target = clamp(round(gamma * e), low, high), quantized to a multiple of 8
    and clamped again (so the bounds themselves are reachable); the rank moves towards it by at most +16 or -8."""
    target = min(max(_round_half_up(gamma * erank_ema), low), high)
    target = min(max(RANK_QUANTUM * _round_half_up(target / RANK_QUANTUM), low), high)
    if target > rank:
        return min(target, rank + RANK_GROWTH_MAX)
    return max(target, rank - RANK_SHRINK_MAX)


def strongest_directions(w: Tensor) -> Tensor:
    """The left singular vectors of W = B^T P (n x r) in decreasing order of singular value, signs fixed (largest-
    magnitude entry positive): an orthonormal basis of range(W), so of range(orth(W)), strongest direction first."""
    u, _, _ = torch.linalg.svd(w.to(torch.promote_types(w.dtype, torch.float32)), full_matrices=False)
    signs = _signs_of(u.gather(0, u.abs().argmax(dim=0, keepdim=True)).squeeze(0))
    return u * signs


def seeded_normal(rows: int, cols: int, *keys: int) -> Tensor:
    """A standard normal float32 matrix that depends only on the integers `keys` (same on every rank and device)."""
    generator = torch.Generator().manual_seed(hash(keys) & 0x7FFF_FFFF_FFFF_FFFF)
    return torch.randn(rows, cols, generator=generator)


# ----------------------------------------------------------------------------------------------- the optimizer

@dataclass(eq=False)
class _MatrixStep:
    """Working tensors of one hidden matrix during a step."""

    param: Tensor
    group: dict
    state: dict
    transposed: bool
    compressed: bool
    tall: Tensor | None = None
    P: Tensor | None = None
    W: Tensor | None = None
    nonzero: Tensor | None = None


class Dion(torch.optim.Optimizer):
    """Dion (normalization="column"), Orth-Dion (normalization="qr") and Ada-Orth-Dion (adaptive_rank=True) for
    groups with algorithm="dion" (2-D matrices); AdamW for groups with algorithm="adamw" (lr `adamw_lr`, or `lr`).

    Every option is a param-group default, so groups may override it. rank_fraction: r = ceil(f min(m, n));
    captured_share: mu of D15, the share of the captured part P W^T kept in M (M <- beta B - (beta - mu) P W^T);
    ef_beta: beta of D15, the scale of the uncaptured tail (1.0 = Dion);
    qr_method: "householder" or "cholesky_qr" (CholeskyQR2, Householder fallback). Ada-Orth-Dion: the rank
    starts at r_cap = ceil(rank_fraction_max min(m, n)) (rank_fraction_max defaults to rank_fraction) and every
    `adapt_every` steps follows next_rank() with rank_gamma, rank_ema and r_min. Q starts as N(0, 1) seeded by
    (seed, parameter position), identical on every rank. Group "names" label errors and spectral stats.

    With an AllReduce (a Communicator) of M > 1 workers the optimizer synchronizes itself (do not all-reduce gradients
    outside it; every rank must give gradients to the same parameters): matrices with (m + n) r < m n
    exchange P and W, (m + n) r numbers; the other matrices and all AdamW parameters exchange gradients."""

    synchronizes_gradients = True

    def __init__(self, params, lr: float = 0.01, captured_share: float = 0.95, ef_beta: float = 1.0,
                 rank_fraction: float = 0.25, normalization: str = "column", qr_method: str = "householder",
                 weight_decay: float = 0.01, adaptive_rank: bool = False, adapt_every: int = 1,
                 rank_fraction_max: float | None = None, r_min: int = 16, rank_gamma: float = 2.0,
                 rank_ema: float = 0.9, betas: tuple[float, float] = (0.9, 0.95), eps: float = 1e-8,
                 adamw_lr: float | None = None, seed: int = 0, communicator: AllReduce | None = None):
        defaults = dict(algorithm="dion", lr=lr, captured_share=captured_share, ef_beta=ef_beta,
                        rank_fraction=rank_fraction, normalization=normalization, qr_method=qr_method,
                        weight_decay=weight_decay, adaptive_rank=adaptive_rank, adapt_every=adapt_every,
                        rank_fraction_max=rank_fraction_max, r_min=r_min, rank_gamma=rank_gamma, rank_ema=rank_ema,
                        betas=tuple(betas), eps=eps)
        groups = _as_groups(params)
        if adamw_lr is not None:
            for group in groups:
                if group.get("algorithm") == "adamw":
                    group.setdefault("lr", adamw_lr)
        self.seed = seed
        self.communicator = communicator
        super().__init__(groups, defaults)
        self._adamw = AdamWPart(self)

    # -- construction

    def add_param_group(self, param_group: dict) -> None:
        """Add a group, validate its options, and create the Dion state (buffer, seeded Q) of its matrices."""
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        _validate_group(group, len(self.param_groups) - 1)
        for index, _, owner, p in self._indexed_params():
            if owner is group and group["algorithm"] == "dion":
                self._init_matrix_state(p, group, index)

    def _init_matrix_state(self, p: Tensor, group: dict, index: int) -> None:
        m, n = p.shape
        if group["adaptive_rank"]:
            rank = rank_bounds(_rank_fraction_max(group), group["r_min"], m, n)[1]
        else:
            rank = fixed_rank(group["rank_fraction"], m, n)
        state = self.state[p]
        state["step"] = torch.tensor(0, dtype=torch.int64)
        state["momentum"] = torch.zeros_like(p, memory_format=torch.contiguous_format)
        state["Q"] = seeded_normal(min(m, n), rank, self.seed, index).to(p.device, _compute_dtype(p))
        if group["adaptive_rank"]:
            state["rank"] = torch.tensor(rank, dtype=torch.int64)
            state["erank"] = torch.tensor(0.0, dtype=torch.float64)

    # -- communication

    def set_communicator(self, communicator: AllReduce | None) -> None:
        """Synchronize over `communicator` from the next step on (None: single process)."""
        self.communicator = communicator

    @property
    def distributed(self) -> bool:
        return self.communicator is not None and self.communicator.world_size > 1

    @torch.no_grad()
    def synchronize_for_checkpoint(self) -> None:
        """Average the Dion buffers M over workers (kind "optimizer_state"), so every rank holds the same state.

        The update depends only on the workers' mean buffer, which averaging leaves unchanged."""
        if not self.distributed:
            return
        buffers = [self.state[p]["momentum"] for g in self.param_groups if g["algorithm"] == "dion"
                   for p in g["params"]]
        self.communicator.all_reduce(buffers, kind="optimizer_state", op="mean")

    # -- a shared right factor (K-step methods with a global subspace)

    def matrix_params(self) -> list[Tensor]:
        """The Dion matrices (groups with algorithm="dion"), in group order."""
        return [p for g in self.param_groups if g["algorithm"] == "dion" for p in g["params"]]

    basis_key = "Q"  # state[p]["Q"]: the right factor of a Dion matrix (lowcomm.optim.protocols.CarriesBasis)

    def basis_params(self) -> list[Tensor]:
        """The parameters whose right factors set_bases_from replaces: the Dion matrices."""
        return self.matrix_params()

    @torch.no_grad()
    def set_bases_from(self, matrices: list[Tensor]) -> None:
        """For each Dion matrix X (order of matrix_params()) and the matching matrix A of X's shape: Q <- the top-r
        right singular vectors of tall(A), r = Q's current number of columns, fp32 with fixed signs (identical on
        every rank for an identical A). The buffer M is kept as it is: it is full-shape, not expressed in Q, and Q is
        only the warm start of the next power-iteration step."""
        params = self.matrix_params()
        if len(matrices) != len(params):
            raise ValueError(f"set_bases_from got {len(matrices)} matrices for {len(params)} Dion matrices: pass one "
                             "matrix per entry of matrix_params(), in that order")
        for p, matrix in zip(params, matrices):
            q = self.state[p]["Q"]
            side = "left" if p.shape[0] < p.shape[1] else "right"  # the right factor of the tall orientation
            self.state[p]["Q"] = top_basis(matrix, q.shape[1], side).to(q.device, q.dtype)

    # -- the step

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        matrices, others = self._collect()
        with _autocast_disabled({p.device.type for p in others} | {mat.param.device.type for mat in matrices}):
            if self.distributed:
                grads = [p.grad for p in others] + [mat.param.grad for mat in matrices if not mat.compressed]
                self.communicator.all_reduce(grads, kind="gradient", op="mean")
            self._dion_step(matrices)
            self._adamw.step()
        return loss

    def _collect(self) -> tuple[list[_MatrixStep], list[Tensor]]:
        """The parameters with gradients: Dion matrices (pending rank changes applied) and AdamW parameters."""
        matrices, others = [], []
        for index, _, group, p in self._indexed_params():
            if p.grad is None:
                continue
            if group["algorithm"] == "adamw":
                others.append(p)
                continue
            state = self.state[p]
            state["step"] += 1
            if group["adaptive_rank"]:
                self._apply_rank(state, index)
            m, n = p.shape
            rank = state["Q"].shape[1]
            matrices.append(_MatrixStep(p, group, state, transposed=m < n,
                                        compressed=self.distributed and (m + n) * rank < m * n))
        return matrices, others

    def _indexed_params(self):
        """(position across all groups, name, group, parameter); the position seeds Q."""
        index = 0
        for group in self.param_groups:
            names = group.get("names") or [None] * len(group["params"])
            for p, name in zip(group["params"], names):
                yield index, name or f"param{index}", group, p
                index += 1

    def _dion_step(self, matrices: list[_MatrixStep]) -> None:
        for mat in matrices:
            momentum = mat.state["momentum"]
            momentum.add_(mat.param.grad)
            mat.tall = (momentum.T if mat.transposed else momentum).to(mat.state["Q"].dtype)
            mat.P = mat.tall @ mat.state["Q"]
        self._average_factors([mat.P for mat in matrices if mat.compressed])
        methods = [mat.group["qr_method"] for mat in matrices]
        for mat, P in zip(matrices, orthonormalize_all([mat.P for mat in matrices], methods)):
            mat.nonzero = torch.any(mat.P != 0)
            mat.P = P * mat.nonzero
            mat.W = mat.tall.T @ mat.P
        self._average_factors([mat.W for mat in matrices if mat.compressed])
        for mat, q in zip(matrices, self._right_factors(matrices)):
            self._finish_matrix(mat, q)

    def _average_factors(self, factors: list[Tensor]) -> None:
        if self.distributed and factors:
            self.communicator.all_reduce(factors, kind="factor", op="mean")

    @staticmethod
    def _right_factors(matrices: list[_MatrixStep]) -> list[Tensor]:
        """The new right factor of each matrix from its W: column_normalize(W) (Dion) or orthonormalize(W)
        (Orth-Dion, same-shape W's in one batched QR)."""
        qr = [i for i, mat in enumerate(matrices) if mat.group["normalization"] == "qr"]
        out = [column_normalize(mat.W) if mat.group["normalization"] == "column" else None for mat in matrices]
        orthonormal = orthonormalize_all([matrices[i].W for i in qr], [matrices[i].group["qr_method"] for i in qr])
        for i, q in zip(qr, orthonormal):
            out[i] = q
        return out

    def _finish_matrix(self, mat: _MatrixStep, q: Tensor) -> None:
        """Error feedback, the new right factor q, the weight update and the rank controller of one matrix."""
        group, state, p = mat.group, mat.state, mat.param
        beta, mu = group["ef_beta"], group["captured_share"]
        _add_tall_product(state["momentum"], mat.P, mat.W, mat.transposed, alpha=-(beta - mu), beta=beta)
        state["Q"] = torch.where(mat.nonzero, q, state["Q"])
        m, n = p.shape
        lr = group["lr"]
        _add_tall_product(p, mat.P, state["Q"], mat.transposed, alpha=-lr * math.sqrt(m / n),
                          beta=1 - lr * group["weight_decay"])
        if group["adaptive_rank"] and int(state["step"]) % group["adapt_every"] == 0 and bool(mat.nonzero):
            self._update_rank(mat)

    def _update_rank(self, mat: _MatrixStep) -> None:
        """e <- ema e + (1 - ema) erank(column norms of W); the next step runs at next_rank(r, e, ...). Before a
        shrink, Q = orth(W) is replaced by the same subspace's basis ordered by energy (strongest_directions)."""
        group, state = mat.group, mat.state
        erank = effective_rank(mat.W.norm(dim=0).double() + SINGULAR_VALUE_FLOOR)
        previous = state["erank"]
        ema = group["rank_ema"]
        state["erank"] = erank if previous.item() == 0 else ema * previous + (1 - ema) * erank
        low, high = rank_bounds(_rank_fraction_max(group), group["r_min"], *mat.param.shape)
        q = state["Q"]
        rank = next_rank(q.shape[1], state["erank"].item(), group["rank_gamma"], low, high)
        if rank < q.shape[1]:
            state["Q"] = strongest_directions(mat.W).to(q.dtype)
        state["rank"] = torch.tensor(rank, dtype=torch.int64)

    def _apply_rank(self, state: dict, index: int) -> None:
        """Resize Q to state["rank"]: keep the leading (strongest) columns, or append fresh unit-norm Gaussian
        columns seeded by (seed, position, step)."""
        q, rank = state["Q"], int(state["rank"])
        if rank < q.shape[1]:
            state["Q"] = q[:, :rank].contiguous()
        elif rank > q.shape[1]:
            fresh = column_normalize(seeded_normal(q.shape[0], rank - q.shape[1], self.seed, index,
                                                   int(state["step"])), eps=0.0)
            state["Q"] = torch.cat([q, fresh.to(q.device, q.dtype)], dim=1)

    # -- measurements

    def spectral_by_matrix(self) -> dict[str, dict[str, float]]:
        """Per hidden matrix that has taken a step: nu_t of the last update's right factor, its rank, the rank cap."""
        stats = {}
        for _, name, group, p in self._indexed_params():
            if group["algorithm"] != "dion" or int(self.state[p]["step"]) == 0:
                continue
            q = self.state[p]["Q"]
            cap = (rank_bounds(_rank_fraction_max(group), group["r_min"], *p.shape)[1]
                   if group["adaptive_rank"] else q.shape[1])
            stats[name] = {"nu": dual_ky_fan_factor(q), "rank": q.shape[1], "rank_cap": cap}
        return stats

    def spectral_stats(self) -> dict[str, float]:
        """Mean and max nu_t over hidden matrices and the mean active rank as a share of r_cap ({} without any)."""
        per_matrix = list(self.spectral_by_matrix().values())
        if not per_matrix:
            return {}
        nus = [s["nu"] for s in per_matrix]
        return {"nu_mean": sum(nus) / len(nus), "nu_max": max(nus),
                "active_rank_share": sum(s["rank"] / s["rank_cap"] for s in per_matrix) / len(per_matrix)}

    # -- checkpoints

    def load_state_dict(self, state_dict: dict) -> None:
        """Load, keeping each state tensor's saved dtype (torch casts floating state to the parameter's dtype,
        which would turn a float32 Q of a bf16 matrix into bf16 and the integer rank into a float)."""
        super().load_state_dict(state_dict)
        for group, saved_group in zip(self.param_groups, state_dict["param_groups"]):
            for p, saved_index in zip(group["params"], saved_group["params"]):
                for key, value in state_dict["state"].get(saved_index, {}).items():
                    if isinstance(value, Tensor):
                        device = value.device if key == "step" else p.device
                        self.state[p][key] = value.to(device, copy=True)


# ----------------------------------------------------------------------------------------------- helpers

def _as_groups(params) -> list[dict]:
    params = list(params)
    if not params:
        raise ValueError("Dion got an empty parameter list")
    if isinstance(params[0], dict):
        return [dict(g) for g in params]
    return [{"params": params}]


def _compute_dtype(p: Tensor) -> torch.dtype:
    return torch.promote_types(p.dtype, torch.float32)


def _rank_fraction_max(group: Mapping[str, Any]) -> float:
    value = group["rank_fraction_max"]
    return group["rank_fraction"] if value is None else value


@contextlib.contextmanager
def _autocast_disabled(device_types: set[str]):
    with contextlib.ExitStack() as stack:
        for device_type in sorted(device_types):
            stack.enter_context(torch.autocast(device_type, enabled=False))
        yield


def matrix_rules(options: Mapping[str, Any]) -> list[tuple[bool, str, str]]:
    """(holds, key, requirement) of the Dion matrix options, the same for a param group and the config's options."""
    return [
        (0 < options["rank_fraction"] <= 1, "rank_fraction", "must lie in (0, 1]"),
        (0 <= options["captured_share"] < 1, "captured_share", "must lie in [0, 1)"),
        (0 <= options["ef_beta"] <= 1, "ef_beta", "must lie in [0, 1] (1.0 is Dion's rule)"),
        (options["qr_method"] in QR_METHODS, "qr_method", f"is unknown: use one of {QR_METHODS}"),
    ]


def adaptive_rank_rules(options: Mapping[str, Any]) -> list[tuple[bool, str, str]]:
    """(holds, key, requirement) of Ada-Orth-Dion's rank-controller options."""
    return [
        (0 < _rank_fraction_max(options) <= 1, "rank_fraction_max", "must lie in (0, 1]"),
        (options["r_min"] >= 1, "r_min", "must be >= 1"),
        (options["rank_gamma"] > 0, "rank_gamma", "must be > 0"),
        (0 <= options["rank_ema"] < 1, "rank_ema", "must lie in [0, 1)"),
        (int(options["adapt_every"]) == options["adapt_every"] >= 1, "adapt_every", "must be an integer >= 1"),
    ]


def _validate_group(group: dict, index: int) -> None:
    """ValueError naming the option (or parameter) and the fix."""
    where = f"Dion param_groups[{index}]"
    require(group["algorithm"] in ALGORITHMS,
            f"{where}: algorithm={group['algorithm']!r} is unknown: use one of {ALGORITHMS}")
    require(group["lr"] >= 0, f"{where}: lr={group['lr']} must be >= 0")
    require(group["weight_decay"] >= 0, f"{where}: weight_decay={group['weight_decay']} must be >= 0")
    if group["algorithm"] == "adamw":
        beta1, beta2 = group["betas"]
        require(0 <= beta1 < 1 and 0 <= beta2 < 1, f"{where}: betas={group['betas']} must lie in [0, 1)")
        require(group["eps"] > 0, f"{where}: eps={group['eps']} must be > 0")
        return
    rules = matrix_rules(group)
    rules.append((group["normalization"] in NORMALIZATIONS, "normalization",
                  "is unknown: use 'column' (Dion) or 'qr' (Orth-Dion)"))
    if group["adaptive_rank"]:
        rules.append((group["normalization"] == "qr", "adaptive_rank",
                      "is Ada-Orth-Dion and needs normalization='qr' (not 'column'): use optim.name=ada_orth_dion"))
        rules += adaptive_rank_rules(group)
    for ok, key, requirement in rules:
        require(ok, f"{where}: {key}={group[key]!r} {requirement}")
    names = group.get("names") or [None] * len(group["params"])
    for position, (p, name) in enumerate(zip(group["params"], names)):
        label = repr(name) if name else f"params[{position}]"
        require(p.ndim == 2,
                f"{where}: parameter {label} of shape {tuple(p.shape)} is {p.ndim}-D but algorithm='dion' needs "
                "2-D matrices: put it in a group with algorithm='adamw' (lowcomm.optim.param_groups does this)")


# ----------------------------------------------------------------------------------------------- registry

@dataclass(frozen=True)
class DionOptions:
    """Config keys of Dion and Orth-Dion: rank_fraction f (r = ceil(f min(m, n))), captured_share mu and ef_beta
    beta of D15 (M <- beta B - (beta - mu) P W^T); lr, betas, eps, weight_decay and adamw_lr also serve AdamW."""

    lr: float = 0.01
    captured_share: float = 0.95
    ef_beta: float = 1.0
    rank_fraction: float = 0.25
    qr_method: str = "householder"
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    adamw_lr: float | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        require(self.eps > 0, f"optim.eps={self.eps} is invalid: use eps > 0")
        check_adamw_options(self)
        self._check_rules(matrix_rules(asdict(self)))

    def _check_rules(self, rules: list[tuple[bool, str, str]]) -> None:
        for ok, key, requirement in rules:
            require(ok, f"optim.{key}={getattr(self, key)!r} {requirement}")


@dataclass(frozen=True)
class AdaOrthDionOptions(DionOptions):
    """Dion's keys and the rank controller's: r_cap = ceil(rank_fraction_max min(m, n)), r_min, rank_gamma,
    rank_ema, adapt_every (next_rank)."""

    adapt_every: int = 1
    rank_fraction_max: float | None = None
    r_min: int = 16
    rank_gamma: float = 2.0
    rank_ema: float = 0.9

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check_rules(adaptive_rank_rules(asdict(self)))


def _build(opts: DionOptions, model, **fixed) -> Dion:
    options = {f.name: getattr(opts, f.name) for f in fields(opts)}
    weight_decay = options.pop("weight_decay")
    return Dion(param_groups(model, "dion", weight_decay), weight_decay=weight_decay, **options, **fixed)


@register("dion", DionOptions)
def build_dion(opts: DionOptions, model) -> Dion:
    return _build(opts, model, normalization="column")


@register("orth_dion", DionOptions)
def build_orth_dion(opts: DionOptions, model) -> Dion:
    return _build(opts, model, normalization="qr")


@register("ada_orth_dion", AdaOrthDionOptions)
def build_ada_orth_dion(opts: AdaOrthDionOptions, model) -> Dion:
    return _build(opts, model, normalization="qr", adaptive_rank=True)
