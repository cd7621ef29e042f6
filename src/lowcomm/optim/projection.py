"""Rank-r bases of matrices and the maps between a p x q matrix and its projected state.

A weight W (p x q) is projected on its smaller side (GaLore / LDAdam rule):
left  (p <= q): Q is p x r, g = Q^T A is r x q, lift(g) = Q g;
right (p >  q): Q is q x r, g = A Q   is p x r, lift(g) = g Q^T.
Bases are computed in fp32 outside autocast, with column signs fixed, so identical input gives an
identical Q on every worker.
"""

from __future__ import annotations

from typing import Literal

import torch

Side = Literal["left", "right"]
SIDES = ("left", "right")
BASIS_METHODS = ("svd", "randomized")
ROTATIONS = ("rotate", "reset", "none")


def projection_side(shape: tuple[int, ...] | torch.Size) -> Side:
    """'left' (Q spans the p rows) when p <= q, else 'right' (Q spans the q columns)."""
    if len(shape) != 2:
        raise ValueError(f"a projection needs a 2-D matrix, got shape {tuple(shape)}")
    p, q = shape
    return "left" if p <= q else "right"


def projected_shape(shape: tuple[int, ...] | torch.Size, rank: int, side: Side) -> tuple[int, int]:
    """Shape of g = project(A, Q, side) for A of `shape`: (r, q) on the left, (p, r) on the right."""
    p, q = shape
    return (rank, q) if side == "left" else (p, rank)


def basis_rows(shape: tuple[int, ...] | torch.Size, side: Side) -> int:
    """Number of rows of Q: p on the left, q on the right."""
    return shape[0] if side == "left" else shape[1]


def check_rank(shape: tuple[int, ...] | torch.Size, rank: int, what: str = "matrix") -> None:
    """ValueError unless 1 <= rank <= min(p, q)."""
    limit = min(shape)
    if isinstance(rank, bool) or not isinstance(rank, int) or not 1 <= rank <= limit:
        raise ValueError(
            f"rank={rank!r} is invalid for {what} of shape {tuple(shape)}: "
            f"use an integer rank between 1 and min(p, q) = {limit}"
        )


def _check_side(side: str) -> None:
    if side not in SIDES:
        raise ValueError(f"side={side!r} is unknown: use 'left' or 'right'")


def fix_signs(Q: torch.Tensor) -> torch.Tensor:
    """Flip each column so that its largest-magnitude entry is positive (first such entry on ties)."""
    idx = Q.abs().argmax(dim=0, keepdim=True)
    signs = torch.gather(Q, 0, idx).sign()
    return Q * torch.where(signs == 0, torch.ones_like(signs), signs)


def _svd_left_vectors(M: torch.Tensor, rank: int) -> torch.Tensor:
    """Top-`rank` left singular vectors of M by exact SVD."""
    U, _, _ = torch.linalg.svd(M, full_matrices=False)
    return U[:, :rank]


def _randomized_left_vectors(
    M: torch.Tensor, rank: int, generator: torch.Generator | None, oversample: int, power_iters: int
) -> torch.Tensor:
    """Top-`rank` left singular vectors of M by a randomized range finder (Halko et al., 2011):
    Y = (M M^T)^k M Omega, orthonormalized after each product; then the SVD of the small Q_Y^T M."""
    p, q = M.shape
    k = min(rank + oversample, p, q)
    if generator is None:
        generator = torch.Generator(device=M.device).manual_seed(0)
    omega = torch.randn(q, k, generator=generator, device=M.device, dtype=M.dtype)
    Y, _ = torch.linalg.qr(M @ omega)
    for _ in range(power_iters):
        Z, _ = torch.linalg.qr(M.T @ Y)
        Y, _ = torch.linalg.qr(M @ Z)
    U_small, _, _ = torch.linalg.svd(Y.T @ M, full_matrices=False)
    return Y @ U_small[:, :rank]


def top_basis(
    matrix: torch.Tensor,
    rank: int,
    side: Side,
    method: str = "svd",
    generator: torch.Generator | None = None,
    oversample: int = 8,
    power_iters: int = 2,
) -> torch.Tensor:
    """Q: the top-r singular vectors of `matrix` on `side` (left: U[:, :r], p x r; right: V[:, :r], q x r),
    fp32, orthonormal columns, signs fixed. `method='randomized'` uses a seeded range finder
    (`generator`, default seed 0) for large matrices."""
    _check_side(side)
    check_rank(tuple(matrix.shape), rank)
    if method not in BASIS_METHODS:
        raise ValueError(f"basis method {method!r} is unknown: use one of {BASIS_METHODS}")
    with torch.autocast(device_type=matrix.device.type, enabled=False):
        M = matrix.detach().float()
        if side == "right":
            M = M.T
        if method == "svd":
            Q = _svd_left_vectors(M, rank)
        else:
            Q = _randomized_left_vectors(M, rank, generator, oversample, power_iters)
    return fix_signs(Q).contiguous()


def project(A: torch.Tensor, Q: torch.Tensor, side: Side) -> torch.Tensor:
    """g = Q^T A (left, r x q) or A Q (right, p x r)."""
    _check_side(side)
    return Q.T @ A if side == "left" else A @ Q


def lift(g: torch.Tensor, Q: torch.Tensor, side: Side) -> torch.Tensor:
    """Q g (left) or g Q^T (right): the full p x q matrix of a projected state g."""
    _check_side(side)
    return Q @ g if side == "left" else g @ Q.T


def add_lifted(
    out: torch.Tensor, x: torch.Tensor, Q: torch.Tensor, side: Side, alpha: float, beta: float = 1.0
) -> None:
    """out <- beta out + alpha lift(x, Q, side), in place (one addmm)."""
    _check_side(side)
    if side == "left":
        out.addmm_(Q, x, beta=beta, alpha=alpha)
    else:
        out.addmm_(x, Q.T, beta=beta, alpha=alpha)


def lift_second_moment(v: torch.Tensor, Q: torch.Tensor, side: Side) -> torch.Tensor:
    """(Q o Q) v (left) or v (Q o Q)^T (right): the diagonal of the lifted covariance when the
    projected coordinates are uncorrelated (LDAdam)."""
    return lift(v, Q * Q, side)


def rotate_moments(
    exp_avg: torch.Tensor,
    exp_avg_sq: torch.Tensor,
    Q_old: torch.Tensor,
    Q_new: torch.Tensor,
    side: Side,
    step: int,
    betas: tuple[float, float],
    mode: str = "rotate",
    bias_correction: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Moments (u, v) expressed in Q_old, moved to Q_new (spec D4, LDAdam).

    'rotate': with R = Q_new^T Q_old acting on the rank axis and bias-corrected uh, vh,
    uh <- R uh and vh <- |(R o R)(vh - uh^2) + (R uh)^2|, then the bias correction is undone.
    'reset': zeros. 'none': unchanged (the moments are reinterpreted in Q_new, as GaLore does).
    """
    _check_side(side)
    if mode not in ROTATIONS:
        raise ValueError(f"rotation={mode!r} is unknown: use one of {ROTATIONS}")
    if mode == "none" or step == 0:
        return exp_avg, exp_avg_sq
    if mode == "reset":
        return torch.zeros_like(exp_avg), torch.zeros_like(exp_avg_sq)
    beta1, beta2 = betas
    c1 = 1 - beta1**step if bias_correction else 1.0
    c2 = 1 - beta2**step if bias_correction else 1.0
    R = Q_new.T @ Q_old

    def apply(matrix: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return matrix @ x if side == "left" else x @ matrix.T

    u_hat, v_hat = exp_avg / c1, exp_avg_sq / c2
    u_rot = apply(R, u_hat)
    v_rot = (apply(R * R, v_hat - u_hat.square()) + u_rot.square()).abs()
    return u_rot * c1, v_rot * c2


def principal_angles(Q1: torch.Tensor, Q2: torch.Tensor) -> torch.Tensor:
    """Principal angles (radians, ascending) between range(Q1) and range(Q2), both orthonormal:
    arccos of the singular values of Q1^T Q2, clamped to [0, 1], computed in fp64."""
    if Q1.ndim != 2 or Q2.ndim != 2 or Q1.shape[0] != Q2.shape[0]:
        raise ValueError(
            f"principal angles need two bases with the same number of rows, got {tuple(Q1.shape)} "
            f"and {tuple(Q2.shape)}"
        )
    cosines = torch.linalg.svdvals(Q1.double().T @ Q2.double()).clamp(0.0, 1.0)
    return torch.arccos(cosines)

