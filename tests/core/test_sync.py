"""Sync engines on one process: options and optimizer checks, the outer step against torch's SGD, moment averaging
periods, every method without a process group, and the byte pattern each method sends."""

from __future__ import annotations

import math
from collections import defaultdict

import pytest
import torch
from support import METHODS, RANK, K, analytic_options, build, train_step

from lowcomm.config import load_config
from lowcomm.cost.bytes import analytic_bytes_at
from lowcomm.cost.shapes import param_shapes
from lowcomm.distributed.comm import Communicator
from lowcomm.distributed.options import SYNC_KINDS, sync_options
from lowcomm.distributed.sync import (
    MomentAverage,
    PseudoGradientSync,
    build_sync_engine,
)
from lowcomm.model import Transformer, model_config
from lowcomm.optim.protocols import CarriesBasis, CountsStateBytes, ReportsSpectralStats, SynchronizesItself
from lowcomm.paths import EXPERIMENTS


def payload_by_step(comm: Communicator) -> dict[int, dict[str, float]]:
    totals: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for r in comm.records:
        totals[r.step][r.kind] += r.payload
    return {s: dict(k) for s, k in totals.items()}


# ------------------------------------------------------------------------------------------------ options

@pytest.mark.parametrize("cfg, match", [
    ({"name": "lordo", "sync_every": 0}, r"sync\.sync_every=0 .*integer >= 1"),
    ({"name": "lordo", "sync_every": 2.5}, r"sync\.sync_every=2\.5"),
    ({"name": "lordo_fast"}, r"sync\.name='lordo_fast' is not a sync kind: choose one of"),
    ({"name": "ddp", "sync_evry": 4}, r"unknown key\(s\) sync\.sync_evry .*valid keys"),
    ({"name": "diloco", "outer": "adam"}, r"sync\.outer='adam' is unknown"),
    ({"name": "local_adam", "state_sync_u": -1}, r"sync\.state_sync_u=-1"),
    ({"name": "lowrank_ddp", "lowrank_gradient": "sketched"}, r"sync\.lowrank_gradient='sketched'"),
    ({"name": "diloco", "outer_momentum": 1.0}, r"sync\.outer_momentum=1\.0"),
    ({"name": "orth_dion_local", "state_sync_m": -1}, r"sync\.state_sync_m=-1 .*K_M"),
    ({"name": "diloco", "probe_cosine": "yes"}, r"sync\.probe_cosine='yes' is invalid"),
])
def test_bad_sync_config_fails_naming_the_key(cfg, match):
    with pytest.raises(ValueError, match=match):
        sync_options(cfg)


def test_method_defaults():
    assert sync_options({"name": "local_adam", "sync_every": 8}).state_sync_u == 8
    diloco = sync_options({"name": "diloco"})
    assert (diloco.outer, diloco.state_sync_u, diloco.state_sync_v) == ("nesterov", 0, 0)
    lordo = sync_options({"name": "lordo", "sync_every": 16})
    assert (lordo.outer, lordo.state_sync_u, lordo.state_sync_v, lordo.state_sync_scope) == (
        "average", 16, 16, "lowrank")
    assert sync_options({"name": "lordo_local"}).state_sync_u == 0
    for name in ("orth_dion_local", "lordo_orth_dion"):
        local = sync_options({"name": name, "sync_every": 8})
        assert (local.outer, local.state_sync_m, local.state_sync_u, local.state_sync_v) == ("average", 8, 0, 0)
    assert sync_options({"name": "diloco", "sync_every": 8}).state_sync_m == 0
    assert {cfg["name"] for cfg, _ in METHODS.values()} == set(SYNC_KINDS)


def test_options_say_which_keys_their_sync_kind_acts_on():
    diloco, averaged, ddp = (sync_options(cfg) for cfg in ({"name": "diloco"}, {"name": "local_adam"}, {"name": "ddp"}))
    assert diloco.uses("outer_lr") and diloco.uses("outer_momentum") and diloco.uses("sync_every")
    assert not averaged.uses("outer_lr") and averaged.uses("sync_every")
    assert not ddp.uses("outer_momentum") and not ddp.uses("sync_every") and ddp.uses("compress")


@pytest.mark.parametrize("method, sync, optim, match", [
    ("lordo", {}, {"name": "adamw"}, r"needs a low-rank optimizer"),
    ("lordo", {}, {"basis": "local"}, r"needs the low-rank groups' basis='external'"),
    ("lordo_global_noqh", {}, {"omega": 0.7}, r"without the full-rank term: set optim\.omega=1"),
    ("lowrank_ddp", {}, {"omega": 0.7}, r"projected gradients .* set optim\.omega=1"),
    ("lordo_local", {}, {"refresh_every": 1}, r"D10.*refresh_every"),
    ("local_adam", {}, {"name": "lordo_local_step", "rank": RANK}, r"basis='external' get Q only from"),
    ("ddp", {}, {"name": "dion"}, r"synchronizes its own gradients: use sync\.name='optimizer_sync'"),
    ("optimizer_sync", {}, {"name": "adamw"}, r"needs an optimizer that synchronizes itself"),
    ("local_adam", {"state_sync_scope": "lowrank"}, {}, r"state_sync_scope='lowrank' averages low-rank moments"),
    ("lordo_local", {"state_sync_u": K}, {}, r"each worker's own basis .* set sync\.state_sync_u=0"),
    ("local_adam", {}, {"name": "galore", "rank": RANK}, r"each worker's own basis"),
    ("orth_dion_local", {}, {"name": "adamw"}, r"runs the Dion family locally .* set optim\.name='orth_dion'"),
    ("lordo_orth_dion", {}, {"name": "dion"}, r"needs fixed-rank Orth-Dion: set optim\.name='orth_dion'"),
    ("lordo_orth_dion", {}, {"name": "ada_orth_dion"}, r"needs fixed-rank Orth-Dion"),
    ("diloco", {"state_sync_m": K}, {}, r"sync\.state_sync_m=4 averages Dion's buffers M, but AdamW has none"),
    ("orth_dion_local", {"state_sync_scope": "lowrank"}, {}, r"state_sync_scope='lowrank' averages low-rank"),
])
def test_optimizer_that_does_not_fit_the_method_fails_before_training(method, sync, optim, match):
    with pytest.raises(ValueError, match=match):
        build(method, Communicator(), sync=sync, optim=optim)


def test_rank_larger_than_a_matrix_fails_before_training():
    with pytest.raises(ValueError, match=r"rank=65 is invalid .* between 1 and min\(p, q\) = 64"):
        build("lordo", Communicator(), optim={"rank": 65})


# ------------------------------------------------------------------------------------------------ parts

def test_nesterov_outer_step_matches_torch_sgd_on_minus_delta():
    """W = W_anchor + lr (Delta - mu b), b = mu b - Delta is SGD(nesterov) on the outer gradient -Delta."""
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(5, 3))
    sync = PseudoGradientSync([("w", w)], Communicator(), "nesterov", lr=0.7, momentum=0.9)
    reference = w.detach().clone().requires_grad_(True)
    outer = torch.optim.SGD([reference], lr=0.7, momentum=0.9, nesterov=True)
    for _ in range(3):
        local = torch.randn(5, 3) * 0.1
        with torch.no_grad():
            w.add_(local)
        (delta,) = sync()
        torch.testing.assert_close(delta, local)
        reference.grad = -local
        outer.step()
        torch.testing.assert_close(w.detach(), reference.detach(), rtol=0, atol=1e-6)
        torch.testing.assert_close(sync.anchor[0], w.detach(), rtol=0, atol=0)


def test_average_outer_step_is_anchor_plus_delta():
    w = torch.nn.Parameter(torch.zeros(4))
    sync = PseudoGradientSync([("w", w)], Communicator(), "average", lr=0.7, momentum=0.9)
    with torch.no_grad():
        w.add_(1.5)
    sync()
    assert torch.equal(w.detach(), torch.full((4,), 1.5)) and torch.equal(sync.anchor[0], w.detach())
    assert sync.momentum == []


def test_moment_average_periods():
    comm = Communicator()
    p = torch.nn.Parameter(torch.zeros(3))
    opt = torch.optim.Adam([p])
    p.grad = torch.ones(3)
    opt.step()
    average = MomentAverage(opt, [p], comm, every_u=2, every_v=3)
    for step in range(1, 7):
        comm.step = step
        average(step)
    steps = defaultdict(list)
    for r in comm.records:
        steps[r.step].append(r.payload)
    assert dict(steps) == {2: [12], 3: [12], 4: [12], 6: [12, 12]}


def test_state_dict_holds_tensors_and_restores_anchor_and_momentum():
    model, optimizer, engine = build("diloco", Communicator())
    engine.setup()
    for t in range(1, K + 1):
        train_step(model, optimizer, engine, t, 0)
    sd = engine.state_dict()
    leaves = [sd["step"]] + list(sd["anchor"].values()) + list(sd["outer_momentum"].values())
    assert all(torch.is_tensor(x) for x in leaves) and int(sd["step"]) == K
    assert any(b.abs().sum() > 0 for b in sd["outer_momentum"].values())
    _, _, fresh = build("diloco", Communicator(), seed=1)
    fresh.load_state_dict(sd)
    assert fresh.step == K
    for a, b in zip(fresh.pseudo.anchor, engine.pseudo.anchor):
        assert torch.equal(a, b)
    for a, b in zip(fresh.pseudo.momentum, engine.pseudo.momentum):
        assert torch.equal(a, b)
    _, _, local = build("local_adam", Communicator())
    with pytest.raises(ValueError, match="no matching 'anchor'"):
        local.load_state_dict({"step": torch.tensor(0)})


def test_steps_count_from_one():
    model, optimizer, engine = build("ddp", Communicator())
    engine.setup()
    with pytest.raises(ValueError, match="steps count from 1"):
        engine.before_optimizer_step(0)


def test_optimizers_declare_what_the_engine_may_ask_of_them():
    """The engine asks only through the typed protocols: a basis carrier names its basis key and parameters, a
    self-synchronizing optimizer takes a Communicator; AdamW has none of these capabilities."""
    comm = Communicator()
    lowrank, dion, adamw = (build(m, comm)[1] for m in ("lordo", "optimizer_sync", "ddp"))
    assert isinstance(lowrank, CarriesBasis) and lowrank.basis_key == "basis"
    assert [id(p) for p in lowrank.basis_params()] == [id(p) for p in lowrank.lowrank_params()]
    assert isinstance(dion, CarriesBasis) and dion.basis_key == "Q" and isinstance(dion, SynchronizesItself)
    assert isinstance(dion, ReportsSpectralStats) and isinstance(lowrank, CountsStateBytes)
    assert not isinstance(lowrank, SynchronizesItself)
    assert not any(isinstance(adamw, p) for p in (CarriesBasis, SynchronizesItself, CountsStateBytes))


def test_local_dion_methods_run_dion_without_its_communicator():
    for method in ("orth_dion_local", "lordo_orth_dion"):
        comm = Communicator()
        model, optimizer, _ = build("optimizer_sync", comm)
        assert optimizer.communicator is comm
        build_sync_engine(sync_options(METHODS[method][0]), model, optimizer, comm)
        assert optimizer.communicator is None and not optimizer.distributed


def test_optimizer_sync_only_hands_over_the_communicator():
    comm = Communicator()
    model, optimizer, engine = build("optimizer_sync", comm)
    assert optimizer.communicator is comm
    engine.setup()
    for t in range(1, 4):
        train_step(model, optimizer, engine, t, 0)
    assert {r.kind for r in comm.records} == {"parameters"}
    assert all(engine.is_sync_step(t) for t in range(1, 4))


# ------------------------------------------------------------------------------------------------ one worker

@pytest.mark.parametrize("method", sorted(METHODS))
def test_one_worker_runs_every_method_without_a_process_group(method):
    """M = 1: no process group; every collective is recorded with zero bytes on the wire, and the payloads have the
    analytic pattern (at M = 2 the ring factor 2(M-1)/M is 1, so the analytic wire bytes of M = 2 are the payloads)."""
    comm = Communicator()
    assert not comm.distributed and comm.world_size == 1
    model, optimizer, engine = build(method, comm)
    start = [p.detach().clone() for p in model.parameters()]
    engine.setup()
    steps = 2 * K + 1
    losses = [train_step(model, optimizer, engine, t, 0) for t in range(1, steps + 1)]
    assert all(math.isfinite(x) for x in losses)
    assert any(not torch.equal(a, p) for a, p in zip(start, model.parameters()))
    assert all(v == 0 for v in comm.wire_bytes_by_kind().values())
    metrics = engine.metrics()
    assert all(isinstance(v, float) for v in metrics.values())
    assert metrics["comm/step_bytes"] == 0.0
    if method == "optimizer_sync":  # Dion sends nothing on one worker
        return
    lowrank = optimizer.lowrank_params() if hasattr(optimizer, "lowrank_params") else None
    shapes = param_shapes(model, lowrank)
    payloads = payload_by_step(comm)
    assert payloads.get(0) == {"parameters": 4 * sum(p.numel() for p in model.parameters())}
    for t in range(1, steps + 1):
        assert payloads.get(t, {}) == analytic_bytes_at(analytic_options(method), shapes, 2, t), f"step {t}"


def test_metrics_report_state_memory_update_rms_and_subspace_movement():
    model, optimizer, engine = build("lordo", Communicator())
    engine.setup()
    assert "subspace/max_angle" not in engine.metrics()
    for t in range(1, 2 * K + 1):
        train_step(model, optimizer, engine, t, 0)
        assert engine.basis_changed(t) == (t % K == 0)  # at every sync; step 1 (D1) has no earlier basis
    m = engine.metrics()
    state = optimizer.state_bytes()
    assert m["memory/moments_bytes"] == state["moments"] > 0
    assert m["memory/anchor_bytes"] == sum(p.numel() * 4 for p in model.parameters())
    assert m["update_rms/full"] > 0 and m["update_rms/low"] > 0
    assert 0 < m["subspace/mean_angle"] <= m["subspace/max_angle"] <= math.pi / 2 + 1e-6
    per_matrix = {k.removeprefix("subspace/angle/"): v for k, v in m.items() if k.startswith("subspace/angle/")}
    assert sorted(per_matrix) == sorted(n for n, _ in model.hidden_matrices())
    assert max(per_matrix.values()) == m["subspace/max_angle"]
    assert m["comm/pseudo_gradient_bytes"] == 0.0  # one worker: nothing on the wire
    adamw_model, adamw, adamw_engine = build("local_adam", Communicator())
    adamw_engine.setup()
    train_step(adamw_model, adamw, adamw_engine, 1, 0)
    moments = 2 * sum(p.numel() * 4 for p in adamw_model.parameters())
    assert adamw_engine.metrics()["memory/adamw_moments_bytes"] == moments


def test_stagnating_preset_and_the_stagnation_tests_agree_on_weight_decay():
    """The shipped lordo_global_noqh is the exact stagnating variant (omega = 1, weight decay 0) that the
    stagnation tests use, also when loaded through the training config."""
    cfg = load_config(str(EXPERIMENTS / "train" / "config.yaml"), ["method=lordo_global_noqh"])
    _, optim_cfg = METHODS["lordo_global_noqh"]
    assert cfg.optim.weight_decay == optim_cfg["weight_decay"] == 0.0
    assert cfg.optim.omega == optim_cfg["omega"] == 1.0


def test_orth_dion_local_with_one_worker_and_k1_takes_the_steps_of_orth_dion():
    """M = 1, K = 1: the pseudo-gradient sync only rewrites W as W_anchor + (W - W_anchor), so every step is Orth-Dion's
    (to fp32 rounding), with the same buffer M and right factor Q."""
    runs = {}
    for method, sync in (("optimizer_sync", {}), ("orth_dion_local", {"sync_every": 1})):
        model, optimizer, engine = build(method, Communicator(), sync=sync)
        engine.setup()
        start = [p.detach().clone() for p in model.parameters()]
        for t in range(1, 7):
            train_step(model, optimizer, engine, t, 0)
        state = [optimizer.state[p][key] for p in optimizer.matrix_params() for key in ("momentum", "Q")]
        runs[method] = [p.detach().clone() for p in model.parameters()] + state
    assert max((a - b).abs().max().item() for a, b in zip(start, runs["optimizer_sync"])) > 1e-2
    for local, reference in zip(runs["orth_dion_local"], runs["optimizer_sync"]):
        torch.testing.assert_close(local, reference, rtol=0, atol=1e-5)


def probe_run(method: str, probe: bool, optim: dict | None = None, clip: float | None = 1.0, steps: int = 2 * K):
    """Weights, the method's ledger, and the metrics of every step of a one-worker run with or without the probe."""
    comm = Communicator()
    model, optimizer, engine = build(method, comm, sync={"probe_cosine": probe}, optim=optim)
    engine.setup()
    metrics = []
    for t in range(1, steps + 1):
        train_step(model, optimizer, engine, t, 0, clip=clip)
        metrics.append(engine.metrics())
    return [p.detach().clone() for p in model.parameters()], comm.records, metrics


def test_probe_leaves_training_and_the_method_ledger_unchanged():
    weights, records, metrics = probe_run("diloco", probe=False)
    probed_weights, probed_records, probed_metrics = probe_run("diloco", probe=True)
    assert all(torch.equal(a, b) for a, b in zip(weights, probed_weights))
    assert probed_records == records
    assert all("probe/pseudo_gradient_cosine" not in m for m in metrics)
    measured = {t: m["probe/pseudo_gradient_cosine"] for t, m in enumerate(probed_metrics, 1)
                if "probe/pseudo_gradient_cosine" in m}
    assert sorted(measured) == [K, 2 * K]
    assert all(0 < c < 0.999 for c in measured.values()), measured  # AdamW's direction is not the gradient's
    assert all(m["comm/probe_bytes"] == 0.0 for m in probed_metrics)  # one worker: recorded, nothing on the wire


def test_probe_cosine_is_one_for_plain_sgd():
    """SGD without momentum, weight decay or clipping: Delta = -lr sum_t G_t exactly, so cos(Delta, -S) = 1."""
    model = Transformer(model_config("smoke"))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    engine = build_sync_engine(sync_options({"name": "diloco", "sync_every": K, "outer": "average",
                                             "probe_cosine": True}), model, optimizer, Communicator())
    engine.setup()
    for t in range(1, 2 * K + 1):
        train_step(model, optimizer, engine, t, 0, clip=None)
        if t % K == 0:
            assert engine.metrics()["probe/pseudo_gradient_cosine"] == pytest.approx(1.0, abs=1e-6)
    probe_payloads = {r.step: r.payload for r in engine.probe.comm.records}
    assert probe_payloads == {t: 4 * sum(p.numel() for p in model.parameters()) for t in range(1, 2 * K + 1)}
