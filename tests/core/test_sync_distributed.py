"""Sync engines on two real gloo processes (spawned once for the module; every scenario runs inside that spawn and
each rank saves its observations, which the tests below compare across ranks)."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from support import METHODS, analytic_options, bases, batch, build, train_step

from lowcomm.cost.bytes import analytic_bytes_at, setup_bytes
from lowcomm.cost.shapes import param_shapes
from lowcomm.distributed.comm import Communicator
from lowcomm.distributed.options import sync_options
from lowcomm.distributed.sync import build_sync_engine
from lowcomm.model import Transformer, model_config
from lowcomm.optim import build_optimizer
from lowcomm.optim.projection import principal_angles, projection_side, top_basis

pytestmark = pytest.mark.slow  # trains with several worker processes

WORLD = 2
K = 4
STEPS = 3 * K  # three syncs
SHARED_BASES = ("lowrank_ddp", "lowrank_ddp_full", "lordo", "lordo_global_noqh", "lordo_orth_dion", "optimizer_sync")
OWN_BASES = ("lordo_local", "orth_dion_local")  # each worker's own Q, from its own data


def run_method(method: str, rank: int) -> dict:
    """STEPS steps of `method`; weights (and bases) after every sync and just before each sync, subspace movement,
    bytes on the wire by step."""
    comm = Communicator()
    model, optimizer, engine = build(method, comm)
    engine.setup()
    lowrank = optimizer.lowrank_params() if hasattr(optimizer, "lowrank_params") else []
    synced, between, angles = {}, {}, {}
    for t in range(1, STEPS + 1):
        train_step(model, optimizer, engine, t, rank)
        weights = [p.detach().clone() for p in model.parameters()]
        if engine.is_sync_step(t):
            synced[t] = {"weights": weights, "bases": [q.clone() for q in bases(optimizer)]}
            angles[t] = engine.metrics().get("subspace/max_angle")
        elif engine.is_sync_step(t + 1):
            between[t] = weights
    return {"synced": synced, "between": between, "angles": angles, "bytes": comm.wire_bytes_by_step(),
            "shapes": param_shapes(model, lowrank or None)}


def sgd_runs(rank: int) -> dict[str, list]:
    """Plain SGD, no momentum, no clipping: DDP, pseudo-gradient averaging with K = 1, and with K = 5 and the probe
    (its cosine at each sync, its own ledger and the method's)."""
    out = {}
    syncs = (("ddp", {"name": "ddp"}), ("average", {"name": "local_adam", "sync_every": 1}),
             ("probe", {"name": "diloco", "outer": "average", "sync_every": 5, "probe_cosine": True}))
    for name, sync in syncs:
        torch.manual_seed(1000 * rank)
        model = Transformer(model_config("smoke"))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
        comm = Communicator()
        engine = build_sync_engine(sync_options(sync), model, optimizer, comm)
        engine.setup()
        start = [p.detach().clone() for p in model.parameters()]
        cosines = {}
        for t in range(1, 11):
            train_step(model, optimizer, engine, t, rank, clip=None)
            cosines[t] = engine.metrics().get("probe/pseudo_gradient_cosine")
        out[name] = [p.detach().clone() for p in model.parameters()]
        out["start"] = start
    out["probe_cosines"] = cosines
    out["probe_ledgers"] = {"probe": engine.probe.comm.wire_bytes_by_step(), "method": comm.wire_bytes_by_step(),
                            "numel": sum(p.numel() for p in model.parameters())}
    return out


def k_step_and_local_averaging(method: str, rank: int) -> dict[int, tuple[list, list]]:
    """`method` (diloco or muloco) with outer lr 1 and momentum 0, and a reference: the same inner optimizer stepping
    locally, every K steps W = W_last + mean_m(W_m - W_last) with torch.distributed (W_last: the weights after the
    previous average); both weights after each sync. (torch's Muon orthogonalizes in bfloat16, so the comparison is of
    the same arithmetic.)"""
    model, optimizer, engine = build(method, Communicator(), sync={"outer_lr": 1.0, "outer_momentum": 0.0})
    torch.manual_seed(99)
    reference = Transformer(model_config("smoke"))
    reference.load_state_dict(model.state_dict())
    engine.setup()
    for p in reference.parameters():
        dist.broadcast(p.data, src=0)
    reference_optimizer = build_optimizer(METHODS[method][1], reference)
    last = [p.detach().clone() for p in reference.parameters()]
    out = {}
    for t in range(1, 2 * K + 1):
        train_step(model, optimizer, engine, t, rank)
        x, y = batch(rank, t)
        reference_optimizer.zero_grad(set_to_none=True)
        reference.loss(x, y).backward()
        torch.nn.utils.clip_grad_norm_(reference.parameters(), 1.0)
        reference_optimizer.step()
        if t % K == 0:
            for p, w in zip(reference.parameters(), last):
                delta = p.detach() - w
                dist.all_reduce(delta)
                p.data.copy_(w + delta / WORLD)
                w.copy_(p.detach())
            out[t] = ([p.detach().clone() for p in model.parameters()],
                      [p.detach().clone() for p in reference.parameters()])
    return out


def lordo_orth_dion_sync(rank: int) -> dict:
    """One sync of lordo_orth_dion taken apart: each rank's weights, anchor and buffers M just before it, and the
    weights, buffers M and right factors Q just after it."""
    model, optimizer, engine = build("lordo_orth_dion", Communicator())
    engine.setup()
    for t in range(1, K):
        train_step(model, optimizer, engine, t, rank)
    matrices = optimizer.matrix_params()
    x, y = batch(rank, K)
    optimizer.zero_grad(set_to_none=True)
    model.loss(x, y).backward()
    engine.before_optimizer_step(K, lambda: torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0))
    optimizer.step()
    before = {"weights": [p.detach().clone() for p in matrices],
              "anchor": [engine.pseudo.anchor[i].clone() for i, p in enumerate(engine.params)
                         if any(p is q for q in matrices)],
              "momentum": [optimizer.state[p]["momentum"].clone() for p in matrices]}
    engine.after_optimizer_step(K)
    after = {"weights": [p.detach().clone() for p in matrices],
             "momentum": [optimizer.state[p]["momentum"].clone() for p in matrices],
             "Q": [optimizer.state[p]["Q"].clone() for p in matrices]}
    return {"before": before, "after": after}


def resume_runs(method: str, rank: int, tmp: str, at: int = K, steps: int = 2 * K + 2) -> tuple[list, list]:
    """Losses of steps at+1..steps uninterrupted, and resumed from checkpoints (model, optimizer and engine state
    dicts per rank, saved at the sync step `at` and loaded with weights_only) into a differently initialized replica."""
    model, optimizer, engine = build(method, Communicator())
    engine.setup()
    losses = []
    for t in range(1, steps + 1):
        losses.append(train_step(model, optimizer, engine, t, rank))
        if t == at:
            assert engine.is_sync_step(t)
            path = os.path.join(tmp, f"{method}-{rank}.pt")
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "engine": engine.state_dict()}, path)
    checkpoint = torch.load(path, weights_only=True)
    model, optimizer, engine = build(method, Communicator(), seed=7)
    engine.setup()
    model.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    engine.load_state_dict(checkpoint["engine"])
    resumed = [train_step(model, optimizer, engine, t, rank) for t in range(int(checkpoint["engine"]["step"]) + 1,
                                                                           steps + 1)]
    return losses[at:], resumed


CLIP = 1e-3  # binds on both workers, with different scales


def first_basis(rank: int) -> dict:
    """LoRDO's first basis (D1) as installed, and the top-r bases of the mean clipped and mean raw gradients."""
    comm = Communicator()
    model, optimizer, engine = build("lordo", comm)
    engine.setup()
    x, y = batch(rank, 1)
    model.loss(x, y).backward()
    raw = [p.grad.detach().clone() for p in optimizer.lowrank_params()]
    norm = torch.nn.utils.get_total_norm([p.grad for p in model.parameters()])
    clipped = [g * (CLIP / (norm + 1e-6)) for g in raw]  # clip_grad_norm_'s scale
    for g in raw + clipped:
        dist.all_reduce(g)
        g.div_(WORLD)
    engine.before_optimizer_step(1, lambda: torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP))
    rank_r = optimizer.param_groups[0]["rank"]

    def bases(gs):
        return [top_basis(g, rank_r, projection_side(g.shape)) for g in gs]

    installed = [optimizer.state[p]["basis"].clone() for p in optimizer.lowrank_params()]
    return {"installed": installed, "clipped": bases(clipped), "raw": bases(raw)}


def worker(rank: int, tmp: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{tmp}/init", rank=rank, world_size=WORLD)
    try:
        out = {"methods": {m: run_method(m, rank) for m in METHODS}, "sgd": sgd_runs(rank),
               "resume": {m: resume_runs(m, rank, tmp) for m in ("lordo", "local_adam", "lordo_orth_dion")},
               "first_basis": first_basis(rank), "averaging": {m: k_step_and_local_averaging(m, rank) for m in ("diloco", "muloco")},
               "lordo_orth_dion_sync": lordo_orth_dion_sync(rank)}
        torch.save(out, os.path.join(tmp, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    tmp = str(tmp_path_factory.mktemp("gloo"))
    mp.spawn(worker, args=(tmp,), nprocs=WORLD, join=True)
    return [torch.load(os.path.join(tmp, f"rank{r}.pt"), weights_only=False) for r in range(WORLD)]


def test_sgd_pseudo_gradient_averaging_with_k1_equals_ddp(ranks):
    for r in ranks:
        sgd = r["sgd"]
        moved = max((a - s).abs().max().item() for a, s in zip(sgd["ddp"], sgd["start"]))
        assert moved > 1e-3
        for a, b in zip(sgd["ddp"], sgd["average"]):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


@pytest.mark.parametrize("method", sorted(METHODS))
def test_after_every_sync_all_ranks_hold_identical_weights_and_bases(ranks, method):
    first, second = (r["methods"][method] for r in ranks)
    assert len(first["synced"]) >= 3
    for t, state in first["synced"].items():
        other = second["synced"][t]
        assert all(torch.equal(a, b) for a, b in zip(state["weights"], other["weights"])), f"weights, step {t}"
        bases_equal = [torch.equal(a, b) for a, b in zip(state["bases"], other["bases"])]
        if method in SHARED_BASES:
            assert bases_equal and all(bases_equal), f"bases, step {t}"
        elif method in OWN_BASES:
            assert bases_equal and not any(bases_equal)
        if method == "lordo_orth_dion":
            for q in state["bases"]:
                torch.testing.assert_close(q.T @ q, torch.eye(q.shape[1]), rtol=0, atol=1e-5)
    for t, weights in first["between"].items():  # between syncs the workers really differ
        assert not all(torch.equal(a, b) for a, b in zip(weights, second["between"][t]))


@pytest.mark.parametrize("method", sorted(METHODS))
def test_measured_bytes_equal_the_analytic_formula(ranks, method):
    for r in ranks:
        run = r["methods"][method]
        assert run["bytes"][0] == setup_bytes(run["shapes"], WORLD)
        for t in range(1, STEPS + 1):
            expected = analytic_bytes_at(analytic_options(method), run["shapes"], WORLD, t)
            assert run["bytes"].get(t, {}) == expected, f"step {t}"
        assert any(run["bytes"].get(t) for t in range(1, STEPS + 1))


def test_subspace_stagnates_without_the_full_rank_term_and_moves_with_it(ranks):
    """omega = 1 (and no weight decay): every local update lies in range(Q), so Delta does, and the top-r basis of
    Delta is range(Q) again; with omega < 1 the full-rank term makes Delta full-rank and Q moves."""
    for r in ranks:
        stagnant = r["methods"]["lordo_global_noqh"]["angles"]
        moving = r["methods"]["lordo"]["angles"]
        assert len(stagnant) == len(moving) == STEPS // K
        assert max(stagnant.values()) < 1e-2, stagnant
        assert min(moving.values()) > 0.1, moving


@pytest.mark.parametrize("method", ["lordo", "local_adam", "lordo_orth_dion"])
def test_resume_at_a_sync_point_reproduces_the_uninterrupted_losses(ranks, method):
    for r in ranks:
        uninterrupted, resumed = r["resume"][method]
        assert len(resumed) == len(uninterrupted) > K
        torch.testing.assert_close(torch.tensor(resumed), torch.tensor(uninterrupted), rtol=0, atol=1e-6)


def test_first_basis_comes_from_the_clipped_gradient(ranks):
    """D1: Q of step 1 is the top-r basis of the mean of the clipped local gradients the optimizer then uses."""
    for r in ranks:
        basis = r["first_basis"]
        to_clipped = max(principal_angles(a, b).max().item() for a, b in zip(basis["installed"], basis["clipped"]))
        to_raw = max(principal_angles(a, b).max().item() for a, b in zip(basis["installed"], basis["raw"]))
        assert to_clipped < 1e-2 and to_clipped < 0.1 * to_raw, (to_clipped, to_raw)  # fp32 rounding vs clipping


def test_probe_cosine_is_one_for_plain_sgd_and_stays_off_the_method_ledger(ranks):
    """SGD without momentum, weight decay or clipping: Delta = -lr sum_t mean_m G_m,t exactly, so cos(Delta, -S) = 1
    on every rank; the probe all-reduces every step's gradient on its own ledger."""
    for r in ranks:
        sgd = r["sgd"]
        cosines = {t: c for t, c in sgd["probe_cosines"].items() if c is not None}
        assert sorted(cosines) == [5, 10]
        assert all(c == pytest.approx(1.0, abs=1e-6) for c in cosines.values()), cosines
        ledgers = sgd["probe_ledgers"]
        gradient_bytes = 2 * (WORLD - 1) / WORLD * 4 * ledgers["numel"]
        assert ledgers["probe"] == {t: {"probe": gradient_bytes} for t in range(1, 11)}
        assert set(ledgers["method"]) == {0, 5, 10}
        assert all(set(kinds) == {"pseudo_gradient"} for t, kinds in ledgers["method"].items() if t)
    assert ranks[0]["sgd"]["probe_cosines"] == ranks[1]["sgd"]["probe_cosines"]


@pytest.mark.parametrize("method", ["diloco", "muloco"])
def test_k_step_with_outer_lr_1_and_no_momentum_is_local_steps_plus_parameter_averaging(ranks, method):
    for r in ranks:
        assert sorted(r["averaging"][method]) == [K, 2 * K]
        for t, (synced, reference) in r["averaging"][method].items():
            assert all(torch.equal(a, b) for a, b in zip(synced, reference)), f"step {t}"


def test_lordo_orth_dion_sync_averages_buffers_and_installs_the_top_right_singular_vectors_of_delta(ranks):
    """After the sync every rank holds the mean buffer M (carried unchanged across the change of basis) and the same Q:
    orthonormal, spanning the top-r right singular subspace of the averaged Delta in the tall orientation (it captures
    the sum of the r largest squared singular values, float64 SVD)."""
    first, second = (r["lordo_orth_dion_sync"] for r in ranks)
    for i, q in enumerate(first["after"]["Q"]):
        assert torch.equal(q, second["after"]["Q"][i])
        assert torch.equal(first["after"]["momentum"][i], second["after"]["momentum"][i])
        mean_buffer = (first["before"]["momentum"][i] + second["before"]["momentum"][i]) / 2
        torch.testing.assert_close(first["after"]["momentum"][i], mean_buffer, rtol=0, atol=1e-7)
        anchor = first["before"]["anchor"][i]
        assert torch.equal(anchor, second["before"]["anchor"][i])
        delta = ((first["before"]["weights"][i] - anchor) + (second["before"]["weights"][i] - anchor)).double() / 2
        torch.testing.assert_close(first["after"]["weights"][i].double(), anchor.double() + delta, rtol=0, atol=1e-6)
        tall = delta if delta.shape[0] >= delta.shape[1] else delta.T
        rank = q.shape[1]
        torch.testing.assert_close(q.T @ q, torch.eye(rank), rtol=0, atol=1e-5)
        top = torch.linalg.svdvals(tall)[:rank].square().sum()
        captured = (tall @ q.double()).square().sum()
        assert captured == pytest.approx(top.item(), rel=1e-4), i
