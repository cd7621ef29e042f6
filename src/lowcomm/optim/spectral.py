"""Spectral measurements of low-rank updates: the dual Ky Fan r-norm factor nu_t and the effective rank.

For an update D = P Q^T with P (m x r) orthonormal, sigma(D) = sigma(Q), so everything here works on the
small n x r right factor Q and never on an m x n matrix.
"""

from __future__ import annotations

import torch
from torch import Tensor


def factor_singular_values(q: Tensor) -> Tensor:
    """sigma(Q), descending, as the square roots of the eigenvalues of the r x r Gram matrix Q^T Q (float64)."""
    q = q.detach().to(torch.float64)
    eigenvalues = torch.linalg.eigvalsh(q.T @ q)
    return eigenvalues.clamp_min(0).sqrt().flip(0)


def dual_ky_fan_factor(q: Tensor) -> float:
    """nu = max(sigma_1(D), ||D||_* / r) for D = P Q^T with P orthonormal and Q of r columns.

    nu = 1 when Q is orthonormal (Orth-Dion); 1 <= nu <= sqrt(r) when Q has unit-norm columns (Dion)."""
    sigma = factor_singular_values(q)
    return max(sigma[0].item(), sigma.sum().item() / q.shape[1])


def effective_rank(s: Tensor) -> Tensor:
    """erank = exp(-sum p log p) with p = s / sum(s), for non-negative s not all zero (0 log 0 = 0)."""
    p = s / s.sum()
    return torch.exp(-torch.special.xlogy(p, p).sum())
