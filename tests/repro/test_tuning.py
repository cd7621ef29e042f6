"""The learning-rate protocol: every experiment row's lr is named in its config or taken from the tuned file, the
choice follows the lowest loss and refuses an edge, and a diverged run is a result of the sweep."""

from __future__ import annotations

import dataclasses
import io
import math
import re
from pathlib import Path

import pandas as pd
import pytest
import yaml
from omegaconf import OmegaConf

from lowcomm.config import ConfigError
from lowcomm.optim import OPTIMIZERS, optimizer_options
from lowcomm.optim.registry import LEGACY_KEYS
from lowcomm.paths import method_names
from lowcomm.repro import tuning
from lowcomm.repro.experiment import (
    experiment_grid,
    resolved_config,
    stale_reason,
)
from lowcomm.repro.spec import RunSpec, load_spec, tuning_sweep
from lowcomm.repro.stats import paired_difference
from lowcomm.repro.store import ResultsStore
from lowcomm.repro.tuning import choose, tuned_file, tuned_overrides

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted(p for p in (ROOT / "experiments").glob("*/config.yaml") if "runs" in yaml.safe_load(p.read_text()))
METHODS = method_names()


@pytest.fixture
def tuned(tmp_path, monkeypatch):
    """A tuned file holding a distinct lr for every method (so a row's lr tells where it came from), and one for each
    earlier protocol's tuned file in experiments/ (tuned_lr_<version>.yaml), its lrs distinct from all the others;
    each with a distinct lr at every horizon and method of its real file's `lr_at_horizon`."""
    path = tmp_path / "tuned_lr.yaml"
    for k, name in enumerate(["tuned_lr.yaml", *sorted(p.name for p in ROOT.glob("experiments/tuned_lr_*.yaml"))]):
        lrs = {m: 1e-4 * (i + 1) + 1e-6 * k for i, m in enumerate(METHODS)}
        at = {steps: {m: 5e-2 + 1e-4 * (i + 1) + 1e-6 * k + 1e-7 * j for i, m in enumerate(methods)}
              for j, (steps, methods) in enumerate(tuning.load_tuned(ROOT / "experiments" / name)
                                                   .get("lr_at_horizon", {}).items())}
        (tmp_path / name).write_text(yaml.safe_dump({"lr": lrs, "adamw_lr": 7.7e-4 + 1e-6 * k, "lr_at_horizon": at}))
    monkeypatch.setattr(tuning, "TUNED_FILE", path)
    return path


def named(overrides: tuple[str, ...], key: str) -> float | None:
    values = [item.split("=", 1)[1] for item in overrides if item.startswith(f"{key}=")]
    return float(values[-1]) if values else None


# Presets whose rows take a tuned lr chosen at another horizon (the length of the lr schedule) than their own, by
# method: stored results made before the protocol's v2 (experiments/lr_sweep/README.md). Each leaves this list when
# it moves to a tuned horizon or its horizon is tuned; no other preset may join it.
BORROWS_ANOTHER_HORIZON = {
    ("beta_sweep", "forms"): {"dion", "orth_dion"},
    ("communication", "emulated"): {"ddp", "diloco", "dion", "local_adam", "lordo", "lowrank_ddp", "muloco", "muon"},
    ("horizon", "cpu"): {"ddp", "local_adam", "lordo", "lordo_local", "lowrank_ddp"},
    ("nu_measurement", "cpu"): {"dion", "orth_dion"},
    ("orthdion_convergence", "cpu"): {"ada_orth_dion", "ddp", "dion", "muon", "orth_dion"},
    ("spectral_local_steps", "cpu"): {"ddp", "diloco", "local_adam", "lordo", "lordo_orth_dion", "muloco", "muon",
                                      "orth_dion_local"},
    ("spectral_local_steps", "probe"): {"ddp", "diloco", "local_adam", "lordo", "lordo_orth_dion", "muloco", "muon",
                                        "orth_dion_local"},
    ("spectral_local_steps", "probe_paired"): {"diloco", "muloco"},
    ("table3_main", "quick"): {"ddp", "local_adam", "lordo", "lordo_global_noqh", "lordo_local", "lowrank_ddp"},
    ("table3_main", "cpu"): {"ddp", "local_adam", "lordo_global_noqh"},
}


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.parent.name)
def test_every_row_runs_at_an_lr_named_in_its_config_or_the_tuned_file(config, tuned, tmp_path):
    """... and a row that takes its method's tuned lr runs at the horizon that lr was tuned at (the real tuned
    file's `horizon`, or its lr at the row's own horizon: `lr_at_horizon`), apart from the listed presets."""
    spec = load_spec(config)
    for preset in spec.presets:
        file = tuning.tuned_path(spec.presets[preset].tuned_from).name  # the preset's tuned file, and the fake one
        real = tuning.load_tuned(ROOT / "experiments" / file)
        fake = yaml.safe_load((tuned.parent / file).read_text())
        borrowed, takes_tuned = set(), "lr" in spec.presets[preset].tuned
        for run in experiment_grid(spec, preset):
            cfg = resolved_config(spec, run, tmp_path)
            lr = named(run.overrides, "optim.lr")
            where = f"{spec.name} {preset} {run.name}"
            assert lr is not None, f"{where}: no optim.lr in its overrides (it would run at a default)"
            assert cfg.optim.lr == pytest.approx(lr), where
            if "adamw_lr" in cfg.optim and cfg.optim.adamw_lr is not None:
                assert cfg.optim.adamw_lr == pytest.approx(named(run.overrides, "optim.adamw_lr")), where
            method = spec.run(run.method).method
            pinned = sum(item.startswith("optim.lr=") for item in run.overrides) > takes_tuned
            from_tuned = takes_tuned and not pinned
            steps = tuning.horizon_of(cfg)
            at_own_horizon = method in real.get("lr_at_horizon", {}).get(steps, {})
            expected = fake["lr_at_horizon"][steps][method] if at_own_horizon else fake["lr"][method]
            assert not from_tuned or lr == pytest.approx(expected), f"{where}: not its tuned file's lr"
            if from_tuned and not at_own_horizon and steps != real["horizon"][method]:
                borrowed.add(method)
        assert borrowed == BORROWS_ANOTHER_HORIZON.get((spec.name, preset), set()), (
            f"{spec.name} {preset}: rows at an lr tuned for another horizon: {sorted(borrowed)}")


def test_an_earlier_protocols_file_is_written_from_its_stages_only_beside_the_tuned_file(tuned, tmp_path, capsys):
    """--stages with the tuned file as --out, or a stage the sweep does not have, is refused before anything is
    written."""
    for argv, match in ((["--stages", "cpu"], r"give --out another file than"),
                        (["--stages", "cpu,claim3", "--out", str(tmp_path / "x.yaml")],
                         r"\['claim3'\] are not stages of lr_sweep")):
        with pytest.raises(SystemExit, match=match):
            tuning.main(argv)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tuned_lr.yaml", "tuned_lr_v1.yaml"]
    with pytest.raises(ConfigError, match=r"tuned_from: v0: .*tuned_lr_v0.yaml does not exist"):
        tuning.tuned_path("v0")


def test_tuned_overrides_name_the_missing_entry_and_skip_adamw_lr_where_there_is_none(tmp_path):
    path = tmp_path / "tuned_lr.yaml"
    path.write_text(yaml.safe_dump({"lr": {"ddp": 0.006, "muon": 0.04}, "adamw_lr": 0.006}))
    assert tuned_overrides("ddp", ["lr", "adamw_lr"], path) == ["optim.lr=0.006"]
    assert tuned_overrides("muon", ["lr", "adamw_lr"], path) == ["optim.lr=0.04", "optim.adamw_lr=0.006"]
    assert tuned_overrides("dion", ["adamw_lr"], path) == ["optim.adamw_lr=0.006"]
    with pytest.raises(ConfigError, match="no tuned lr for method lordo: run the lr sweep"):
        tuned_overrides("lordo", ["lr"], path)
    with pytest.raises(ConfigError, match="not tuned values"):
        tuned_overrides("ddp", ["omega"], path)
    assert RunSpec("x", ("optim.lr=1", "method=ddp", "method=lordo")).method == "lordo"


def test_a_run_takes_the_lr_tuned_at_its_own_horizon_where_the_file_has_one(tmp_path):
    """lr_at_horizon first, the method's lr otherwise; the run's horizon is resolved only for a method that has an lr
    at some horizon."""
    path = tmp_path / "tuned_lr.yaml"
    path.write_text(yaml.safe_dump({"lr": {"ddp": 0.006, "muon": 0.04},
                                    "lr_at_horizon": {256: {"ddp": 0.012, "lordo": 0.024}}}))
    assert tuned_overrides("ddp", ["lr"], path, lambda: 256) == ["optim.lr=0.012"]
    assert tuned_overrides("ddp", ["lr"], path, lambda: 1024) == ["optim.lr=0.006"]
    assert tuned_overrides("lordo", ["lr"], path, lambda: 256) == ["optim.lr=0.024"]
    with pytest.raises(ConfigError, match=r"method lordo \(only at \[256\] steps, not at this run's 1024\)"):
        tuned_overrides("lordo", ["lr"], path, lambda: 1024)

    def unresolved() -> int:
        raise AssertionError("the horizon of a method without an lr at any horizon was resolved")

    assert tuned_overrides("muon", ["lr"], path, unresolved) == ["optim.lr=0.04"]
    assert tuning.tuned_lr(yaml.safe_load(path.read_text()), "ddp", lambda: 256) == (0.012, 256)


def test_the_runner_gives_each_run_the_lr_of_its_own_schedule_length(tuned):
    """horizon's cpu preset sweeps train.steps over 256-2048: with lordo tuned at 256 steps, its 256-step rows take
    that lr and its other rows lordo's lr; ddp, tuned at no horizon of its own, takes its lr at every length."""
    spec = load_spec(ROOT / "experiments" / "horizon" / "config.yaml")
    for path in tuned.parent.glob("tuned_lr*.yaml"):  # the preset's file, whichever version it names
        path.write_text(yaml.safe_dump({"lr": {"lordo": 0.01, "ddp": 0.003, "lowrank_ddp": 0.02, "local_adam": 0.003,
                                               "lordo_local": 0.01}, "adamw_lr": 0.003,
                                        "lr_at_horizon": {256: {"lordo": 0.05}}}))
    seen = set()
    for run in experiment_grid(spec, "cpu"):
        steps, method = int(named(run.overrides, "train.steps")), spec.run(run.method).method
        if method in ("lordo", "ddp") and run.label.startswith(f"{method}_steps"):
            expected = 0.05 if (method, steps) == ("lordo", 256) else {"lordo": 0.01, "ddp": 0.003}[method]
            assert named(run.overrides, "optim.lr") == expected, run.name
            seen.add((method, steps))
    assert seen == {(m, s) for m in ("lordo", "ddp") for s in (256, 512, 1024, 2048)}


def points(lrs: list[float], losses: list[list[float]]) -> pd.DataFrame:
    """A grid: losses[i] holds lr i's final loss on seeds 100, 101, ..."""
    return pd.DataFrame([{"lr": lr, "seed": 100 + s, "final_val_loss": loss, "run": f"r{lr}-s{100 + s}", "commit": "c"}
                         for lr, seeds in zip(lrs, losses) for s, loss in enumerate(seeds)])


def test_the_best_mean_wins_with_each_points_spread_and_paired_interval_to_it():
    grid = choose(points([1e-3, 2e-3, 4e-3], [[4.5, 4.6, 4.4], [4.2, 4.3, 4.1], [4.1, 4.4, math.inf]]))
    assert list(grid["lr"]) == [1e-3, 2e-3, 4e-3] and list(grid["chosen"]) == [False, True, False]
    assert grid["mean"].tolist()[:2] == pytest.approx([4.5, 4.2]) and grid["mean"].iloc[2] == math.inf
    assert grid["std"].iloc[0] == pytest.approx(0.1)
    d = paired_difference({100: 4.5, 101: 4.6, 102: 4.4}, {100: 4.2, 101: 4.3, 102: 4.1})
    assert (grid["diff_to_winner"].iloc[0], grid["ci_low"].iloc[0]) == (pytest.approx(d.diff), pytest.approx(d.low))
    assert (grid["edge"].iloc[0], grid["tie"].iloc[0]) == ("", "")  # 1e-3 is higher on every seed: no tie


def test_a_neighbour_whose_interval_contains_zero_makes_the_choice_a_tie_and_an_edge_names_the_point_to_add():
    tie = choose(points([1e-3, 2e-3, 4e-3], [[4.5, 4.6, 4.4], [4.2, 4.3, 4.1], [4.25, 4.2, 4.3]]))
    assert tie.loc[tie["chosen"], "lr"].item() == 2e-3 and set(tie["tie"]) == {"0.004"}
    high = choose(points([1e-3, 2e-3, 4e-3], [[4.5], [4.3], [4.1]]))  # one seed (protocol v1): no interval
    assert (high.loc[high["chosen"], "lr"].item(), high["edge"].iloc[0], high["add"].iloc[0]) == (4e-3, "high", 8e-3)
    low = choose(points([4e-3, 1e-3, 2e-3], [[4.6], [4.1], [4.3]]))  # any order in, the grid's order out
    assert (list(low["lr"]), low["edge"].iloc[0], low["add"].iloc[0]) == ([1e-3, 2e-3, 4e-3], "low", 5e-4)


def test_the_tuned_file_takes_each_methods_latest_stage_with_its_horizon_and_leaves_out_edges():
    chosen = pd.DataFrame([{"method": "ddp", "stage": "cpu", "horizon": 256, "lr": 3e-3, "chosen": True, "edge": ""},
                           {"method": "ddp", "stage": "cpu", "horizon": 256, "lr": 6e-3, "chosen": False, "edge": ""},
                           {"method": "lordo", "stage": "cpu", "horizon": 256, "lr": 6e-3, "chosen": True, "edge": ""},
                           {"method": "lordo", "stage": "claim", "horizon": 1024, "lr": 1.2e-2, "chosen": True,
                            "edge": ""},
                           {"method": "lordo", "stage": "claim_v2", "horizon": 1024, "lr": 6e-3, "chosen": True,
                            "edge": ""},
                           {"method": "muon", "stage": "cpu_spectral", "horizon": 256, "lr": 8e-2, "chosen": True,
                            "edge": "high"}])
    assert tuned_file(chosen, "ddp") == {"lr": {"ddp": 3e-3, "lordo": 6e-3}, "horizon": {"ddp": 256, "lordo": 1024},
                                  "adamw_lr": 3e-3}


def test_a_horizon_stage_keys_its_choice_by_steps_and_replaces_no_methods_lr():
    row = {"chosen": True, "edge": ""}
    chosen = pd.DataFrame([{**row, "method": "lordo", "stage": "claim", "horizon": 1024, "lr": 1.2e-2},
                           {**row, "method": "lordo", "stage": "short", "horizon": 256, "lr": 6e-3},
                           {**row, "method": "lowrank_ddp", "stage": "short", "horizon": 256, "lr": 2.4e-2},
                           {**row, "method": "lordo", "stage": "shorter", "horizon": 128, "lr": 3e-3},
                           {**row, "method": "ddp", "stage": "short", "horizon": 256, "lr": 3e-3, "edge": "low"}])
    assert tuned_file(chosen, "ddp", ("short", "shorter")) == {
        "lr": {"lordo": 1.2e-2}, "horizon": {"lordo": 1024},
        "lr_at_horizon": {128: {"lordo": 3e-3}, 256: {"lordo": 6e-3, "lowrank_ddp": 2.4e-2}}}
    later = pd.DataFrame([{**row, "method": "lordo", "stage": "again", "horizon": 256, "lr": 1.2e-2},
                          {**row, "method": "lowrank_ddp", "stage": "again", "horizon": 256, "lr": 4.8e-2,
                           "edge": "high"}])  # a later horizon stage at 256: it replaces, and its edge leaves out
    assert tuned_file(pd.concat([chosen, later]), "ddp", ("short", "shorter", "again"))["lr_at_horizon"] == {
        128: {"lordo": 3e-3}, 256: {"lordo": 1.2e-2}}


def test_lr_sweep_smoke_keeps_a_diverged_run_as_a_result(tmp_path):
    from lowcomm.repro.experiment import run_experiment
    from lowcomm.repro.store import ResultsStore

    out = run_experiment(ROOT / "experiments" / "lr_sweep" / "config.yaml", "smoke", ResultsStore(tmp_path),
                         extra=["optim.lr=1e6", "train.clip=0"])  # every point diverges
    table = out.table()
    assert (table["diverged"] == 1).all() and (table["final_val_loss"] == math.inf).all()
    again = run_experiment(ROOT / "experiments" / "lr_sweep" / "config.yaml", "smoke", ResultsStore(tmp_path),
                           extra=["optim.lr=1e6", "train.clip=0"], tables_only=True)  # reused, not rerun
    assert OmegaConf.load(again.run_dir("ddp_lr0.003-s0") / "config.yaml").optim.lr == 1e6


def test_beta_sweep_forms_resolve_to_the_published_pairs(tuned, tmp_path):
    """summary form: captured_share = 0, ef_beta = beta; code form: ef_beta = 1, captured_share = 1 - beta; Dion's
    default as reference."""
    spec = load_spec(ROOT / "experiments" / "beta_sweep" / "config.yaml")
    resolved = {run.label: resolved_config(spec, run, tmp_path).optim for run in experiment_grid(spec, "forms")
                if run.seed == 1}
    for beta in (0.1, 0.3, 0.5, 0.7):
        summary, code = resolved[f"dion_summary_beta{beta}"], resolved[f"orth_dion_code_beta{beta}"]
        assert (summary.captured_share, summary.ef_beta) == (0.0, beta)
        assert (code.ef_beta, code.captured_share) == (1.0, pytest.approx(1 - beta))
    assert (resolved["dion_summary_beta1.0"].captured_share, resolved["dion_summary_beta1.0"].ef_beta) == (0.0, 1.0)
    default = resolved["dion_default_beta1.0"]
    assert "captured_share" not in default and default.ef_beta == 1.0  # Dion's default captured_share 0.95


@pytest.mark.parametrize("name, old, new, value", [
    ("lordo_local_step", "mu", "qh_scale", 2.0), ("galore", "rank_fraction", "rank_share_of_smallest_dim", 0.25),
    ("dion", "mu", "captured_share", 0.5), ("ada_orth_dion", "mu", "captured_share", 0.0),
])
def test_a_stored_config_with_a_former_key_parses_as_the_current_key(name, old, new, value):
    assert optimizer_options({"name": name, old: value}) == optimizer_options({"name": name, new: value})
    assert getattr(optimizer_options({"name": name, old: value}), new) == value
    with pytest.raises(ValueError, match=f"optim.{old} is the former name of optim.{new}"):
        optimizer_options({"name": name, old: value, new: value})


def test_every_former_key_names_a_current_option_of_its_optimizer():
    for name, renamed in LEGACY_KEYS.items():
        keys = {f.name for f in dataclasses.fields(OPTIMIZERS[name].options)}
        assert set(renamed.values()) <= keys and not set(renamed) & keys, name


def test_a_stored_run_with_a_former_key_is_reused(tuned, tmp_path):
    spec = load_spec(ROOT / "experiments" / "beta_sweep" / "config.yaml")
    run = next(r for r in experiment_grid(spec, "forms") if r.label == "dion_code_beta0.5")
    cfg = resolved_config(spec, run, tmp_path)
    stored = OmegaConf.to_container(cfg)
    stored["optim"]["mu"] = stored["optim"].pop("captured_share")  # as a run written before the rename holds it
    run_dir = tmp_path / "stored"
    run_dir.mkdir()
    OmegaConf.save(OmegaConf.create(stored), run_dir / "config.yaml")
    (run_dir / "metrics.csv").write_text("step,loss\n0,5.0\n")
    (run_dir / "record.json").write_text('{"status": "complete"}')
    assert stale_reason(run_dir, cfg) is None


def test_the_code_form_is_compared_with_the_summary_forms_beta_one():
    from test_tables import run

    from lowcomm.repro.spec import TableSpec
    from lowcomm.repro.tables import build_tables

    results = [run(f"{m}_beta{b}", s, [8.0, 5.0 + b / 10], method=m, sweep=b)
               for m, betas in (("dion_summary", (0.1, 1.0)), ("dion_code", (0.1,))) for b in betas for s in (1, 2, 3)]
    spec = TableSpec.parse({"kind": "beta", "reference": 1.0, "reference_of": {"dion_code": "dion_summary"}})
    c = build_tables(spec, results)["comparisons"]
    assert list(zip(c["a"], c["b"])) == [("dion_summary_beta0.1", "dion_summary_beta1.0"),
                                         ("dion_code_beta0.1", "dion_summary_beta1.0")]


def test_the_stored_choice_is_what_the_stored_sweep_gives():
    """results/lr_sweep/chosen.csv, experiments/tuned_lr.yaml and every earlier protocol's file (from the stages its
    header's command names) are what `python -m lowcomm.repro.tuning` writes from the stored lr_sweep runs."""
    sweep, store = tuning_sweep(), ResultsStore(ROOT / "results")
    chosen = tuning.choices(store, sweep)
    written = io.StringIO()
    chosen.to_csv(written, index=False)
    written.seek(0)
    pd.testing.assert_frame_equal(pd.read_csv(written), pd.read_csv(store.experiment_dir(sweep.name) / "chosen.csv"))
    args = (sweep.tuning.nonmatrix_lr_from, sweep.tuning.horizon_stages)
    assert tuned_file(chosen, *args) == tuning.load_tuned(ROOT / "experiments" / "tuned_lr.yaml")
    earlier = sorted(ROOT.glob("experiments/tuned_lr_*.yaml"))
    assert earlier, "protocol v1's file is stored"
    for path in earlier:
        stages = re.search(r"--stages (\S+)", path.read_text()).group(1).split(",")
        assert tuned_file(tuning.choices(store, sweep, tuple(stages)), *args) == tuning.load_tuned(path), path.name
