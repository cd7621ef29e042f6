"""LowRankAdam against torch.optim.AdamW, closed forms of its terms, the stagnation invariant, state
accounting, checkpoint round trips, input checks and the registry presets."""

import copy
import math

import pytest
import torch
from torch import nn

from lowcomm.model import Transformer, model_config
from lowcomm.optim import LowRankAdam, build_optimizer, param_groups
from lowcomm.optim.projection import (
    lift,
    principal_angles,
    project,
    projection_side,
    top_basis,
)

BETAS = (0.9, 0.95)


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def orthonormal(n: int, k: int, seed: int) -> torch.Tensor:
    return torch.linalg.qr(torch.randn(n, k, generator=gen(seed)))[0]


def signed_permutation(r: int, seed: int) -> torch.Tensor:
    g = gen(seed)
    return torch.eye(r)[torch.randperm(r, generator=g)] * torch.where(torch.rand(r, generator=g) < 0.5, -1.0, 1.0)


def matrix_optimizer(W: torch.Tensor, rank: int, **options) -> LowRankAdam:
    return LowRankAdam([dict(params=[W], names=["W"], algorithm="lowrank", rank=rank)], **options)


def step_with(opt: torch.optim.Optimizer, params: list[torch.Tensor], grads: list[torch.Tensor]) -> None:
    for p, g in zip(params, grads):
        p.grad = g.clone()
    opt.step()


class Tiny(nn.Module):
    """Two hidden matrices of opposite sides, an embedding and a norm weight."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(11, 6)
        self.up = nn.Linear(6, 10, bias=False)
        self.down = nn.Linear(10, 6, bias=False)
        self.norm = nn.Parameter(torch.ones(6))

    def hidden_matrices(self):
        return [("up.weight", self.up.weight), ("down.weight", self.down.weight)]


# ------------------------------------------------------------------------------ reference: AdamW
@pytest.mark.parametrize("shape", [(6, 10), (10, 6)])
@pytest.mark.parametrize("basis_kind", ["identity", "signed_permutation"])
def test_full_rank_identity_basis_equals_adamw(shape, basis_kind):
    """rank = min(p, q), Q = I (or a signed permutation), omega = 1, no E, no rotation: AdamW step for step."""
    r = min(shape)
    W = torch.randn(shape, generator=gen(0))
    b = torch.randn(5, generator=gen(1))
    ours, theirs = [W.clone().requires_grad_(), b.clone().requires_grad_()], [W.clone().requires_grad_(),
                                                                              b.clone().requires_grad_()]
    opt = LowRankAdam(
        [dict(params=[ours[0]], names=["W"], algorithm="lowrank", rank=r),
         dict(params=[ours[1]], names=["b"], algorithm="adamw", weight_decay=0.05)],
        lr=1e-2, betas=BETAS, eps=1e-8, weight_decay=0.1, omega=1.0, error_feedback=False, rotation="none",
    )
    Q = torch.eye(r) if basis_kind == "identity" else signed_permutation(r, seed=2)
    opt.set_basis(ours[0], Q)
    ref = torch.optim.AdamW([dict(params=[theirs[0]], weight_decay=0.1), dict(params=[theirs[1]], weight_decay=0.05)],
                            lr=1e-2, betas=BETAS, eps=1e-8)
    g = gen(3)
    for _ in range(20):
        grads = [torch.randn(shape, generator=g), torch.randn(5, generator=g)]
        step_with(opt, ours, grads)
        step_with(ref, theirs, grads)
        for a, b_ in zip(ours, theirs):
            torch.testing.assert_close(a, b_, atol=1e-6, rtol=0)


def test_rotated_full_rank_basis_is_adam_in_rotated_coordinates():
    """With a generic orthonormal Q of full rank (left side), no error feedback and omega = 1, the step is AdamW on
    X = Q^T W with gradients Q^T G, so W = Q X; Adam is not rotation-invariant, so this differs from AdamW on W."""
    W = torch.randn(6, 6, generator=gen(4))
    Q = orthonormal(6, 6, seed=5)
    ours, plain = W.clone().requires_grad_(), W.clone().requires_grad_()
    rotated = (Q.T @ W).requires_grad_()
    opt = matrix_optimizer(ours, 6, lr=1e-2, omega=1.0, error_feedback=False)
    opt.set_basis(ours, Q)
    assert projection_side(tuple(W.shape)) == "left"
    rotated_adamw = torch.optim.AdamW([rotated], lr=1e-2, betas=BETAS, weight_decay=0.0)
    plain_adamw = torch.optim.AdamW([plain], lr=1e-2, betas=BETAS, weight_decay=0.0)
    g = gen(6)
    for _ in range(5):
        grad = torch.randn(6, 6, generator=g)
        step_with(opt, [ours], [grad])
        step_with(rotated_adamw, [rotated], [Q.T @ grad])
        step_with(plain_adamw, [plain], [grad])
    torch.testing.assert_close(ours.detach(), Q @ rotated.detach(), atol=1e-5, rtol=0)
    assert (ours - plain).abs().max() > 1e-3


# ------------------------------------------------------------------------- closed forms of one step
@pytest.mark.parametrize("shape", [(5, 8), (8, 5)])
@pytest.mark.parametrize("qh_denominator", ["rank_mean", "lift", "scalar"])
def test_first_step_full_rank_term_closed_form(shape, qh_denominator):
    """omega = 0, step 1 (vh = g^2): Delta W = -lr G / (qh_scale (sqrt(D) + eps)) with D = column/row mean of g^2
    over the rank axis, (Q o Q) g^2, or mean(g^2)."""
    side, r, lr, qh_scale = projection_side(shape), 2, 0.1, 2.0
    W = torch.randn(shape, generator=gen(7)).requires_grad_()
    W0 = W.detach().clone()
    Q = orthonormal(min(shape), r, seed=8)
    opt = matrix_optimizer(W, r, lr=lr, omega=0.0, qh_scale=qh_scale, qh_denominator=qh_denominator, eps=1e-8)
    opt.set_basis(W, Q)
    G = torch.randn(shape, generator=gen(9))
    step_with(opt, [W], [G])
    g2 = (Q.T @ G if side == "left" else G @ Q).square()
    rank_axis = 0 if side == "left" else 1
    D = {"rank_mean": g2.mean(dim=rank_axis, keepdim=True),
         "lift": (Q * Q) @ g2 if side == "left" else g2 @ (Q * Q).T,
         "scalar": g2.mean()}[qh_denominator]
    torch.testing.assert_close(W.detach() - W0, -lr * G / (qh_scale * (D.sqrt() + 1e-8)), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("shape", [(5, 8), (8, 5)])
def test_first_step_low_rank_term_closed_form_without_bias_correction(shape):
    """omega = 1, step 1, no bias correction: Delta W = -lr lift((1 - b1) g / (sqrt(1 - b2) |g| + eps))."""
    side, r, lr = projection_side(shape), 3, 0.1
    W = torch.randn(shape, generator=gen(10)).requires_grad_()
    W0 = W.detach().clone()
    Q = orthonormal(min(shape), r, seed=11)
    opt = matrix_optimizer(W, r, lr=lr, omega=1.0, bias_correction=False, eps=1e-8)
    opt.set_basis(W, Q)
    G = torch.randn(shape, generator=gen(12))
    step_with(opt, [W], [G])
    g = project(G, Q, side)
    expected = -lr * lift((1 - BETAS[0]) * g / ((1 - BETAS[1]) ** 0.5 * g.abs() + 1e-8), Q, side)
    torch.testing.assert_close(W.detach() - W0, expected, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("omega", [0.0, 1.0])
def test_update_rms_matches_the_applied_step(omega):
    W = torch.randn(6, 9, generator=gen(13)).requires_grad_()
    opt = matrix_optimizer(W, 2, lr=0.01, omega=omega, weight_decay=0.0)
    assert all(math.isnan(v) for v in opt.last_update_rms().values())
    opt.set_basis(W, orthonormal(6, 2, seed=14))
    for i in range(3):
        before = W.detach().clone()
        step_with(opt, [W], [torch.randn(6, 9, generator=gen(15 + i))])
    applied_rms = ((W.detach() - before) / 0.01).square().mean().sqrt().item()
    rms = opt.last_update_rms()
    active, inactive = ("low", "full") if omega == 1.0 else ("full", "low")
    assert rms[active] == pytest.approx(applied_rms, rel=1e-5)
    assert rms[inactive] == 0.0


def test_update_rms_per_matrix_matches_each_applied_term():
    """Per matrix, 'full/<name>' and 'low/<name>' are the RMS of the applied (1 - omega) full and omega low terms,
    each computed here from the step's closed form; the overall RMS weights them by size."""
    shapes = {"a": (6, 9), "b": (8, 4)}
    Ws = {n: torch.randn(shape, generator=gen(31 + i)).requires_grad_() for i, (n, shape) in enumerate(shapes.items())}
    omega, lr, eps = 0.7, 0.01, 1e-8
    opt = LowRankAdam([dict(params=list(Ws.values()), names=list(Ws), algorithm="lowrank", rank=2)], lr=lr,
                      omega=omega, weight_decay=0.0, eps=eps)
    for i, (n, W) in enumerate(Ws.items()):
        opt.set_basis(W, orthonormal(min(W.shape), 2, seed=33 + i))
    grads = [torch.randn(W.shape, generator=gen(35 + i)) * (1 + 9 * i) for i, W in enumerate(Ws.values())]
    step_with(opt, list(Ws.values()), grads)
    rms = opt.last_update_rms()
    for (n, W), G in zip(Ws.items(), grads):
        side, Q = projection_side(W.shape), opt.state[W]["basis"]
        g = project(G, Q, side)  # step 1: E = 0, uh = g, vh = g^2
        low = omega * lift(g / (g.abs() + eps), Q, side)
        vh_mean = g.square().mean(dim=0 if side == "left" else 1, keepdim=True)
        full = (1 - omega) * G / (vh_mean.sqrt() + eps)
        assert rms[f"low/{n}"] == pytest.approx(low.square().mean().sqrt().item(), rel=1e-4)
        assert rms[f"full/{n}"] == pytest.approx(full.square().mean().sqrt().item(), rel=1e-4)
    sizes = {n: W.numel() for n, W in Ws.items()}
    for term in ("full", "low"):
        weighted = sum(rms[f"{term}/{n}"] ** 2 * k for n, k in sizes.items()) / sum(sizes.values())
        assert rms[term] == pytest.approx(weighted ** 0.5, rel=1e-5)


def test_unmeasured_steps_take_the_same_step_and_keep_the_last_measured_rms():
    """Without measure_update_rms a step skips the norms only: the weights equal a measuring twin's, and
    last_update_rms stays that of the last measured step until the next one is measured."""
    Ws = [torch.randn(6, 9, generator=gen(40)).requires_grad_() for _ in range(2)]
    Ws[1].data.copy_(Ws[0].detach())
    opts = [matrix_optimizer(W, 2, lr=0.01, omega=0.7) for W in Ws]
    for opt, W in zip(opts, Ws):
        opt.set_basis(W, orthonormal(6, 2, seed=41))
    history = []
    for i in range(3):
        opts[1].measure_update_rms = i != 1
        G = torch.randn(6, 9, generator=gen(42 + i))
        for opt, W in zip(opts, Ws):
            step_with(opt, [W], [G.clone()])
        assert torch.equal(Ws[0].detach(), Ws[1].detach())
        history.append(opts[0].last_update_rms())
        assert opts[1].last_update_rms() == history[i if i != 1 else 0]
    assert history[1] != history[0]


# ------------------------------------------------------------------------ error feedback and the hook
@pytest.mark.parametrize("shape", [(6, 9), (9, 6)])
def test_error_feedback_identity_in_the_optimizer(shape):
    """G + E_old = lift(g) + E_new, with g as handed to the projected-gradient hook."""
    side = projection_side(shape)
    W = torch.randn(shape, generator=gen(16)).requires_grad_()
    opt = matrix_optimizer(W, 2, lr=0.01)
    opt.set_basis(W, orthonormal(min(shape), 2, seed=17))
    seen = []
    opt.projected_gradient_hook = lambda gs: seen.append([g.clone() for g in gs])
    for i in range(3):
        E_old = opt.state[W]["error"].clone() if W in opt.state else torch.zeros(shape)
        G = torch.randn(shape, generator=gen(18 + i))
        step_with(opt, [W], [G])
        g, E_new, Q = seen[-1][0], opt.state[W]["error"], opt.state[W]["basis"]
        torch.testing.assert_close(G + E_old, lift(g, Q, side) + E_new, atol=1e-6, rtol=0)
    assert E_old.abs().sum() > 0  # error feedback actually accumulated


def test_hook_receives_all_projected_gradients_once_and_its_edits_are_used():
    model = Tiny()
    opt = LowRankAdam(param_groups(model, "lowrank", 0.0, rank=2), lr=0.1, omega=1.0)
    opt.set_bases_from([p.detach() for p in opt.lowrank_params()])
    calls = []

    def zero_all(gs):
        calls.append([tuple(g.shape) for g in gs])
        for g in gs:
            g.zero_()

    opt.projected_gradient_hook = zero_all
    before = [p.detach().clone() for p in opt.lowrank_params()]
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    opt.step()
    assert calls == [[(10, 2), (2, 10)]]  # up is 10 x 6 (g = A Q), down is 6 x 10 (g = Q^T A)
    for p, b in zip(opt.lowrank_params(), before):
        assert torch.equal(p.detach(), b)  # u stays 0 and omega = 1: the matrices do not move
    assert not torch.equal(model.embed.weight.grad, torch.zeros_like(model.embed.weight))


# ------------------------------------------------------------------------------------- bases
def test_external_basis_must_be_set_before_the_first_step():
    W = torch.randn(4, 6).requires_grad_()
    opt = matrix_optimizer(W, 2)
    W.grad = torch.randn(4, 6)
    with pytest.raises(RuntimeError, match="set_basis"):
        opt.step()
    with pytest.raises(ValueError, match="4 x 2"):
        opt.set_basis(W, torch.eye(6)[:, :2])


def test_local_basis_is_refreshed_from_gradient_plus_error():
    W = torch.randn(5, 8, generator=gen(20)).requires_grad_()
    opt = matrix_optimizer(W, 2, lr=0.01, basis="local", refresh_every=3)
    bases = []
    for i in range(5):
        G = torch.randn(5, 8, generator=gen(21 + i))
        accumulated = G + opt.state[W]["error"] if W in opt.state else G
        step_with(opt, [W], [G])
        bases.append(opt.state[W]["basis"].clone())
        if i in (0, 3):
            assert torch.equal(bases[-1], top_basis(accumulated, 2, "left"))
    assert torch.equal(bases[0], bases[2]) and not torch.equal(bases[2], bases[3])


def test_set_basis_rotates_or_resets_the_moments():
    W = torch.randn(6, 9, generator=gen(26)).requires_grad_()
    Q = orthonormal(6, 3, seed=27)
    for rotation in ("rotate", "reset"):
        opt = matrix_optimizer(W, 3, lr=0.0, rotation=rotation)
        opt.set_basis(W, Q)
        for i in range(3):
            step_with(opt, [W], [torch.randn(6, 9, generator=gen(28 + i))])
        lifted_u = Q @ opt.state[W]["exp_avg"]
        opt.set_basis(W, Q @ signed_permutation(3, seed=31))
        if rotation == "rotate":
            torch.testing.assert_close(opt.state[W]["basis"] @ opt.state[W]["exp_avg"], lifted_u, atol=1e-6, rtol=0)
        else:
            assert not opt.state[W]["exp_avg"].any() and not opt.state[W]["exp_avg_sq"].any()
        assert opt.state[W]["step"].item() == 3  # D5: the step counter is never reset


# ------------------------------------------------------------------------ the stagnation invariant
@pytest.mark.parametrize("omega", [1.0, 0.7])
def test_global_basis_stagnates_without_the_full_rank_term(omega):
    """omega = 1, wd = 0: every local update lies in range(Q), so does Delta after K steps, and the top-r
    basis of Delta is Q again. omega = 0.7 adds a full-rank term and the basis moves."""
    shape, r, K = (12, 20), 3, 8
    W = torch.randn(shape, generator=gen(32)).requires_grad_()
    opt = matrix_optimizer(W, r, lr=0.01, omega=omega, weight_decay=0.0)
    Q = top_basis(torch.randn(shape, generator=gen(33)), r, "left")
    opt.set_basis(W, Q)
    anchor = W.detach().clone()
    g = gen(34)
    for _ in range(K):
        step_with(opt, [W], [torch.randn(shape, generator=g)])
    delta = W.detach() - anchor
    residual = (delta - Q @ (Q.T @ delta)).norm() / delta.norm()
    angle = principal_angles(Q, top_basis(delta, r, "left")).max()
    if omega == 1.0:
        assert residual < 1e-5 and angle < 1e-3
    else:
        assert residual > 0.1 and angle > 0.1


# ------------------------------------------------------------------------------- state accounting
def test_state_bytes_match_the_closed_form():
    model = Tiny()
    r = 2
    opt = LowRankAdam(param_groups(model, "lowrank", 0.1, rank=r), lr=1e-3)
    opt.set_bases_from([torch.randn_like(p) for p in opt.lowrank_params()])
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    opt.step()
    matrices = [p.shape for p in opt.lowrank_params()]
    others = [p for p in model.parameters() if all(p is not q for q in opt.lowrank_params())]
    assert opt.state_bytes() == {
        "moments": sum(2 * r * max(s) * 4 for s in matrices),
        "bases": sum(r * min(s) * 4 for s in matrices),
        "error_feedback": sum(s[0] * s[1] * 4 for s in matrices),
        "adamw_moments": sum(2 * p.numel() * 4 for p in others),
    }
    adamw = torch.optim.AdamW([model.up.weight, model.down.weight])
    adamw.step()
    adamw_bytes = sum(t.numel() * t.element_size() for s in adamw.state.values()
                      for k, t in s.items() if k != "step")
    assert adamw_bytes == sum(2 * s[0] * s[1] * 4 for s in matrices)


# ------------------------------------------------------------------------------- checkpoint round trip
@pytest.mark.parametrize("options", [
    dict(basis="local", refresh_every=2, rotation="rotate", omega=0.7),
    dict(basis="external", rotation="rotate", omega=0.7, qh_denominator="lift"),
])
def test_state_dict_round_trip_resumes_bit_identically(options):
    torch.manual_seed(35)
    model = Tiny()

    def make(m):
        opt = LowRankAdam(param_groups(m, "lowrank", 0.1, rank=2), lr=0.01, **options)
        if options["basis"] == "external":
            opt.set_bases_from([torch.ones_like(p) + torch.eye(*p.shape) for p in opt.lowrank_params()])
        return opt

    def train(m, opt, seeds):
        for s in seeds:
            g = gen(s)
            for p in m.parameters():
                p.grad = torch.randn(p.shape, generator=g)
            opt.step()

    opt = make(model)
    train(model, opt, range(3))
    saved_model, saved_opt = copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict())
    assert all(isinstance(v, torch.Tensor) for s in saved_opt["state"].values() for v in s.values())
    train(model, opt, range(3, 7))

    resumed = Tiny()
    resumed.load_state_dict(saved_model)
    resumed_opt = make(resumed)
    resumed_opt.load_state_dict(saved_opt)
    train(resumed, resumed_opt, range(3, 7))
    for a, b in zip(model.parameters(), resumed.parameters()):
        assert torch.equal(a, b)
    for p, q in zip(model.parameters(), resumed.parameters()):
        for key, value in opt.state[p].items():
            assert torch.equal(value, resumed_opt.state[q][key])


# ------------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("rank, match", [(0, "'W'.*between 1 and min"), (7, "'W'.*min\\(p, q\\) = 4"),
                                         (None, "'W'.*integer rank")])
def test_bad_rank_names_the_parameter_and_the_fix(rank, match):
    with pytest.raises(ValueError, match=match):
        matrix_optimizer(torch.zeros(4, 6, requires_grad=True), rank)


def test_lowrank_on_a_vector_names_the_parameter_and_the_fix():
    with pytest.raises(ValueError, match="'norm.weight'.*algorithm='adamw'"):
        LowRankAdam([dict(params=[torch.zeros(6, requires_grad=True)], names=["norm.weight"], algorithm="lowrank",
                          rank=1)])


@pytest.mark.parametrize("option, value", [
    ("omega", 1.5), ("qh_scale", 0.0), ("qh_denominator", "median"), ("rotation", "spin"), ("basis", "global"),
    ("refresh_every", 0), ("basis_method", "qr"), ("betas", (0.9, 1.0)), ("error_feedback", 1),
])
def test_bad_options_fail_in_the_constructor(option, value):
    with pytest.raises(ValueError, match=f"{option}="):
        matrix_optimizer(torch.zeros(4, 6, requires_grad=True), 2, **{option: value})


def test_missing_algorithm_names_the_fix():
    with pytest.raises(ValueError, match="param_groups"):
        LowRankAdam([dict(params=[torch.zeros(4, 6, requires_grad=True)])])


# ------------------------------------------------------------------------------------- registry
def small_model() -> Transformer:
    torch.manual_seed(36)
    return Transformer(model_config("smoke"))


@pytest.mark.parametrize("name, expected", [
    ("galore", dict(basis="local", refresh_every=200, rotation="none", error_feedback=False, omega=1.0)),
    ("ldadam", dict(basis="local", refresh_every=1, rotation="rotate", error_feedback=True, omega=1.0)),
    ("lordo_local_step", dict(basis="external", rotation="rotate", error_feedback=True, omega=0.7,
                              qh_denominator="rank_mean", qh_scale=1.0)),
])
def test_registry_presets(name, expected):
    opt = build_optimizer({"name": name, "lr": 3e-3}, small_model())
    group = next(g for g in opt.param_groups if g["algorithm"] == "lowrank")
    assert {k: group[k] for k in expected} == expected
    assert group["rank"] == 64 // 8 and group["lr"] == 3e-3  # rank_share_of_smallest_dim 1/8 of d_model
    assert build_optimizer({"name": name, "rank": 4}, small_model()).param_groups[0]["rank"] == 4


def test_registry_rejects_unknown_keys_and_oversized_ranks():
    with pytest.raises(ValueError, match="optim.ranks"):
        build_optimizer({"name": "galore", "ranks": 4}, small_model())
    with pytest.raises(ValueError, match="min\\(p, q\\) = 64"):
        build_optimizer({"name": "galore", "rank": 65}, small_model())


@pytest.mark.parametrize("name", ["galore", "ldadam", "lordo_local_step"])
def test_presets_reduce_the_loss_on_a_fixed_batch(name):
    model = small_model()
    opt = build_optimizer({"name": name, "lr": 1e-2, "rank": 8}, model)
    tokens = torch.randint(0, 512, (2, 33), generator=gen(37))
    losses = []
    for step in range(8):
        opt.zero_grad()
        loss = model.loss(tokens[:, :-1], tokens[:, 1:])
        loss.backward()
        if step == 0 and name == "lordo_local_step":
            opt.set_bases_from([p.grad for p in opt.lowrank_params()])
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.1
