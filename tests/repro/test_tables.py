"""Table builders on synthetic run records: columns against hand-computed values."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from omegaconf import OmegaConf

from lowcomm.config import ConfigError
from lowcomm.cost.bytes import analytic_bytes_per_step
from lowcomm.cost.method import AccountedMethod
from lowcomm.cost.shapes import model_shapes
from lowcomm.distributed.options import sync_options
from lowcomm.repro.spec import TableSpec, experiments
from lowcomm.repro.store import RunResult
from lowcomm.repro.tables import (
    accounted_run,
    analytic_bytes,
    build_tables,
    check_table,
    dion_rank,
    per_run_frame,
    run_model,
    summarize,
    table_of_rows,
)

CONFIG = {"data": {"batch_size": 4, "context": 10}, "train": {"devices": 2, "num_nodes": 1},
          "sync": {"name": "lordo", "sync_every": 4}, "optim": {"name": "lordo_local_step"}, "model": {"size": "smoke"}}


def run(label, seed, losses, method=None, sweep=None, angles=None, config=None, **record) -> RunResult:
    """A finished run: validation losses at steps 0, 4, 8, ...; 80 tokens per step at 800 tokens/s (0.1 s/step)."""
    steps = [4 * i for i in range(len(losses))]
    metrics = pd.DataFrame({"step": steps, "val_loss": losses, "tokens_per_s": [math.nan] + [800.0] * (len(steps) - 1)})
    if angles is not None:
        metrics["subspace/max_angle"] = [math.nan] + angles
    rec = {"final_val_loss": losses[-1], "final_val_ppl": math.exp(losses[-1]), "initial_val_loss": losses[0],
           "steps": steps[-1], "git_commit": "abc", "bytes_per_step/total": 1e6, "comm/training_collectives": 8.0,
           **record}
    return RunResult(label, method or label, sweep, seed, f"{label}-s{seed}", rec, config or CONFIG, metrics)


def test_summary_means_sample_stds_seeds_runs_and_commits():
    table = summarize(per_run_frame([run("a", 0, [8.0, 5.0]), run("a", 1, [8.0, 6.0]), run("b", 0, [8.0, 4.0])]))
    a = table.set_index("label").loc["a"]
    assert (a["final_val_loss"], a["final_val_loss_std"], a["seeds"]) == (5.5, pytest.approx(math.sqrt(0.5)), 2)
    assert a["runs"] == "a-s0 a-s1" and a["commits"] == "abc"
    assert a["step_time_s"] == pytest.approx(0.1) and a["collectives_per_step"] == pytest.approx(8 / 4)
    assert list(table["label"]) == ["a", "b"] and math.isnan(table.set_index("label").loc["b", "final_val_loss_std"])


def test_methods_table_ratios_state_downstream_and_modeled_time():
    memory = {"ddp": {"memory/adamw_moments_bytes": 800.0},
              "lordo": {"memory/moments_bytes": 50.0, "memory/bases_bytes": 10.0, "memory/adamw_moments_bytes": 400.0,
                        "memory/error_feedback_bytes": 200.0, "memory/anchor_bytes": 300.0}}
    results = [run("ddp", 0, [8.0, 5.0, 4.0], **memory["ddp"]),
               run("lordo", 0, [8.0, 4.5, 4.6], **{**memory["lordo"], "bytes_per_step/total": 1e5})]
    spec = TableSpec.parse({"kind": "methods", "baselines": ["ddp"], "state_baseline": "ddp", "bandwidth_gbps": 8,
                            "latency_s": 1e-3, "compare": [["lordo", "ddp"]]})
    tables = build_tables(spec, results)
    t = tables["table"].set_index("label")
    assert t.loc["lordo", "bytes_ratio_to_ddp"] == pytest.approx(0.1)
    assert t.loc["lordo", "optimizer_state_bytes"] == 460 and t.loc["lordo", "anchor_bytes"] == 300
    assert t.loc["lordo", "state_ratio_to_adamw"] == pytest.approx(460 / 800)
    assert t.loc["lordo", "matrix_moments_ratio"] == pytest.approx((800 - 400) / 50)
    assert (t["downstream"] == "not evaluated").all()
    # lordo's final loss 4.6 is first reached between steps 4 (4.5 <= 4.6): step 0 -> 4 interpolated
    assert t.loc["lordo", "steps_to_final"] == pytest.approx(4 * (8.0 - 4.6) / (8.0 - 4.5))
    t_step = 0.1 + 1e5 * 8 / 8e9 + 1e-3 * 8 / 8  # compute + bytes / bandwidth + latency x collectives per step
    assert t.loc["lordo", "time_to_final_s_8gbps"] == pytest.approx(t.loc["lordo", "steps_to_final"] * t_step)
    assert tables["comparisons"]["verdict"].tolist() == ["too few seeds"]
    assert "time_to_target_s_8gbps" not in t


def test_methods_table_times_to_a_common_target_every_row_reaches():
    results = [run("ddp", 0, [8.0, 5.0, 4.0]), run("lordo", 0, [8.0, 4.5, 4.6], **{"bytes_per_step/total": 1e5})]
    t = build_tables(TableSpec.parse({"kind": "methods", "latency_s": 1e-3, "target_bandwidths_gbps": [0.01, 0.1]}),
                     results)["table"].set_index("label")
    assert (t["target_loss"] == 4.6).all()  # the worst final loss
    assert t.loc["ddp", "steps_to_target"] == pytest.approx(4 + 4 * (5.0 - 4.6) / (5.0 - 4.0))
    for label, sent in (("ddp", 1e6), ("lordo", 1e5)):
        t_step = 0.1 + sent * 8 / 1e7 + 1e-3 * 8 / 8
        assert t.loc[label, "time_to_target_s_0.01gbps"] == pytest.approx(t.loc[label, "steps_to_target"] * t_step)


def test_downstream_scores_and_words_become_columns():
    results = [run("a", s, [8.0, 5.0], downstream={"arc_easy": {"acc": 0.3 + s / 10}, "mmlu": "needs the hub"})
               for s in (0, 1)]
    t = build_tables(TableSpec.parse({"kind": "methods"}), results)["table"].iloc[0]
    assert t["downstream/arc_easy/acc"] == pytest.approx(0.35) and t["downstream/mmlu"] == "needs the hub"
    assert "downstream" not in t


def test_convergence_steps_to_the_target_runs_best_loss_of_the_same_seed():
    results = [run("dion", 0, [8.0, 6.0, 5.0]), run("orth", 0, [8.0, 5.5, 4.0]),
               run("dion", 1, [8.0, 6.0, 4.0]), run("orth", 1, [8.0, 5.0, 4.5])]
    t = build_tables(TableSpec.parse({"kind": "convergence", "target": "dion"}), results)["table"].set_index("label")
    # seed 0: target 5.0, orth reaches it at 4 + 4 (5.5 - 5.0) / 1.5; seed 1: target 4.0, orth never does
    assert t.loc["orth", "steps_to_target"] == pytest.approx(4 + 4 * 0.5 / 1.5)
    assert t.loc["orth", "steps_to_target_n"] == 1 and t.loc["dion", "steps_to_target"] == 8
    assert t.loc["orth", "time_to_target_s"] == pytest.approx((4 + 4 * 0.5 / 1.5) * 0.1)


def test_sweep_and_beta_comparisons_pair_rows_at_the_same_value():
    sweep = [run(f"{m}_r{r}", s, [8.0, 5.0 + r / 100 + s / 1000 + (0.1 + s / 100 if m == "local" else 0)], method=m,
                 sweep=r) for m in ("global", "local") for r in (8, 16) for s in (0, 1, 2)]
    c = build_tables(TableSpec.parse({"kind": "sweep", "compare": [["global", "local"]]}), sweep)["comparisons"]
    assert list(zip(c["sweep_value"], c["a"], c["b"], c["verdict"])) == [(8, "global_r8", "local_r8", "lower"),
                                                                        (16, "global_r16", "local_r16", "lower")]
    betas = [run(f"dion_beta{b}", s, [8.0, 5.0 - b / 10], method="dion", sweep=b) for b in (0, 0.1, 1) for s in (0,)]
    c = build_tables(TableSpec.parse({"kind": "beta", "reference": 1.0}), betas)["comparisons"]
    assert list(zip(c["a"], c["b"])) == [("dion_beta0", "dion_beta1"), ("dion_beta0.1", "dion_beta1")]


def test_stagnation_angles_are_taken_at_sync_steps():
    results = [run("lordo", 0, [8.0, 6.0, 5.0, 4.5, 4.2], angles=[0.5, 0.9, 0.7, 0.8], omega=0.7)]
    t = build_tables(TableSpec.parse({"kind": "stagnation"}), results)["table"].iloc[0]
    assert t["angle_max_over_syncs"] == 0.9 and t["angle_median_over_syncs"] == pytest.approx(0.75)
    assert t["omega"] == pytest.approx(0.7) and t["weight_decay"] == pytest.approx(0.1)  # LoRDO step defaults


def test_nu_table_puts_the_rank_and_its_square_root_beside_nu():
    dion = {**CONFIG, "sync": {"name": "optimizer_sync"}, "optim": {"name": "dion", "rank_fraction": 0.125}}
    results = [run("dion", s, [8.0, 5.0, 4.5], config=dion) for s in (0, 1)]
    for r, nus in zip(results, ([1.2, 1.4], [1.4, 1.6])):
        r.metrics["spectral/nu_mean"] = [math.nan, *nus]
        r.metrics["spectral/nu_max"] = [math.nan, *[n + 0.5 for n in nus]]
    t = build_tables(TableSpec.parse({"kind": "nu"}), results)["table"].iloc[0]
    assert t["rank"] == 8 and t["sqrt_rank"] == pytest.approx(math.sqrt(8))  # ceil(0.125 x 64)
    # per run: mean of nu_mean over the logged steps (1.3, 1.5), max of nu_max (1.9, 2.1); then means over seeds
    assert t["nu_mean_over_training"] == pytest.approx(1.4) and t["nu_max_over_training"] == pytest.approx(2.0)
    assert t["nu_mean_over_training_std"] == pytest.approx(math.sqrt(0.02))


def test_horizon_gaps_to_ddp_per_horizon_and_the_steps_ddp_needs():
    """ddp's longest run (validation at steps 0, 4, 8, 12) reaches lordo's 4.52 between step 8 (5.0) and 12 (4.0)."""
    results = [run(f"ddp_steps{h}", s, losses, method="ddp", sweep=h)
               for h, losses in ((8, [8.0, 6.0, 5.2]), (12, [8.0, 6.0, 5.0, 4.0])) for s in (1, 2, 3)]
    results += [run(f"lordo_steps{h}", s, [8.0, 6.5, loss + s / 100], method="lordo", sweep=h)
                for h, loss in ((8, 5.5), (12, 4.5)) for s in (1, 2, 3)]
    results += [run("lordo_k8_steps12", s, [8.0, 6.5, 4.3 + s / 50], method="lordo_k8", sweep=12) for s in (1, 2, 3)]
    spec = TableSpec.parse({"kind": "gap_by_horizon", "baseline": "ddp", "compare": [["lordo_k8", "lordo"]]})
    tables = build_tables(spec, results)
    t = tables["table"].set_index("label")
    assert t.loc["lordo_steps12", "baseline_steps_to_final"] == pytest.approx(8 + 4 * (5.0 - 4.52) / (5.0 - 4.0))
    assert t.loc["ddp_steps12", "baseline_steps_to_final"] == pytest.approx(12)
    c = tables["comparisons"]
    assert list(zip(c["sweep_value"], c["a"], c["b"], c["verdict"])) == [
        (8, "lordo_steps8", "ddp_steps8", "higher"), (12, "lordo_steps12", "ddp_steps12", "higher"),
        (12, "lordo_k8_steps12", "ddp_steps12", "higher"), (12, "lordo_k8_steps12", "lordo_steps12", "lower")]
    # K = 8 against K = 32 per seed: 4.32 - 4.51, 4.34 - 4.52, 4.36 - 4.53, only at the horizon both have
    assert c["diff"].tolist() == pytest.approx([5.52 - 5.2, 4.52 - 4.0, 4.34 - 4.0, 4.34 - 4.52])


def emulated(method, rate, losses, seconds_per_step, bytes_per_step, collectives):
    """A run over the emulated network at `rate` (measured: rate x 0.96), validation every 4 steps."""
    r = run(f"{method}_mbit{rate}", 1, losses, method=method, sweep=rate, link_rate_measured_mbit=[rate * 0.96] * 2,
            **{"bytes_per_step/total": bytes_per_step, "comm/training_collectives": collectives * 4 * (len(losses) - 1)})
    r.metrics["tokens_per_s"] = [math.nan] + [80 / seconds_per_step] * (len(losses) - 1)
    return r


def test_emulated_network_measured_beside_modeled_and_the_crossover():
    """ddp: 1 MB and 1 collective per step, 0.1 s of compute; lordo: 0.1 MB, 0.25 collectives, 0.12 s, more steps
    to the target. Measured steps take what the model says (but for one lordo run whose compute is 30 % slower), so
    the method's median compute is the true one and every other ratio is 1; lordo is faster at 8 and 80 Mbit/s,
    slower at 800."""
    model = {"ddp": (0.1, 1e6, 1.0), "lordo": (0.12, 1e5, 0.25)}
    curves = {"ddp": [8.0, 6.0, 5.0, 4.0], "lordo": [8.0, 6.5, 5.5, 4.5]}
    results, times = [], {}
    for rate in (8, 80, 800, 100000):
        for method, (compute, nbytes, collectives) in model.items():
            slow = 0.3 * compute if (method, rate) == ("lordo", 100000) else 0.0
            t = compute + 8 * nbytes / (rate * 0.96e6) + 1e-3 * collectives
            times[method, rate] = t
            results.append(emulated(method, rate, curves[method], t + slow, nbytes, collectives))
    tables = build_tables(TableSpec.parse({"kind": "emulated_network", "latency_s": 1e-3, "target_margin": 0.1,
                           "crossover": [["lordo", "ddp"]]}), results)
    t = tables["table"].set_index("label")
    assert list(t.index) == [f"{m}_mbit{r}" for r in (8, 80, 800, 100000) for m in ("ddp", "lordo")]
    assert t.loc["lordo_mbit100000", "compute_run_s"] == pytest.approx(1.3 * 0.12)
    assert t["compute_s"].tolist() == pytest.approx([0.1, 0.12] * 4)
    assert t["step_time_ratio"].tolist()[:7] == pytest.approx([1.0] * 7)
    assert t.loc["lordo_mbit100000", "step_time_ratio"] > 1.25
    t = t.drop(index="lordo_mbit100000")
    target = 4.5 + 0.1 * (8.0 - 4.5)  # worst final loss, a tenth of the way back to the initial loss
    assert t["target_loss"].tolist() == pytest.approx([target] * 7)
    steps = {"ddp": 8 + 4 * (5.0 - target) / (5.0 - 4.0), "lordo": 8 + 4 * (5.5 - target) / (5.5 - 4.5)}
    assert t.loc["lordo_mbit8", "steps_to_target"] == pytest.approx(steps["lordo"])
    assert t.loc["lordo_mbit8", "time_to_target_measured_s"] == pytest.approx(steps["lordo"] * times["lordo", 8])
    assert t["time_to_target_ratio"].tolist() == pytest.approx([1.0] * 7)
    c = tables["crossover"].iloc[0]
    s_d, s_l = steps["ddp"], steps["lordo"]  # S_l (c_l + 8 B_l / R + L n_l) = S_d (c_d + 8 B_d / R + L n_d)
    modeled = 8 * (s_d * 1e6 - s_l * 1e5) / (s_l * (0.12 + 1e-3 * 0.25) - s_d * (0.1 + 1e-3)) / 1e6
    assert c["crossover_modeled_mbit"] == pytest.approx(modeled) and 80 < modeled < 800
    l80, l800 = (math.log(s_l * times["lordo", r] / (s_d * times["ddp", r])) for r in (80, 800))
    assert l80 < 0 < l800
    assert c["crossover_measured_mbit"] == pytest.approx(math.exp(math.log(80) + l80 / (l80 - l800) * math.log(10)))


def config_of(sync: dict, optim: dict) -> OmegaConf:
    return OmegaConf.create({**CONFIG, "sync": sync, "optim": optim})


@pytest.mark.parametrize("sync, optim, rank, rank_fraction", [
    ({"name": "lordo", "sync_every": 4}, {"name": "lordo_local_step", "rank": 8}, 8, None),
    ({"name": "lowrank_ddp"}, {"name": "galore"}, 8, None),  # the default share of d = 64: round(0.125 x 64)
    ({"name": "optimizer_sync"}, {"name": "orth_dion", "rank_fraction": 0.5}, None, 0.5),
    ({"name": "orth_dion_local", "sync_every": 4}, {"name": "orth_dion"}, None, 0.25),
    ({"name": "diloco", "sync_every": 4}, {"name": "muon"}, None, None),
    ({"name": "ddp"}, {"name": "adamw"}, None, None),
])
def test_accounted_run_takes_the_rank_its_optimizer_options_declare(sync, optim, rank, rank_fraction):
    cfg = config_of(sync, optim)
    assert accounted_run(cfg, run_model(cfg)) == AccountedMethod(sync_options(sync), rank, rank_fraction)


def test_analytic_bytes_of_a_self_synchronizing_run_are_dions_factors():
    cfg = config_of({"name": "optimizer_sync"}, {"name": "orth_dion", "rank_fraction": 0.5})
    result = RunResult("orth_dion", "orth_dion", None, 0, "orth_dion-s0", {"steps": 8},
                       OmegaConf.to_container(cfg), pd.DataFrame())
    expected = analytic_bytes_per_step({"name": "optimizer_sync", "rank_fraction": 0.5}, model_shapes("smoke"), 2,
                                       steps=8)
    assert set(expected) == {"factor", "gradient"}
    assert analytic_bytes(result) == pytest.approx(sum(expected.values()), rel=1e-12)


def test_dion_rank_is_the_largest_capped_fraction_of_min_m_n():
    assert dion_rank(config_of({"name": "optimizer_sync"}, {"name": "orth_dion", "rank_fraction": 0.3})) == 20
    assert dion_rank(config_of({"name": "optimizer_sync"}, {"name": "orth_dion", "rank_fraction": 1.0})) == 64


def test_choice_table_ranks_settings_within_each_group_against_the_groups_best_mean():
    """Two worker counts, three outer settings at M = 1 and two at M = 4: the winner per group by the mean over seeds,
    the paired interval to it (a constant offset: zero width), a tie where a row's interval contains 0, an edge where
    the winner holds the grid's largest outer lr."""
    def config(devices, outer_lr):
        return {**CONFIG, "train": {"devices": devices, "num_nodes": 1},
                "sync": {"name": "diloco", "sync_every": 4, "outer_lr": outer_lr, "outer_momentum": 0.9},
                "optim": {"name": "adamw"}}
    finals = {("m1_o0.4", 1, 0.4): [4.3, 4.5, 4.4], ("m1_o0.7", 1, 0.7): [4.1, 4.3, 4.2],
              ("m1_o1.0", 1, 1.0): [4.2, 4.2, 4.2], ("m4_o0.4", 4, 0.4): [4.6, 4.6, 4.65],
              ("m4_o1.0", 4, 1.0): [4.5, 4.5, 4.5]}
    results = [run(label, seed, [8.0, loss], method="diloco", config=config(devices, outer_lr))
               for (label, devices, outer_lr), losses in finals.items() for seed, loss in enumerate(losses)]
    spec = TableSpec.parse({"kind": "choice", "settings": ["sync.outer_lr", "sync.outer_momentum"],
                            "group": ["train.devices"]})
    table = build_tables(spec, results)["table"].set_index("label")
    assert list(table.index[table["chosen"]]) == ["m1_o0.7", "m4_o1.0"]
    assert table.loc["m1_o0.4", "diff_to_winner"] == pytest.approx(0.2)
    assert table.loc["m1_o0.4", "ci_low"] == pytest.approx(0.2) and table.loc["m1_o0.4", "verdict_to_winner"] == "higher"
    assert table.loc["m1_o0.7", "tie"] == "m1_o1.0" and table.loc["m1_o0.7", "edge"] == ""
    assert table.loc["m4_o1.0", "edge"] == "sync.outer_lr high" and table.loc["m4_o1.0", "tie"] == ""
    assert table.loc["m4_o0.4", "mean"] == pytest.approx(4.6167, abs=1e-4)
    assert (table["sync.outer_momentum"] == 0.9).all() and list(table["train.devices"]) == [1, 1, 1, 4, 4]


def test_choice_table_adds_the_features_it_names_and_refuses_an_unknown_one():
    """LoRDO's balance as a choice feature: the median over the steps after the warmup of full / low update RMS, per
    run, its mean per row (the 4-step warmup leaves out step 4's ratio 9)."""
    def lordo(seed, omega, ratios):
        result = run(f"omega{omega}", seed, [8.0, 5.0 + omega + seed / 10, 4.0 + omega + seed / 10],
                     config={**CONFIG, "train": {**CONFIG["train"], "warmup": 4},
                             "optim": {"name": "lordo_local_step", "omega": omega}})
        result.metrics["update_rms/low"] = [math.nan, 1.0, 1.0]
        result.metrics["update_rms/full"] = [math.nan, *ratios]
        return result
    results = [lordo(0, 0.7, [9.0, 2.0]), lordo(1, 0.7, [9.0, 4.0]), lordo(0, 0.8, [9.0, 1.0])]
    spec = TableSpec.parse({"kind": "choice", "settings": ["optim.omega"], "features": ["balance"]})
    table = build_tables(spec, results)["table"].set_index("label")
    assert table.loc["omega0.7", "balance"] == pytest.approx(3.0) and table.loc["omega0.8", "balance"] == 1.0
    assert list(table.index[table["chosen"]]) == ["omega0.7"] and table.loc["omega0.7", "edge"] == "optim.omega low"
    with pytest.raises(ConfigError, match=r"table.features names 'balanc': use one of \['balance'\]"):
        build_tables(TableSpec.parse({"kind": "choice", "settings": ["optim.omega"], "features": ["balanc"]}), results)


def test_gap_table_gives_each_rows_paired_gap_to_its_baseline_in_nats_and_percent_beside_the_papers():
    """DiLoCo at M = 1 and 2 against ddp: per-seed differences (-0.1, -0.1, -0.1) and (0.1, 0.2, 0.3) over ddp's
    mean 5.0; a row without a gap (ddp itself) has none, and each row shows its worker count and, where its sync
    kind has one, its outer lr."""
    def config(devices, sync):
        return {**CONFIG, "train": {"devices": devices, "num_nodes": 1}, "optim": {"name": "adamw"},
                "sync": {"name": sync, "sync_every": 4}}
    finals = {("ddp", 4): [4.9, 5.0, 5.1, 6.0, 6.0], ("diloco_M1", 1): [4.8, 4.9, 5.0],
              ("diloco_M2", 2): [5.0, 5.2, 5.4]}  # ddp's seeds 3 and 4 pair with no row: its mean over 0-2 is 5.0
    results = [run(label, seed, [8.0, loss], config=config(devices, label.split("_")[0]))
               for (label, devices), losses in finals.items() for seed, loss in enumerate(losses)]
    spec = TableSpec.parse({"kind": "gap", "settings": ["train.devices", "sync.outer_lr"], "gaps": [["diloco_M1", "ddp"],
                            ["diloco_M2", "ddp"]], "paper_pct": {"diloco_M1": -0.1, "diloco_M2": 0.7},
                            "compare": [["diloco_M2", "diloco_M1"]]})
    tables = build_tables(spec, results)
    table = tables["table"].set_index("label")
    m1, m2 = table.loc["diloco_M1"], table.loc["diloco_M2"]
    assert (m1["baseline"], m1["baseline_loss"], m1["gap_n"]) == ("ddp", pytest.approx(5.0), 3)
    assert m1["gap"] == pytest.approx(-0.1) and m1["gap_low"] == pytest.approx(-0.1) and m1["gap_verdict"] == "lower"
    assert m1["gap_pct"] == pytest.approx(-2.0) and m1["paper_gap_pct"] == -0.1
    half = 4.302653 * 0.1 / math.sqrt(3)  # t(0.975, 2) times the standard error of (0.1, 0.2, 0.3)
    assert m2["gap"] == pytest.approx(0.2) and m2["gap_high"] == pytest.approx(0.2 + half, rel=1e-5)
    assert m2["gap_pct_high"] == pytest.approx(100 * (0.2 + half) / 5.0, rel=1e-5)
    assert list(table["train.devices"]) == [4, 1, 2] and math.isnan(table.loc["ddp", "gap"])
    assert math.isnan(table.loc["ddp", "sync.outer_lr"]) and m1["sync.outer_lr"] == 0.7
    assert table.loc["ddp", "final_val_loss"] == pytest.approx(5.4)
    comparisons = tables["comparisons"]
    assert list(comparisons["a"] + " - " + comparisons["b"]) == ["diloco_M1 - ddp", "diloco_M2 - ddp",
                                                                 "diloco_M2 - diloco_M1"]
    assert comparisons["diff"].iloc[2] == pytest.approx(0.3)


def test_every_presets_table_spec_names_a_kind_its_needed_parameters_and_known_features():
    for spec in experiments():
        for preset in spec.presets:
            check_table(spec.table_of(preset))


@pytest.mark.parametrize("params, match", [
    ({"gaps": [["a", "b"], ["a", "c"]], "settings": ["train.devices"]}, r"gives a row more than one baseline"),
    ({"gaps": [["a", "b"]], "settings": []}, r"table kind 'gap' needs settings"),
    ({"gaps": [["a", "b"]], "settings": ["train.devices"], "paper_pcts": {}},
     r"reads no \['paper_pcts'\]: its parameters are \['compare', 'gaps', 'paper_pct', 'settings'\]"),
])
def test_a_table_spec_that_gives_a_row_two_baselines_leaves_out_a_need_or_misnames_a_parameter_is_named(params,
                                                                                                       match):
    with pytest.raises(ConfigError, match=match):
        check_table(TableSpec.parse({"kind": "gap", **params}))


def test_labels_keep_the_gaps_of_their_rows_and_need_their_baselines():
    spec = TableSpec.parse({"kind": "gap", "settings": ["train.devices"], "gaps": [["m1", "ddp"], ["m4", "ddp"]],
                            "paper_pct": {"m1": -0.1, "m4": 2.0}, "compare": [["m4", "m1"]]})
    kept = table_of_rows(spec, ["m1", "ddp"])
    assert kept["gaps"] == [["m1", "ddp"]] and kept["paper_pct"] == {"m1": -0.1}
    assert kept["compare"] == [["m4", "m1"]]  # compare_rows skips a pair that lacks a row
    with pytest.raises(ConfigError, match=r"--labels m4 leaves out \['ddp'\], .*: add it \(--labels m4,ddp\)"):
        table_of_rows(spec, ["m4"])
    with pytest.raises(ConfigError, match=r"--labels ddp keeps no row of the table's gaps: add one of \['m1', 'm4'\]"):
        table_of_rows(spec, ["ddp"])
    assert table_of_rows(TableSpec.parse({"kind": "methods"}), ["ddp"]) == TableSpec.parse({"kind": "methods"})


def test_a_gap_that_names_a_label_no_run_has_is_named():
    results = [run("ddp", 0, [8.0, 5.0]), run("diloco_M1", 0, [8.0, 4.9])]
    spec = TableSpec.parse({"kind": "gap", "settings": ["train.devices"], "gaps": [["diloco_M1", "dpp"]]})
    with pytest.raises(ConfigError, match=r"name \['dpp'\], which no run has: use the labels \['ddp', 'diloco_M1'\]"):
        build_tables(spec, results)
