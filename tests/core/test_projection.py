"""Bases, projection, rotation and principal angles checked against closed forms and invariants."""

import math

import pytest
import torch

from lowcomm.optim.projection import (
    lift,
    lift_second_moment,
    principal_angles,
    project,
    projection_side,
    rotate_moments,
    top_basis,
)


def orthonormal(n: int, k: int, seed: int, dtype=torch.float32) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    Q, _ = torch.linalg.qr(torch.randn(n, k, generator=gen, dtype=torch.float64))
    return Q.to(dtype)


def low_rank_matrix(p: int, q: int, rank: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """M = U diag(s) V^T with a clear spectral gap after `rank` values; returns (M, U, V)."""
    U, V = orthonormal(p, min(p, q), seed), orthonormal(q, min(p, q), seed + 1)
    s = torch.cat([torch.linspace(10.0, 5.0, rank), torch.full((min(p, q) - rank,), 1e-3)])
    return U @ torch.diag(s) @ V.T, U[:, :rank], V[:, :rank]


def signed_permutation(r: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    perm = torch.eye(r)[torch.randperm(r, generator=gen)]
    signs = torch.where(torch.rand(r, generator=gen) < 0.5, -1.0, 1.0)
    return perm * signs


@pytest.mark.parametrize("shape, side", [((3, 5), "left"), ((4, 4), "left"), ((5, 3), "right")])
def test_projection_side_projects_the_smaller_dimension(shape, side):
    assert projection_side(shape) == side


@pytest.mark.parametrize("method", ["svd", "randomized"])
@pytest.mark.parametrize("shape", [(12, 20), (20, 12)])
def test_top_basis_is_orthonormal_and_spans_the_dominant_subspace(method, shape):
    M, U, V = low_rank_matrix(*shape, rank=3, seed=0)
    side = projection_side(shape)
    Q = top_basis(M, 3, side, method=method)
    expected = U if side == "left" else V
    assert Q.dtype == torch.float32 and Q.shape == expected.shape
    torch.testing.assert_close(Q.T @ Q, torch.eye(3), atol=1e-5, rtol=0)
    assert principal_angles(Q, expected).max() < 1e-3


@pytest.mark.parametrize("method", ["svd", "randomized"])
def test_top_basis_signs_are_fixed_and_repeatable(method):
    M = torch.randn(10, 16, generator=torch.Generator().manual_seed(3))
    Q = top_basis(M, 4, "left", method=method)
    largest = Q.gather(0, Q.abs().argmax(dim=0, keepdim=True))
    assert (largest > 0).all()
    assert torch.equal(Q, top_basis(M.clone(), 4, "left", method=method))


@pytest.mark.parametrize("rank", [0, 5, 2.0])
def test_top_basis_rejects_a_rank_outside_one_to_min_dimension(rank):
    with pytest.raises(ValueError, match="between 1 and min"):
        top_basis(torch.randn(4, 6), rank, "left")


@pytest.mark.parametrize("shape", [(6, 9), (9, 6)])
def test_project_lift_keep_the_subspace_and_error_feedback_identity(shape):
    side = projection_side(shape)
    Q = orthonormal(min(shape), 2, seed=4, dtype=torch.float64)
    gen = torch.Generator().manual_seed(5)
    G, E_old = torch.randn(shape, generator=gen, dtype=torch.float64), torch.randn(shape, generator=gen,
                                                                                 dtype=torch.float64)
    g = project(G + E_old, Q, side)
    assert g.shape == ((2, shape[1]) if side == "left" else (shape[0], 2))
    E_new = G + E_old - lift(g, Q, side)
    torch.testing.assert_close(G + E_old, lift(g, Q, side) + E_new, atol=1e-12, rtol=0)
    assert project(E_new, Q, side).abs().max() < 1e-12  # E holds only what the projection dropped
    in_range = lift(g, Q, side)
    torch.testing.assert_close(lift(project(in_range, Q, side), Q, side), in_range, atol=1e-12, rtol=0)


def lifted(u, v, Q, side):
    return lift(u, Q, side), lift_second_moment(v, Q, side)


@pytest.mark.parametrize("shape", [(6, 9), (9, 6)])
@pytest.mark.parametrize("bias_correction", [True, False])
def test_rotation_to_a_signed_permutation_of_the_basis_keeps_lifted_moments(shape, bias_correction):
    side, r = projection_side(shape), 3
    Q_old = orthonormal(min(shape), r, seed=6)
    Q_new = Q_old @ signed_permutation(r, seed=7)
    state_shape = (r, shape[1]) if side == "left" else (shape[0], r)
    u = torch.randn(state_shape, generator=torch.Generator().manual_seed(8))
    v = u.square() + torch.rand(state_shape, generator=torch.Generator().manual_seed(9))
    u_new, v_new = rotate_moments(u, v, Q_old, Q_new, side, step=5, betas=(0.9, 0.95), mode="rotate",
                                  bias_correction=bias_correction)
    for before, after in zip(lifted(u, v, Q_old, side), lifted(u_new, v_new, Q_new, side)):
        torch.testing.assert_close(after, before, atol=1e-6, rtol=1e-6)


def test_rotation_within_the_subspace_closed_form():
    """With u = 0 and R a 45-degree rotation, v <- (R o R) v averages the two coordinates; u stays 0."""
    Q_old = orthonormal(5, 2, seed=10)
    c = math.sqrt(0.5)
    Q_new = Q_old @ torch.tensor([[c, -c], [c, c]])
    u, v = torch.zeros(2, 4), torch.tensor([[1.0, 2.0, 3.0, 4.0], [3.0, 0.0, 1.0, 8.0]])
    u_new, v_new = rotate_moments(u, v, Q_old, Q_new, "left", step=3, betas=(0.9, 0.95))
    assert torch.equal(u_new, torch.zeros(2, 4))
    torch.testing.assert_close(v_new, v.mean(dim=0, keepdim=True).expand(2, 4), atol=1e-6, rtol=0)


@pytest.mark.parametrize("shape", [(6, 9), (9, 6)])
def test_rotation_by_a_random_orthogonal_matrix_closed_form(shape):
    """t equal projected gradients g give uh = g, vh = g^2 (no variance). In a basis rotated by a random orthogonal
    R (Q_new = Q_old R^T, so Q_new^T Q_old = R) the same history has uh = R g and vh = (R g)^2: the rule must give
    both. Zeroed moments, or (R o R) vh without the u-correction, give something else."""
    side, r, t, betas = projection_side(shape), 4, 7, (0.9, 0.95)
    Q_old = orthonormal(min(shape), r, seed=20)
    R = orthonormal(r, r, seed=21)
    Q_new = Q_old @ R.T
    g = torch.randn((r, shape[1]) if side == "left" else (shape[0], r), generator=torch.Generator().manual_seed(22))
    c1, c2 = (1 - b**t for b in betas)

    def apply(matrix, x):
        return matrix @ x if side == "left" else x @ matrix.T

    u_new, v_new = rotate_moments(c1 * g, c2 * g.square(), Q_old, Q_new, side, step=t, betas=betas)
    torch.testing.assert_close(u_new, c1 * apply(R, g), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(v_new, c2 * apply(R, g).square(), atol=1e-6, rtol=1e-5)
    without_u_correction = c2 * apply(R * R, g.square())
    assert (without_u_correction - v_new).abs().max() > 0.1 * v_new.abs().max()
    assert u_new.abs().max() > 0.1 and v_new.abs().max() > 0.1  # zeroing would fail the closed form


@pytest.mark.parametrize("bias_correction, expected_v", [(True, [3.5, 6.5]), (False, [0.5, 2.5])])
def test_rotation_acts_on_bias_corrected_moments(bias_correction, expected_v):
    """Step 1, betas (0.9, 0.95), u = [1, 1], v = [2, 1], R = [[c, -c], [c, c]] with c = 1/sqrt(2).
    Bias-corrected: uh = [10, 10], vh = [40, 20]; (R o R)(vh - uh^2) = [-70, -70], (R uh)^2 = [0, 200];
    |sum| * (1 - 0.95) = [3.5, 6.5]. Uncorrected: (R o R)[1, 0] + (R u)^2 = [0.5, 0.5] + [0, 2]."""
    Q_old = orthonormal(4, 2, seed=15)
    c = math.sqrt(0.5)
    Q_new = Q_old @ torch.tensor([[c, c], [-c, c]])
    u, v = torch.tensor([[1.0], [1.0]]), torch.tensor([[2.0], [1.0]])
    u_new, v_new = rotate_moments(u, v, Q_old, Q_new, "left", step=1, betas=(0.9, 0.95),
                                  bias_correction=bias_correction)
    torch.testing.assert_close(u_new, torch.tensor([[0.0], [math.sqrt(2.0)]]), atol=1e-5, rtol=0)
    torch.testing.assert_close(v_new, torch.tensor(expected_v).unsqueeze(1), atol=1e-4, rtol=0)


def test_rotation_to_an_orthogonal_subspace_forgets_the_moments():
    Q = orthonormal(8, 4, seed=11)
    u, v = torch.randn(2, 5), torch.rand(2, 5) + 1.0
    u_new, v_new = rotate_moments(u, v, Q[:, :2], Q[:, 2:], "left", step=4, betas=(0.9, 0.95))
    assert u_new.abs().max() < 1e-6 and v_new.abs().max() < 1e-5


def test_rotation_modes_reset_and_none():
    Q_old, Q_new = orthonormal(6, 2, seed=12), orthonormal(6, 2, seed=13)
    u, v = torch.randn(2, 7), torch.rand(2, 7)
    u_reset, v_reset = rotate_moments(u, v, Q_old, Q_new, "left", step=2, betas=(0.9, 0.95), mode="reset")
    assert not u_reset.any() and not v_reset.any()
    u_kept, v_kept = rotate_moments(u, v, Q_old, Q_new, "left", step=2, betas=(0.9, 0.95), mode="none")
    assert torch.equal(u_kept, u) and torch.equal(v_kept, v)
    with pytest.raises(ValueError, match="rotation='spin'"):
        rotate_moments(u, v, Q_old, Q_new, "left", step=2, betas=(0.9, 0.95), mode="spin")


def test_principal_angles_closed_form():
    t = 0.3
    Q1 = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]])
    Q2 = torch.tensor([[1.0, 0.0], [0.0, math.cos(t)], [0.0, math.sin(t)]])
    torch.testing.assert_close(principal_angles(Q1, Q2), torch.tensor([0.0, t], dtype=torch.float64),
                               atol=1e-6, rtol=0)
    torch.testing.assert_close(principal_angles(Q1, Q1 @ signed_permutation(2, seed=14)),
                               torch.zeros(2, dtype=torch.float64), atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="same number of rows"):
        principal_angles(Q1, torch.eye(2))
