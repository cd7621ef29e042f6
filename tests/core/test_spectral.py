"""nu_t from the small right factor against a full SVD of D = P Q^T; its bounds; the effective rank."""

import math

import torch

from lowcomm.optim.spectral import (
    dual_ky_fan_factor,
    effective_rank,
    factor_singular_values,
)


def orthonormal(rows, cols, seed):
    return torch.linalg.qr(torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed),
                                       dtype=torch.float64))[0]


def test_nu_equals_full_svd_of_the_update():
    q = torch.randn(12, 5, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    d = orthonormal(40, 5, seed=1) @ q.T
    sigma = torch.linalg.svdvals(d)
    torch.testing.assert_close(factor_singular_values(q), sigma[:5], rtol=0, atol=1e-10)
    assert math.isclose(dual_ky_fan_factor(q), max(sigma[0].item(), sigma.sum().item() / 5), abs_tol=1e-10)


def test_nu_bounds_of_orth_dion_and_dion_factors():
    assert abs(dual_ky_fan_factor(orthonormal(30, 8, seed=2).float()) - 1.0) <= 1e-5
    unit_columns = torch.randn(30, 8, generator=torch.Generator().manual_seed(3))
    unit_columns /= unit_columns.norm(dim=0)
    assert 1.0 - 1e-6 <= dual_ky_fan_factor(unit_columns) <= math.sqrt(8)
    repeated = unit_columns[:, :1].repeat(1, 8)  # the extreme Dion case: all columns equal
    assert math.isclose(dual_ky_fan_factor(repeated), math.sqrt(8), rel_tol=1e-6)


def test_effective_rank():
    assert math.isclose(effective_rank(torch.ones(6)).item(), 6.0, rel_tol=1e-6)
    assert math.isclose(effective_rank(torch.tensor([3.0, 0.0, 0.0])).item(), 1.0, rel_tol=1e-6)
    assert 1.0 < effective_rank(torch.tensor([3.0, 1.0, 0.1])).item() < 3.0
