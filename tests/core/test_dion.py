"""Dion / Orth-Dion / Ada-Orth-Dion on one process: against a float64 reference written from the update rule in
lowcomm.optim.dion's docstring,
invariants (orthonormal Q, nu_t, descent), the rank controller, the zero-gradient guard, checkpoints."""

import copy
import math

import pytest
import torch

from lowcomm.distributed.comm import Communicator
from lowcomm.model import Transformer, model_config
from lowcomm.optim import Dion, MuonAdamW, build_optimizer
from lowcomm.optim.dion import (
    next_rank,
    orthonormalize,
    orthonormalize_all,
    rank_bounds,
)

# ------------------------------------------------------------------ the slow reference (spec equations, float64)

def gram_schmidt(a: torch.Tensor) -> torch.Tensor:
    """Orthonormal columns by twice-iterated classical Gram-Schmidt: A = Q R with diag(R) > 0."""
    q = a.clone()
    for j in range(q.shape[1]):
        for _ in range(2):
            q[:, j] -= q[:, :j] @ (q[:, :j].T @ q[:, j])
        q[:, j] /= q[:, j].norm()
    return q


def reference_step(x, buffer, q, g, *, lr, mu, ef_beta, wd, normalization):
    """One step of the spec's equations in the tall orientation; returns (X, M, Q) in float64."""
    x, buffer, q, g = (t.double() for t in (x, buffer, q, g))
    m, n = x.shape
    untall = (lambda t: t) if m >= n else (lambda t: t.T)
    buffer = buffer + g
    b = untall(buffer)
    p = gram_schmidt(b @ q)
    w = b.T @ p
    buffer = untall(ef_beta * b - (ef_beta - mu) * p @ w.T)
    q = w / (w.norm(dim=0) + 1e-8) if normalization == "column" else gram_schmidt(w)
    x = (1 - lr * wd) * x - lr * math.sqrt(m / n) * untall(p @ q.T)
    return x, buffer, q


def matrix_and_optimizer(shape, dtype=torch.float32, seed=0, **options):
    torch.manual_seed(seed)
    x = torch.nn.Parameter(torch.randn(*shape, dtype=dtype))
    return x, Dion([dict(params=[x], names=["w"])], **options)


def random_gradients(shape, steps, seed=1, dtype=torch.float32):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=generator, dtype=dtype) for _ in range(steps)]


# ------------------------------------------------------------------ Dion against the reference

@pytest.mark.parametrize("shape", [(12, 7), (7, 12)], ids=["tall", "wide"])
@pytest.mark.parametrize("normalization", ["column", "qr"])
@pytest.mark.parametrize("ef_beta", [1.0, 0.3])
def test_step_matches_float64_reference(shape, normalization, ef_beta):
    hyper = dict(lr=0.02, captured_share=0.9, ef_beta=ef_beta, weight_decay=0.1)
    x, opt = matrix_and_optimizer(shape, rank_fraction=0.5, normalization=normalization, **hyper)
    state = opt.state[x]
    assert state["Q"].shape == (7, 4)
    ref_x, ref_m, ref_q = x.detach().double(), torch.zeros(shape, dtype=torch.float64), state["Q"].double()
    for g in random_gradients(shape, steps=3):
        ref_x, ref_m, ref_q = reference_step(ref_x, ref_m, ref_q, g, wd=hyper["weight_decay"],
                                             normalization=normalization, lr=hyper["lr"], mu=hyper["captured_share"],
                                             ef_beta=ef_beta)
        x.grad = g.clone()
        opt.step()
        torch.testing.assert_close(x.detach().double(), ref_x, rtol=0, atol=1e-5)
        torch.testing.assert_close(state["momentum"].double(), ref_m, rtol=0, atol=1e-5)
        torch.testing.assert_close(state["Q"].double(), ref_q, rtol=0, atol=1e-5)


@pytest.mark.parametrize("beta", [0.1, 0.5])
@pytest.mark.parametrize("form", ["summary", "code"])
def test_the_two_published_error_feedback_forms(beta, form):
    """(mu = captured_share = 0, ef_beta = beta) leaves M = beta (B - P W^T), the public summary's R = beta (M -
    P P^T M); (ef_beta = 1, mu = 1 - beta) leaves M = B - beta P W^T, the earlier code's R = M - beta P P^T M
    (B = M + G, P = orth(B Q), W = B^T P)."""
    options = (dict(captured_share=0.0, ef_beta=beta) if form == "summary"
               else dict(captured_share=1 - beta, ef_beta=1.0))
    x, opt = matrix_and_optimizer((12, 7), rank_fraction=0.5, normalization="qr", lr=0.02, **options)
    state = opt.state[x]
    x.grad, q = random_gradients((12, 7), steps=1)[0], state["Q"].double()
    b = x.grad.double()  # M starts at zero
    p = gram_schmidt(b @ q)
    w = b.T @ p
    opt.step()
    expected = beta * (b - p @ w.T) if form == "summary" else b - beta * p @ w.T
    torch.testing.assert_close(state["momentum"].double(), expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize("shape", [(12, 7), (7, 12), (9, 9)], ids=["tall", "wide", "square"])
def test_set_bases_from_installs_the_top_right_singular_vectors_and_keeps_the_buffer(shape):
    """Q <- the top-r right singular vectors of tall(A) (float64 SVD; V of A when m >= n, U when m < n), signs fixed;
    M unchanged bit for bit; the next step is the reference step warm-started from the new Q."""
    hyper = dict(lr=0.02, captured_share=0.9, ef_beta=1.0, weight_decay=0.1)
    x, opt = matrix_and_optimizer(shape, rank_fraction=0.5, normalization="qr", **hyper)
    state = opt.state[x]
    for g in random_gradients(shape, steps=2):
        x.grad = g
        opt.step()
    buffer = state["momentum"].clone()
    a = torch.randn(*shape, generator=torch.Generator().manual_seed(5))
    opt.set_bases_from([a])
    assert torch.equal(state["momentum"], buffer)
    u, _, vh = torch.linalg.svd(a.double(), full_matrices=False)
    rank = state["Q"].shape[1]
    expected = (vh.T if shape[0] >= shape[1] else u)[:, :rank]
    expected = expected * expected.gather(0, expected.abs().argmax(dim=0, keepdim=True)).sign()
    torch.testing.assert_close(state["Q"].double(), expected, rtol=0, atol=1e-5)
    (g,) = random_gradients(shape, steps=1, seed=9)
    ref_x, ref_m, ref_q = reference_step(x.detach(), buffer, state["Q"], g, normalization="qr", lr=hyper["lr"],
                                         mu=hyper["captured_share"], ef_beta=1.0, wd=hyper["weight_decay"])
    x.grad = g.clone()
    opt.step()
    torch.testing.assert_close(x.detach().double(), ref_x, rtol=0, atol=1e-5)
    torch.testing.assert_close(state["momentum"].double(), ref_m, rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match=r"set_bases_from got 2 matrices for 1 Dion matrices"):
        opt.set_bases_from([a, a])


def test_cholesky_qr_matches_householder():
    shape = (40, 24)
    grads = random_gradients(shape, steps=3)
    results = []
    for qr_method in ("householder", "cholesky_qr"):
        x, opt = matrix_and_optimizer(shape, normalization="qr", qr_method=qr_method)
        for g in grads:
            x.grad = g.clone()
            opt.step()
        results.append((x.detach().clone(), opt.state[x]["Q"].clone()))
    torch.testing.assert_close(results[0][0], results[1][0], rtol=0, atol=1e-5)
    torch.testing.assert_close(results[0][1], results[1][1], rtol=0, atol=1e-5)


def test_orthonormalize_fixes_householder_signs():
    a = torch.randn(30, 6, generator=torch.Generator().manual_seed(3))
    _, raw_r = torch.linalg.qr(a)
    assert (raw_r.diagonal() < 0).any()
    for method in ("householder", "cholesky_qr"):
        q = orthonormalize(a, method)
        r = q.T @ a
        torch.testing.assert_close(q.T @ q, torch.eye(6), rtol=0, atol=1e-5)
        torch.testing.assert_close(q @ r, a, rtol=0, atol=1e-4)
        assert (r.diagonal() > 0).all()


def test_batched_orthonormalize_equals_one_matrix_at_a_time():
    generator = torch.Generator().manual_seed(5)
    shapes = [(40, 8), (24, 8), (40, 8), (40, 8), (24, 8), (40, 4)]
    matrices = [torch.randn(*shape, generator=generator) for shape in shapes]
    methods = ["householder", "householder", "cholesky_qr", "householder", "householder", "householder"]
    for a, method, q in zip(matrices, methods, orthonormalize_all(matrices, methods)):
        torch.testing.assert_close(q, orthonormalize(a, method), rtol=0, atol=0)


@pytest.mark.parametrize("case", ["ill_conditioned", "rank_deficient"])
def test_cholesky_qr_falls_back_to_householder(case):
    generator = torch.Generator().manual_seed(59)  # Cholesky succeeds twice here; unchecked, Q^T Q - I reaches 7e-5
    u = torch.linalg.qr(torch.randn(50, 8, generator=generator, dtype=torch.float64))[0]
    v = torch.linalg.qr(torch.randn(8, 8, generator=generator, dtype=torch.float64))[0]
    sigma = torch.logspace(0, -6, 8, dtype=torch.float64) if case == "ill_conditioned" else \
        torch.tensor([1.0, 0.5, 0.2, 0, 0, 0, 0, 0], dtype=torch.float64)
    a = (u * sigma @ v.T).float()
    q = orthonormalize(a, "cholesky_qr")
    torch.testing.assert_close(q.T @ q, torch.eye(8), rtol=0, atol=1e-5)
    torch.testing.assert_close(q, orthonormalize(a, "householder"), rtol=0, atol=0)


def test_step_runs_in_float32_outside_autocast():
    shape = (24, 16)
    g = random_gradients(shape, steps=1)[0]
    outside, opt_outside = matrix_and_optimizer(shape, normalization="qr")
    inside, opt_inside = matrix_and_optimizer(shape, normalization="qr")
    outside.grad, inside.grad = g.clone(), g.clone()
    opt_outside.step()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        opt_inside.step()
    assert opt_inside.state[inside]["Q"].dtype == torch.float32
    torch.testing.assert_close(inside, outside, rtol=0, atol=0)


# ------------------------------------------------------------------ Orth-Dion and Dion invariants

def applied_direction(x_before, x_after, lr):
    """untall(P Q^T) recovered from the weight change of a step with weight decay 0."""
    m, n = x_before.shape
    return (x_before - x_after) / (lr * math.sqrt(m / n))


@pytest.mark.parametrize("shape", [(48, 20), (20, 48)], ids=["tall", "wide"])
def test_orth_dion_descent_with_negative_householder_diagonal(shape):
    lr = 0.01
    x, opt = matrix_and_optimizer(shape, dtype=torch.float64, rank_fraction=0.4, normalization="qr",
                                  weight_decay=0.0, lr=lr)
    m, n = shape
    untall = (lambda t: t) if m >= n else (lambda t: t.T)
    negative_seen = False
    for g in random_gradients(shape, steps=4, dtype=torch.float64):
        buffer = untall(opt.state[x]["momentum"] + g)
        before = x.detach().clone()
        x.grad = g
        opt.step()
        q = opt.state[x]["Q"]
        torch.testing.assert_close(q.T @ q, torch.eye(q.shape[1], dtype=q.dtype), rtol=0, atol=1e-10)
        direction = untall(applied_direction(before, x.detach(), lr))
        p = direction @ q
        w = buffer.T @ p
        _, householder_r = torch.linalg.qr(w)
        negative_seen |= bool((householder_r.diagonal() < 0).any())
        r_diagonal = (q * w).sum(dim=0)  # diag(Q^T W) = diag(R) of W = Q R
        assert (r_diagonal > 0).all()
        inner = (buffer * direction).sum()
        torch.testing.assert_close(inner, r_diagonal.sum(), rtol=1e-8, atol=0)
        assert inner > 0
    assert negative_seen, "the test needs a W whose Householder R has a negative diagonal entry"


def nu_from_full_svd(direction, rank):
    sigma = torch.linalg.svdvals(direction.double())
    return max(sigma[0].item(), sigma.sum().item() / rank)


@pytest.mark.parametrize("normalization", ["column", "qr"])
def test_nu_from_the_right_factor(normalization):
    shape, lr = (40, 32), 0.01
    x, opt = matrix_and_optimizer(shape, rank_fraction=0.5, normalization=normalization, weight_decay=0.0, lr=lr)
    rank = 16
    for g in random_gradients(shape, steps=3):
        before = x.detach().clone()
        x.grad = g
        opt.step()
        nu = opt.spectral_by_matrix()["w"]["nu"]
        torch.testing.assert_close(nu, nu_from_full_svd(applied_direction(before, x.detach(), lr), rank),
                                   rtol=0, atol=1e-4)
        if normalization == "qr":
            assert abs(nu - 1.0) <= 1e-5
        else:
            assert 1 - 1e-6 <= nu <= math.sqrt(rank) and nu > 1.01
    stats = opt.spectral_stats()
    assert stats["nu_mean"] == stats["nu_max"] == nu and stats["active_rank_share"] == 1.0


# ------------------------------------------------------------------ zero gradient, validation

@pytest.mark.parametrize("normalization", ["column", "qr"])
@pytest.mark.parametrize("qr_method", ["householder", "cholesky_qr"])
def test_zero_gradient_gives_zero_update_and_keeps_q(normalization, qr_method):
    x, opt = matrix_and_optimizer((16, 24), normalization=normalization, qr_method=qr_method, weight_decay=0.1,
                                  lr=0.01)
    before, q_before = x.detach().clone(), opt.state[x]["Q"].clone()
    x.grad = torch.zeros_like(x)
    opt.step()
    assert torch.isfinite(x).all() and torch.isfinite(opt.state[x]["Q"]).all()
    torch.testing.assert_close(x.detach(), before * (1 - 0.01 * 0.1), rtol=0, atol=0)
    torch.testing.assert_close(opt.state[x]["Q"], q_before, rtol=0, atol=0)
    assert not opt.state[x]["momentum"].any()


@pytest.mark.parametrize("option, value", [
    ("rank_fraction", 0.0), ("rank_fraction", 1.5), ("ef_beta", 1.2), ("ef_beta", -0.1), ("captured_share", 1.0),
    ("normalization", "svd"), ("qr_method", "gram_schmidt"),
])
def test_invalid_options_are_named(option, value):
    x = torch.nn.Parameter(torch.randn(8, 8))
    with pytest.raises(ValueError, match=option):
        Dion([x], **{option: value})


def test_vector_in_a_dion_group_is_named_with_the_fix():
    groups = [dict(params=[torch.nn.Parameter(torch.randn(8, 8)), torch.nn.Parameter(torch.ones(8))],
                   names=["blocks.0.attn.qkv.weight", "blocks.0.attn_norm.weight"])]
    with pytest.raises(ValueError, match=r"'blocks\.0\.attn_norm\.weight'.*algorithm='adamw'"):
        Dion(groups)


# ------------------------------------------------------------------ AdamW groups, checkpoints, single-process comm

def test_adamw_groups_match_torch_adamw():
    torch.manual_seed(0)
    a, b = torch.nn.Parameter(torch.randn(5, 3)), torch.nn.Parameter(torch.randn(7))
    a_ref, b_ref = (torch.nn.Parameter(t.detach().clone()) for t in (a, b))
    opt = Dion([dict(params=[a], algorithm="adamw", weight_decay=0.1), dict(params=[b], algorithm="adamw")],
               lr=0.003, betas=(0.8, 0.9), eps=1e-6, weight_decay=0.0)
    ref = torch.optim.AdamW([dict(params=[a_ref], weight_decay=0.1), dict(params=[b_ref], weight_decay=0.0)],
                            lr=0.003, betas=(0.8, 0.9), eps=1e-6)
    for _ in range(4):
        for p, q in ((a, a_ref), (b, b_ref)):
            p.grad = torch.randn_like(p)
            q.grad = p.grad.clone()
        opt.step()
        ref.step()
    torch.testing.assert_close(a, a_ref, rtol=0, atol=1e-6)
    torch.testing.assert_close(b, b_ref, rtol=0, atol=1e-6)


def mixed_params(dtype=torch.float32):
    torch.manual_seed(0)
    return [torch.nn.Parameter(torch.randn(*shape, dtype=dtype)) for shape in ((64, 40), (24, 64), (64,))]


def mixed_optimizer(params, **options):
    """Two hidden matrices (tall, wide) with Dion and a vector with AdamW."""
    groups = [dict(params=params[:2], names=["tall", "wide"]),
              dict(params=params[2:], names=["norm"], algorithm="adamw", weight_decay=0.0)]
    return Dion(groups, **options)


def run(params, opt, grads):
    for step_grads in grads:
        for p, g in zip(params, step_grads):
            p.grad = g.to(p.dtype)
        opt.step()


def gradient_steps(params, steps, seed, low_rank=None):
    generator = torch.Generator().manual_seed(seed)

    def one(p):
        if low_rank is not None and p.ndim == 2:
            return torch.randn(p.shape[0], low_rank, generator=generator) @ torch.randn(low_rank, p.shape[1],
                                                                                       generator=generator)
        return torch.randn(*p.shape, generator=generator)

    return [[one(p) for p in params] for _ in range(steps)]


@pytest.mark.parametrize("options", [dict(normalization="column"), dict(normalization="qr", ef_beta=0.5),
                                     dict(normalization="qr", adaptive_rank=True, rank_fraction=0.75, r_min=8)],
                         ids=["dion", "orth_dion", "ada_orth_dion"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_state_dict_round_trip_is_exact(options, dtype):
    params = mixed_params(dtype)
    opt = mixed_optimizer(params, **options)
    run(params, opt, gradient_steps(params, 3, seed=1, low_rank=2))
    saved = copy.deepcopy(opt.state_dict())
    params_copy = [torch.nn.Parameter(p.detach().clone()) for p in params]
    restored = mixed_optimizer(params_copy, **options)
    restored.load_state_dict(saved)
    for p, q in zip(params, params_copy):
        for key, value in opt.state[p].items():
            assert restored.state[q][key].dtype == value.dtype and torch.equal(restored.state[q][key], value), key
    assert restored.state[params_copy[0]]["Q"].dtype == torch.float32
    later = gradient_steps(params, 3, seed=2)
    run(params, opt, later)
    run(params_copy, restored, later)
    for p, q in zip(params, params_copy):
        assert torch.equal(p, q)
    assert opt.spectral_stats() == restored.spectral_stats()


def test_single_process_communicator_sends_nothing():
    params, reference_params = mixed_params(), mixed_params()
    opt, reference = mixed_optimizer(params, communicator=Communicator()), mixed_optimizer(reference_params)
    grads = gradient_steps(params, 2, seed=1)
    run(params, opt, grads)
    run(reference_params, reference, grads)
    assert opt.communicator.records == []
    for p, q in zip(params, reference_params):
        assert torch.equal(p, q)


# ------------------------------------------------------------------ Ada-Orth-Dion

@pytest.mark.parametrize("fraction, r_min, shape, bounds", [
    (0.5, 16, (256, 128), (16, 64)),
    (0.3, 16, (200, 100), (16, 30)),  # r_cap = ceil(0.3 * 100), not rounded to a multiple of 8
    (0.25, 16, (80, 80), (16, 20)),
    (0.25, 16, (64, 64), (16, 16)),
    (0.1, 16, (64, 64), (7, 7)),  # r_min > r_cap: r_min = r_cap
])
def test_rank_bounds_follow_the_spec(fraction, r_min, shape, bounds):
    assert rank_bounds(fraction, r_min, *shape) == bounds


def test_rank_controller_rule():
    assert next_rank(64, erank_ema=1.0, gamma=2.0, low=16, high=64) == 56  # shrink by at most 8
    assert next_rank(16, erank_ema=100.0, gamma=2.0, low=16, high=64) == 32  # grow by at most 16
    assert next_rank(40, erank_ema=21.0, gamma=2.0, low=16, high=64) == 40  # target 42 -> 40
    assert next_rank(40, erank_ema=22.5, gamma=2.0, low=16, high=64) == 48  # target 45 -> 48
    assert next_rank(56, erank_ema=30.0, gamma=2.0, low=16, high=64) == 64  # target 60 -> 64
    assert next_rank(24, erank_ema=0.5, gamma=2.0, low=16, high=24) == 16
    assert next_rank(16, erank_ema=40.0, gamma=2.0, low=16, high=30) == 30  # target 80 -> 30 -> 32 -> 30: r_cap
    assert next_rank(30, erank_ema=11.0, gamma=2.0, low=16, high=30) == 24  # target 22 -> 24


@pytest.mark.parametrize("shape, fraction, cap", [((200, 100), 0.3, 30), ((80, 80), 0.25, 20), ((64, 64), 0.5, 32)])
def test_adaptive_rank_starts_at_the_cap_and_adapts_below_it(shape, fraction, cap):
    """A buffer with a fast-decaying spectrum (effective rank about 3) drives the rank from r_cap down to r_min;
    the active rank share is r / r_cap with the spec's r_cap."""
    x, opt = matrix_and_optimizer(shape, normalization="qr", adaptive_rank=True, rank_fraction=fraction, r_min=16)
    assert opt.state[x]["Q"].shape[1] == cap
    generator = torch.Generator().manual_seed(0)
    u, _ = torch.linalg.qr(torch.randn(shape[0], min(shape), generator=generator))
    v, _ = torch.linalg.qr(torch.randn(shape[1], min(shape), generator=generator))
    spectrum = 0.5 ** torch.arange(min(shape), dtype=torch.float32)
    ranks = []
    for _ in range(12):
        x.grad = u @ torch.diag(spectrum) @ v.T
        opt.step()
        ranks.append(opt.state[x]["Q"].shape[1])
    assert ranks[0] == cap and ranks[-1] == 16
    assert opt.spectral_stats()["active_rank_share"] == pytest.approx(16 / cap)


def test_shrinking_keeps_the_strongest_directions():
    """Q spans the buffer's top-24 right singular vectors in a random order; after a shrink to 16 the kept
    columns span the top 16 (leading columns of an unordered basis would not)."""
    m, n = 64, 48
    x, opt = matrix_and_optimizer((m, n), normalization="qr", adaptive_rank=True, rank_fraction=0.5, r_min=8)
    generator = torch.Generator().manual_seed(3)
    u, _ = torch.linalg.qr(torch.randn(m, n, generator=generator))
    v, _ = torch.linalg.qr(torch.randn(n, n, generator=generator))
    spectrum = 0.7 ** torch.arange(n, dtype=torch.float32)
    mixing, _ = torch.linalg.qr(torch.randn(24, 24, generator=generator))
    state = opt.state[x]
    state["momentum"].copy_(u @ torch.diag(spectrum) @ v.T)
    state["Q"] = v[:, :24] @ mixing
    for _ in range(2):  # the shrink decided at the first step takes effect at the second
        x.grad = torch.zeros_like(x)
        opt.step()
    kept = state["Q"]
    assert kept.shape[1] == 16
    angles = torch.linalg.svdvals(v[:, :16].T.double() @ kept.double()).clamp(max=1).arccos()
    assert angles.max() < 1e-3


def test_adaptive_rank_falls_for_low_rank_gradients_and_recovers():
    shape = (96, 80)
    x, opt = matrix_and_optimizer(shape, normalization="qr", adaptive_rank=True, rank_fraction=0.8, r_min=16,
                                  rank_ema=0.5)
    low, high = rank_bounds(0.8, 16, *shape)
    assert (low, high) == (16, 64) and opt.state[x]["Q"].shape[1] == 64
    generator = torch.Generator().manual_seed(0)
    left, right = torch.randn(96, 2, generator=generator), torch.randn(2, 80, generator=generator)
    ranks = [64]
    for step in range(16):
        if step < 8:
            g = left @ torch.diag(torch.randn(2, generator=generator)) @ right
        else:
            g = torch.randn(*shape, generator=generator)
        x.grad = g
        opt.step()
        assert torch.isfinite(x).all()
        ranks.append(int(opt.state[x]["rank"]))
    for before, after in zip(ranks, ranks[1:]):
        assert low <= after <= high and after % 8 == 0 and -8 <= after - before <= 16
    assert ranks[:9] == [64, 56, 48, 40, 32, 24, 16, 16, 16]
    assert max(ranks[9:]) > 16
    q = opt.state[x]["Q"]
    assert q.shape[1] == ranks[-2]  # Q carries the rank of the last update; the next one runs at ranks[-1]
    assert opt.spectral_stats()["active_rank_share"] == ranks[-2] / high


# ------------------------------------------------------------------ registry and the Muon baseline

@pytest.mark.parametrize("name, normalization, adaptive",
                         [("dion", "column", False), ("orth_dion", "qr", False), ("ada_orth_dion", "qr", True)])
def test_registry_routes_hidden_matrices_to_dion(name, normalization, adaptive):
    model = Transformer(model_config("smoke"))
    opt = build_optimizer({"name": name, "lr": 0.02, "rank_fraction": 0.5}, model)
    assert isinstance(opt, Dion)
    hidden = {id(p) for _, p in model.hidden_matrices()}
    for group in opt.param_groups:
        assert all((id(p) in hidden) == (group["algorithm"] == "dion") for p in group["params"])
        if group["algorithm"] == "dion":
            assert (group["normalization"], group["adaptive_rank"], group["lr"]) == (normalization, adaptive, 0.02)
    tokens = torch.randint(0, 512, (2, 16))
    model.loss(tokens, tokens).backward()
    opt.step()
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_registry_rejects_options_of_another_method():
    with pytest.raises(ValueError, match="rank_gamma"):
        build_optimizer({"name": "orth_dion", "rank_gamma": 3.0}, Transformer(model_config("smoke")))


def test_muon_entry_equals_torch_muon_plus_adamw_and_round_trips():
    torch.manual_seed(0)
    model = Transformer(model_config("smoke"))
    reference_model = copy.deepcopy(model)
    config = {"name": "muon", "ns_matmul": "torch"}  # torch's bfloat16 kernels, as torch.optim.Muon on any CPU
    opt = build_optimizer(config, model)
    assert isinstance(opt, MuonAdamW)
    matrices = [p for _, p in reference_model.hidden_matrices()]
    others = [p for p in reference_model.parameters() if all(p is not q for q in matrices)]
    ref_muon = torch.optim.Muon(matrices, lr=0.02, weight_decay=0.01, momentum=0.95)
    ref_adamw = torch.optim.AdamW([dict(params=[p for p in others if p.ndim >= 2], weight_decay=0.01),
                                   dict(params=[p for p in others if p.ndim < 2], weight_decay=0.0)],
                                  lr=0.02, betas=(0.9, 0.95), eps=1e-8)
    tokens = torch.randint(0, 512, (2, 16))

    def train(m, optimizers, steps):
        for _ in range(steps):
            for o in optimizers:
                o.zero_grad()
            m.loss(tokens, tokens).backward()
            for o in optimizers:
                o.step()

    train(model, [opt], 2)
    train(reference_model, [ref_muon, ref_adamw], 2)
    for p, q in zip(model.parameters(), reference_model.parameters()):
        assert torch.equal(p, q)
    restored_model = copy.deepcopy(model)
    restored = build_optimizer(config, restored_model)
    restored.load_state_dict(copy.deepcopy(opt.state_dict()))
    train(model, [opt], 2)
    train(restored_model, [restored], 2)
    for p, q in zip(model.parameters(), restored_model.parameters()):
        assert torch.equal(p, q)


def test_an_installed_basis_changes_the_next_step_and_the_power_iteration_then_forgets_it():
    """Why lordo_orth_dion ends within 1e-3 nats of orth_dion_local: the basis installed at a sync (top right
    singular vectors of Delta) changes the next update, but Q is only the warm start of one power iteration per
    step, so on gradients with a steady top subspace both runs' Q converge to it within a few steps."""
    from lowcomm.optim.projection import principal_angles

    generator = torch.Generator().manual_seed(3)
    u, v = (torch.linalg.qr(torch.randn(n, 4, generator=generator))[0] for n in (24, 16))  # rank r = 4 signal
    signal = u @ torch.diag(torch.tensor([10.0, 6.0, 4.0, 3.0])) @ v.T
    grads = [signal + 0.1 * torch.randn(24, 16, generator=generator) for _ in range(12)]
    runs = [matrix_and_optimizer((24, 16), rank_fraction=0.25, normalization="qr", lr=0.01, captured_share=0.95)
            for _ in range(2)]
    for x, opt in runs:
        x.grad = grads[0].clone()
        opt.step()
    runs[1][1].set_bases_from([torch.randn(24, 16, generator=generator)])  # another basis, as a sync installs
    (x0, opt0), (x1, opt1) = runs
    assert principal_angles(opt0.state[x0]["Q"], opt1.state[x1]["Q"]).max() > 0.5
    angles, gaps = [], []
    for g in grads[1:]:
        before = (x0.detach().clone(), x1.detach().clone())
        for x, opt in runs:
            x.grad = g.clone()
            opt.step()
        gaps.append(float(((x0.detach() - before[0]) - (x1.detach() - before[1])).norm()))
        angles.append(float(principal_angles(opt0.state[x0]["Q"], opt1.state[x1]["Q"]).max()))
    assert gaps[0] > 1e-3  # the installed basis changes what the next step does
    assert angles[-1] < 1e-2 and gaps[-1] < 1e-2 * gaps[0]  # and is forgotten a few steps later
