"""The analytic communication and memory model (lowcomm.cost) against closed forms written out by hand, the
optimizers' real state, and the paper-settings table (lowcomm.repro.accounting). (Measured bytes are checked against
it in test_sync.py and test_sync_distributed.py, measured collectives and state in test_experiments_smoke.py.)"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from lowcomm.config import ConfigError
from lowcomm.cost.bytes import analytic_bytes_at, analytic_bytes_per_step, analytic_collectives_per_step, setup_bytes
from lowcomm.cost.method import AccountedMethod, accounted_method, matrix_rank
from lowcomm.cost.shapes import ParamShapes, model_shapes, param_shapes
from lowcomm.cost.state import STATE_KINDS, analytic_optimizer_state, analytic_sync_state, state_summary
from lowcomm.cost.wallclock import LATENCY_S, step_time
from lowcomm.distributed.options import sync_options
from lowcomm.distributed.sync import optimizer_state_bytes
from lowcomm.model import Transformer, model_config
from lowcomm.optim import build_optimizer
from lowcomm.optim.lowrank_adam import LowRankAdam
from lowcomm.repro.accounting import load_settings, main, paper_crossover, paper_table, state_rows

ROOT = Path(__file__).resolve().parents[2]
SETTINGS = ROOT / "experiments" / "communication" / "paper_settings.yaml"
PAPER = load_settings(SETTINGS)

M = 4
RING = 2 * (M - 1) / M * 4  # bytes per worker per fp32 number of an all-reduce
R = 4
# Smoke-like shapes: wide and tall matrices (left and right projections) and the non-matrix parameters.
SHAPES = ParamShapes(lowrank=((192, 64), (64, 64), (256, 64), (64, 256)), other=((512, 64), (64,), (64,)))
P = sum(a * b for a, b in SHAPES.lowrank) + 512 * 64 + 2 * 64  # all numbers
L = sum(a * b for a, b in SHAPES.lowrank)  # the matrices
O = P - L  # the rest
S = sum(R * max(a, b) for a, b in SHAPES.lowrank)  # one rank-r projection (or moment) of every matrix


def steady(options: dict) -> dict:
    return analytic_bytes_per_step(options, SHAPES, M)


def approx(d: dict) -> dict:
    return {k: pytest.approx(v, rel=1e-12) for k, v in d.items()}


@pytest.mark.parametrize("options, expected", [
    ({"name": "ddp"}, {"gradient": RING * P}),
    ({"name": "lowrank_ddp", "rank": R, "basis_refresh_every": 10},
     {"projected_gradient": RING * S, "gradient": RING * (O + L / 10)}),
    ({"name": "lowrank_ddp", "rank": R, "lowrank_gradient": "full"}, {"gradient": RING * P}),
    ({"name": "local_adam", "sync_every": 8, "state_sync_u": 4, "state_sync_v": 16},
     {"pseudo_gradient": RING * P / 8, "optimizer_state": RING * (P / 4 + P / 16)}),
    ({"name": "diloco", "sync_every": 8}, {"pseudo_gradient": RING * P / 8}),
    ({"name": "lordo_local", "sync_every": 8, "rank": R}, {"pseudo_gradient": RING * P / 8}),
    ({"name": "lordo", "sync_every": 8, "rank": R},
     {"pseudo_gradient": RING * P / 8, "optimizer_state": RING * 2 * S / 8}),
    ({"name": "lordo_global_noqh", "sync_every": 8, "rank": R, "state_sync_v": 0},
     {"pseudo_gradient": RING * P / 8, "optimizer_state": RING * S / 8}),
    ({"name": "lordo", "sync_every": 8, "rank": R, "state_sync_scope": "all"},
     {"pseudo_gradient": RING * P / 8, "optimizer_state": RING * 2 * (S + O) / 8}),
    ({"name": "optimizer_sync", "rank": R},
     {"factor": RING * sum((a + b) * R for a, b in SHAPES.lowrank), "gradient": RING * O}),
    ({"name": "optimizer_sync", "rank_fraction": 0.25},
     {"factor": RING * sum((a + b) * 16 for a, b in SHAPES.lowrank), "gradient": RING * O}),
    ({"name": "orth_dion_local", "sync_every": 8}, {"pseudo_gradient": RING * P / 8, "optimizer_state": RING * L / 8}),
    ({"name": "orth_dion_local", "sync_every": 8, "state_sync_m": 4, "state_sync_u": 16},
     {"pseudo_gradient": RING * P / 8, "optimizer_state": RING * (L / 4 + O / 16)}),
    ({"name": "lordo_orth_dion", "sync_every": 8}, {"pseudo_gradient": RING * P / 8, "optimizer_state": RING * L / 8}),
    ({"name": "lordo_orth_dion", "sync_every": 8, "state_sync_m": 0}, {"pseudo_gradient": RING * P / 8}),
])
def test_steady_state_bytes_match_the_closed_forms(options, expected):
    assert steady(options) == approx(expected)


def test_dion_sends_the_full_gradient_where_factors_are_not_smaller():
    """(m + n) r >= mn: 8 x 8 at r = 4 sends 64 numbers either way, so the gradient goes instead."""
    shapes = ParamShapes(lowrank=((8, 8), (64, 8)), other=())
    assert analytic_bytes_per_step({"name": "optimizer_sync", "rank": 4}, shapes, M) == approx(
        {"factor": RING * (64 + 8) * 4, "gradient": RING * 64})


@pytest.mark.parametrize("options", [
    {"name": "lordo", "sync_every": 4, "rank": R},
    {"name": "lowrank_ddp", "rank": R, "basis_refresh_every": 3},
    {"name": "local_adam", "sync_every": 4, "state_sync_u": 6, "state_sync_v": 0},
    {"name": "optimizer_sync", "rank": R},
])
@pytest.mark.parametrize("steps", [1, 7, 12, 13])
def test_amortized_bytes_are_the_mean_of_the_per_step_bytes(options, steps):
    total: dict[str, float] = {}
    for t in range(1, steps + 1):
        for kind, b in analytic_bytes_at(options, SHAPES, M, t).items():
            total[kind] = total.get(kind, 0.0) + b
    expected = {k: v / steps for k, v in total.items() if v}
    assert analytic_bytes_per_step(options, SHAPES, M, steps=steps) == approx(expected)


def test_lordo_first_step_gradient_is_a_one_off():
    """D1: the first step all-reduces the matrices' gradient once; steady state leaves it out, N steps amortize it."""
    options = {"name": "lordo", "sync_every": 8, "rank": R}
    assert analytic_bytes_at(options, SHAPES, M, 1) == approx({"gradient": RING * L})
    assert analytic_bytes_at(options, SHAPES, M, 2) == {}
    assert analytic_bytes_at(options, SHAPES, M, 8) == approx(
        {"pseudo_gradient": RING * P, "optimizer_state": RING * 2 * S})
    amortized = analytic_bytes_per_step(options, SHAPES, M, steps=80)
    assert amortized == approx({**steady(options), "gradient": RING * L / 80})


def test_lordo_orth_dion_sends_no_first_step_gradient():
    """Dion's right factors start identical on every rank (seeded), so unlike LoRDO (D1) nothing goes out at step 1."""
    options = {"name": "lordo_orth_dion", "sync_every": 8}
    assert analytic_bytes_at(options, SHAPES, M, 1) == {}
    assert analytic_bytes_per_step(options, SHAPES, M, steps=80) == approx(steady(options))


def test_one_worker_sends_nothing_and_setup_broadcasts_the_parameters():
    assert analytic_bytes_per_step({"name": "ddp"}, SHAPES, 1) == {}
    assert setup_bytes(SHAPES, M) == approx({"parameters": (M - 1) / M * 4 * P})
    assert analytic_bytes_per_step({"name": "ddp"}, SHAPES, M, bytes_per_element=2) == approx(
        {"gradient": RING / 2 * P})


@pytest.mark.parametrize("options, match", [
    ({"name": "lordo"}, r"need 'rank'"),
    ({"name": "lowrank_ddp", "rank": 65}, r"rank=65 is invalid"),
    ({"name": "optimizer_sync"}, r"need 'rank'"),
    ({"name": "lordo_local", "rank_fraction": 0.25}, r"need 'rank'"),
    ({"name": "ring_ddp"}, r"sync\.name='ring_ddp' is not a sync kind"),
])
def test_bad_method_options_fail(options, match):
    with pytest.raises(ValueError, match=match):
        analytic_bytes_per_step(options, SHAPES, M)


@pytest.mark.parametrize("size, rank", [("lordo-125m", 96), ("lordo-720m", 256)])
def test_paper_table_ratios_equal_the_closed_forms(size, rank):
    """ddp / lordo = K P / (P + 2 S) and lowrank_ddp / lordo = K (S + O + L / T) / (P + 2 S), with P all numbers, L
    the matrices', O the rest, S = sum r max(a, b) one rank-r projection of every matrix, K = 32, T = 200."""
    rows = {(r["size"], r["method"]): r for r in paper_table(PAPER, steps=10_000)}
    ddp, lowrank_ddp, lordo = (rows[size, m]["steady_mb"] for m in ("ddp", "lowrank_ddp", "lordo"))
    shapes = model_shapes(size)
    matrices = sum(a * b for a, b in shapes.lowrank)
    rest = sum(math.prod(s) for s in shapes.other)
    projection = sum(rank * max(a, b) for a, b in shapes.lowrank)
    k, t = 32, 200
    assert ddp / lordo == pytest.approx(k * (matrices + rest) / (matrices + rest + 2 * projection), rel=1e-12)
    assert lowrank_ddp / lordo == pytest.approx(
        k * (projection + rest + matrices / t) / (matrices + rest + 2 * projection), rel=1e-12)
    assert rows[size, "lordo"]["amortized_mb"] > rows[size, "lordo"]["steady_mb"]  # D1 amortized in


def test_paper_model_shapes_have_separate_attention_projections():
    shapes = model_shapes("lordo-125m")
    assert sorted(shapes.lowrank) == sorted([(768, 768)] * 48 + [(3072, 768)] * 12 + [(768, 3072)] * 12)
    assert sum(math.prod(s) for s in shapes.other) == 50_368 * 768 + 25 * 768
    rows = {(r["size"], r["method"]): r for r in paper_table(PAPER, steps=10_000)}
    assert rows["lordo-125m", "ddp"]["steady_mb"] == pytest.approx(
        1.5 * 4 * (sum(a * b for a, b in shapes.lowrank) + 50_368 * 768 + 25 * 768) / 1e6)


def test_entry_point_prints_the_table(capsys):
    main(["--settings", str(SETTINGS), "--steps", "1000"])
    out = capsys.readouterr().out
    assert "amortized over 1000 steps" in out and "fp32" in out
    assert "lordo-720m: lowrank_ddp / lordo" in out and "paper: about 25x" in out
    assert "lordo-125m  lordo vs ddp" in out and "rho = a's steps to the target over b's" in out



def test_paper_crossover_is_where_the_modeled_times_to_the_target_meet():
    rows = paper_table(PAPER, steps=10_000)
    crossover = paper_crossover(PAPER, rows, flops_per_s=4e14, ratios=(1.0, 1.5))
    figures = {(r["size"], r["method"]): r for r in rows}
    for row in crossover:
        assert row["compute_s"] == pytest.approx(6 * row["params"] * 65_536 / 4e14)
        if row["steps_ratio"] == 1.0:  # as many steps and fewer bytes: first at every rate
            assert row["crossover_mbit"] == math.inf
            continue
        times = [steps * step_time(row["compute_s"], figures[row["size"], m]["steady_mb"] * 1e6,
                                   figures[row["size"], m]["collectives_per_step"], row["crossover_mbit"] / 1e3,
                                   LATENCY_S) for steps, m in ((1.5, row["a"]), (1.0, row["b"]))]
        assert times[0] == pytest.approx(times[1])
    assert {(r["a"], r["b"]) for r in crossover} == {("lordo", "ddp"), ("lordo", "lowrank_ddp")}

@pytest.mark.parametrize("options, steady", [
    ({"name": "ddp"}, 1),
    ({"name": "optimizer_sync", "rank": R}, 3),  # the other parameters' G, then P, then W
    ({"name": "lowrank_ddp", "rank": R, "basis_refresh_every": 10}, 2 + 1 / 10),  # Q^T G, the rest's G, refresh
    ({"name": "lordo", "sync_every": 8, "rank": R}, 3 / 8),  # Delta, u, v every K
    ({"name": "diloco", "sync_every": 8}, 1 / 8),
])
def test_collectives_per_step_match_the_closed_forms(options, steady):
    assert analytic_collectives_per_step(options, SHAPES) == pytest.approx(steady)


def test_lordo_first_step_collective_is_amortized():
    options = {"name": "lordo", "sync_every": 8, "rank": R}
    assert analytic_collectives_per_step(options, SHAPES, steps=16) == pytest.approx((1 + 2 * 3) / 16)


def smoke_optimizer_state(optim: dict) -> dict:
    """The optimizer's state bytes by kind after one real step on the smoke model (bases installed when external)."""
    torch.manual_seed(0)
    model = Transformer(model_config("smoke"))
    optimizer = build_optimizer(optim, model)
    if isinstance(optimizer, LowRankAdam) and optim.get("basis", "external") == "external":
        optimizer.set_bases_from([torch.randn_like(p) for p in optimizer.basis_params()])
    tokens = torch.randint(0, 512, (2, 16))
    model.loss(tokens, tokens).backward()
    optimizer.step()
    return {k: v for k, v in optimizer_state_bytes(optimizer).items() if k not in ("rank", "erank")}


@pytest.mark.parametrize("family, optim, options", [
    ("adamw", {"name": "adamw"}, {}),
    ("lowrank", {"name": "lordo_local_step", "rank": 8}, {"name": "lordo", "rank": 8}),
    ("lowrank", {"name": "lordo_local_step", "rank": 4, "error_feedback": False, "basis": "local"},
     {"name": "lordo_local", "rank": 4}),
    ("muon", {"name": "muon"}, {}),
    ("dion", {"name": "dion"}, {"name": "optimizer_sync", "rank_fraction": 0.25}),
    ("dion", {"name": "ada_orth_dion"}, {"name": "optimizer_sync", "rank_fraction": 0.25}),
])
def test_analytic_optimizer_state_matches_the_optimizers(family, optim, options):
    shapes = param_shapes(Transformer(model_config("smoke")))
    analytic = analytic_optimizer_state(family, shapes, options, error_feedback=optim.get("error_feedback", True))
    assert analytic == smoke_optimizer_state(optim)


def test_sync_state_and_its_summary():
    assert analytic_sync_state({"name": "ddp"}, SHAPES) == {}
    assert analytic_sync_state({"name": "diloco", "sync_every": 8}, SHAPES) == {"anchor": 4 * P,
                                                                                "outer_momentum": 4 * P}
    assert analytic_sync_state({"name": "lordo", "sync_every": 8, "rank": R}, SHAPES) == {"anchor": 4 * P,
                                                                                           "outer_momentum": 0}
    summary = state_summary({"moments": 1, "bases": 2, "adamw_moments": 4, "error_feedback": 8, "anchor": 16,
                             "outer_momentum": 32})
    assert summary == {"optimizer_state_bytes": 7, "error_feedback_bytes": 8, "anchor_bytes": 48}


def test_paper_table_state_ratios():
    rows = {(r["size"], r["method"]): r for r in paper_table(PAPER, steps=10_000)}
    for size, d in (("lordo-125m", 768), ("lordo-720m", 2048)):
        assert rows[size, "lordo"]["matrix_moments_ratio"] == pytest.approx(8)  # min(p, q) / r = d / (d / 8)
        assert rows[size, "ddp"]["adamw_state_over_method"] == 1
        assert rows[size, "lordo"]["anchor_mb"] == pytest.approx(rows[size, "ddp"]["optimizer_state_mb"] / 2)
    assert rows["lordo-125m", "dion"]["collectives_per_step"] == 3
    assert rows["lordo-125m", "ddp"]["comm_s_10gbps"] == pytest.approx(
        rows["lordo-125m", "ddp"]["steady_mb"] * 8e6 / 10e9 + 50e-6)


def test_the_state_table_at_the_cpu_size_equals_the_stored_runs_by_kind():
    """Each kind of state of the analytic cpu-size row (MB) equals what the stored table3_main runs measured (the state
    does not depend on the horizon)."""
    rows = {r["method"]: r for r in state_rows(PAPER, paper_table(PAPER, steps=1024, sizes={"cpu": PAPER.cpu_rank}))}
    for method in ("ddp", "local_adam", "lordo_local", "lordo", "lowrank_ddp"):
        record = json.loads((ROOT / "results" / "table3_main" / "cpu" / "runs" / f"{method}-s1" / "record.json")
                            .read_text())
        measured = {k[len("memory/"):-len("_bytes")]: v / 1e6 for k, v in record.items()
                    if k.startswith("memory/") and k.endswith("_bytes")}
        for kind in STATE_KINDS:
            assert rows[method].get(kind, 0.0) == pytest.approx(measured.get(kind, 0.0)), (method, kind)
        assert rows[method]["whole_state_mb"] == pytest.approx(sum(measured.values()))


def test_accounted_method_of_a_mapping_is_its_sync_options_and_rank():
    assert accounted_method({"name": "lordo", "sync_every": 8, "rank": R}) == AccountedMethod(
        sync_options({"name": "lordo", "sync_every": 8}), rank=R)
    method = AccountedMethod(sync_options({"name": "optimizer_sync"}), rank_fraction=0.25)
    assert accounted_method(method) is method
    with pytest.raises(ValueError, match=r"'lowrank_ddp' need 'rank'"):
        AccountedMethod(sync_options({"name": "lowrank_ddp"}))


def test_matrix_rank_is_the_rank_or_dions_capped_fraction():
    """r = ceil(rank_fraction min(p, q)), at most min(p, q), for the Dion family; the given rank otherwise."""
    dion = AccountedMethod(sync_options({"name": "optimizer_sync"}), rank_fraction=0.3)
    assert [matrix_rank(dion, s) for s in ((192, 64), (10, 7), (64, 256))] == [20, 3, 20]
    assert matrix_rank(AccountedMethod(sync_options({"name": "optimizer_sync"}), rank_fraction=2.0), (10, 7)) == 7
    assert matrix_rank(AccountedMethod(sync_options({"name": "lordo"}), rank=R), (192, 64)) == R


def test_a_settings_file_naming_a_method_it_lacks_is_refused(tmp_path):
    bad = tmp_path / "settings.yaml"
    bad.write_text(SETTINGS.read_text().replace("subject: lordo", "subject: lordo_x"))
    with pytest.raises(ConfigError, match=r"\['lordo_x'\] are not among its methods"):
        load_settings(bad)
    bad.write_text(SETTINGS.read_text().replace("cpu_rank:", "cpu_rnk:"))
    with pytest.raises(ConfigError, match=r"unknown key\(s\) \['cpu_rnk'\] or missing \['cpu_rank'\]"):
        load_settings(bad)
