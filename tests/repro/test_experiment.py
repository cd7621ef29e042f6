"""The experiment runner without training: the grid, run reuse, the verdict against a stored reference, the
two-standard-deviation rule, the wall-clock model, and the provenance of committed tables."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pandas as pd
import pytest
import yaml
from omegaconf import OmegaConf

from lowcomm.config import ConfigError
from lowcomm.cost.wallclock import compute_seconds, crossover_rate_mbit, step_time, steps_to_reach
from lowcomm.repro import experiment, tuning
from lowcomm.repro.experiment import (
    compare_to_reference,
    config_difference,
    experiment_grid,
    provenance_problems,
    resolved_config,
    stale_reason,
)
from lowcomm.repro.spec import load_spec
from lowcomm.repro.store import ResultsStore
from lowcomm.repro.stats import sample_std, within_reference

ROOT = Path(__file__).resolve().parents[2]
SPEC = """
name: demo
base: experiments/base.yaml
sweep: {key: optim.rank, values: [8, 16], tag: r}
presets:
  smoke: {seeds: [0], labels: [lordo], sweep: [4], sweep_overrides: {"4": [train.steps=8]}, overrides: [optim.lr=1e-2]}
  cpu:
    seeds: [0, 1, 2]
    overrides: [optim.lr=3e-3]
    run_overrides: {lordo_local: [optim.error_feedback=false]}
runs:
  - {label: lordo, overrides: [method=lordo]}
  - {label: lordo_local, overrides: [method=lordo_local], seeds: 1}
table: {kind: sweep}
"""


@pytest.fixture
def spec_path(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    path = tmp_path / "config.yaml"
    path.write_text(SPEC)
    return path


def test_grid_expands_runs_sweep_values_and_seeds_with_caps(spec_path):
    spec = load_spec(spec_path)
    grid = experiment_grid(spec, "cpu")
    assert [r.name for r in grid] == ["lordo_r8-s0", "lordo_r8-s1", "lordo_r8-s2", "lordo_r16-s0", "lordo_r16-s1",
                                      "lordo_r16-s2", "lordo_local_r8-s0", "lordo_local_r16-s0"]
    local = grid[-1]
    assert (local.method, local.sweep_value, local.seed) == ("lordo_local", 16, 0)
    cfg = resolved_config(spec, local, Path("/tmp/runs"))
    assert (cfg.optim.rank, cfg.optim.error_feedback, cfg.optim.lr) == (16, False, 3e-3)
    assert (cfg.train.seed, cfg.data.seed, cfg.run.name, cfg.train.progress_bar) == (0, 0, "lordo_local_r16-s0", False)
    assert [r.name for r in experiment_grid(spec, "cpu", seeds=[5])][:2] == ["lordo_r8-s5", "lordo_r16-s5"]
    smoke = experiment_grid(spec, "smoke")
    assert [r.name for r in smoke] == ["lordo_r4-s0"]
    cfg = resolved_config(spec, smoke[0], Path("/tmp/runs"))
    # experiments/presets.yaml's smoke overrides come first, the sweep value's own overrides after them
    assert (cfg.model.size, cfg.train.steps, cfg.optim.rank, cfg.optim.lr) == ("smoke", 8, 4, 1e-2)


def test_given_labels_keep_only_those_rows_of_the_preset_and_a_label_it_lacks_is_named(spec_path):
    spec = load_spec(spec_path)
    names = [r.name for r in experiment_grid(spec, "cpu", labels=["lordo_local"])]
    assert names == ["lordo_local_r8-s0", "lordo_local_r16-s0"]
    assert [r.name for r in experiment_grid(spec, "cpu", seeds=[5], labels=["lordo"])] == ["lordo_r8-s5",
                                                                                          "lordo_r16-s5"]
    with pytest.raises(ConfigError, match=r"preset smoke has no run labels \['lordo_local'\]: its labels are "
                                          r"\['lordo'\]"):
        experiment_grid(spec, "smoke", labels=["lordo_local"])


def test_run_seeds_give_one_run_more_seeds_in_a_preset_and_given_seeds_replace_them(spec_path):
    spec_path.write_text(SPEC.replace("    run_overrides:", "    run_seeds: {lordo: [0, 1, 2, 3, 4]}\n"
                                      "    run_overrides:"))
    spec = load_spec(spec_path)
    names = [run.name for run in experiment_grid(spec, "cpu")]
    assert names == [*(f"lordo_r{r}-s{s}" for r in (8, 16) for s in range(5)), "lordo_local_r8-s0",
                     "lordo_local_r16-s0"]
    assert [run.name for run in experiment_grid(spec, "cpu", seeds=[7])] == [
        "lordo_r8-s7", "lordo_r16-s7", "lordo_local_r8-s7", "lordo_local_r16-s7"]
    spec_path.write_text(SPEC.replace("    run_overrides:", "    run_seeds: {lordo_local: [5, 6]}\n"
                                      "    run_overrides:"))
    capped = [run.name for run in experiment_grid(load_spec(spec_path), "cpu")]  # lordo_local: seeds: 1, its first
    assert capped[-2:] == ["lordo_local_r8-s5", "lordo_local_r16-s5"]
    spec_path.write_text(SPEC.replace("    run_overrides:", "    run_seeds: {ddp: [0]}\n    run_overrides:"))
    with pytest.raises(ConfigError, match=r"presets.cpu names labels \['ddp'\] that no run has"):
        load_spec(spec_path)


def test_provenance_finds_a_runs_own_seeds_under_a_seeds_cap(spec_path, tmp_path):
    """lordo_local is capped at one seed; run_seeds gives it seed 5: its stored runs trace to the grid."""
    spec_path.write_text(SPEC.replace("    run_overrides:", "    run_seeds: {lordo_local: [5, 6]}\n    run_overrides:"))
    spec = load_spec(spec_path)
    head = experiment.git_commit()
    stored = ResultsStore(tmp_path / "results").preset("demo", "cpu")
    grid = experiment_grid(spec, "cpu")
    for run in grid:
        store_source(spec, run, stored.run_dir(run.name), {"status": "complete", "git_commit": head})
    rows = [{"label": label, "seeds": len(names), "runs": " ".join(names), "commits": head}
            for label in dict.fromkeys(run.label for run in grid)
            for names in [[run.name for run in grid if run.label == label]]]
    stored.dir.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(stored.dir / "table.csv", index=False)
    assert "lordo_local_r8-s5" in rows[-2]["runs"] and provenance_problems(spec_path, "cpu", stored.store) == []


def test_method_overrides_set_a_methods_defaults_in_a_preset_and_its_runs_own_overrides_win(spec_path):
    """lordo_local's preset sets qh_scale (6): the preset's method_overrides replace it; a run's own omega (and its
    sweep value of the rank) win over the method_overrides."""
    pinned = SPEC.replace("    run_overrides:", "    method_overrides: {lordo_local: [optim.qh_scale=1.0, "
                          "optim.omega=0.9, optim.rank=4]}\n    run_overrides:")
    spec_path.write_text(pinned.replace("overrides: [method=lordo_local]",
                                        "overrides: [method=lordo_local, optim.omega=0.5]"))
    spec = load_spec(spec_path)
    configs = {run.name: resolved_config(spec, run, Path("/tmp/runs")) for run in experiment_grid(spec, "cpu")}
    local, lordo = configs["lordo_local_r8-s0"], configs["lordo_r8-s0"]
    assert (local.optim.qh_scale, local.optim.omega, local.optim.rank) == (1.0, 0.5, 8)
    assert lordo.optim.qh_scale == 6.0 and "omega" not in lordo.optim  # another method keeps its preset
    smoke = resolved_config(spec, experiment_grid(spec, "smoke")[0], Path("/tmp/runs"))
    assert smoke.optim.qh_scale == 6.0  # another preset keeps the method's preset
    spec_path.write_text(SPEC.replace("    run_overrides:", "    method_overrides: {ddp: [optim.lr=1e-3]}\n"
                                      "    run_overrides:"))
    with pytest.raises(ConfigError, match=r"presets.cpu.method_overrides names methods \['ddp'\] that none of the "
                                          r"preset's runs has; its methods: \['lordo', 'lordo_local'\]"):
        load_spec(spec_path)


def test_tuned_from_takes_a_presets_lrs_from_an_earlier_protocols_tuned_file(spec_path, tmp_path, monkeypatch):
    """experiments/tuned_lr_<version>.yaml beside the tuned file; a version without a file, and tuned_from on a
    preset that takes no tuned lr, are named."""
    monkeypatch.setattr(tuning, "TUNED_FILE", tmp_path / "tuned_lr.yaml")
    (tmp_path / "tuned_lr.yaml").write_text(yaml.safe_dump({"lr": {"lordo": 0.02, "lordo_local": 0.03}}))
    (tmp_path / "tuned_lr_v1.yaml").write_text(yaml.safe_dump({"lr": {"lordo": 0.01, "lordo_local": 0.015}}))
    tuned = SPEC.replace("    overrides: [optim.lr=3e-3]", "    tuned: [lr]")
    spec_path.write_text(tuned.replace("    tuned: [lr]", "    tuned: [lr]\n    tuned_from: v1"))
    spec = load_spec(spec_path)
    assert spec.preset("cpu").tuned_from == "v1"
    lrs = {run.name: resolved_config(spec, run, tmp_path).optim.lr for run in experiment_grid(spec, "cpu")}
    assert lrs["lordo_r8-s0"] == 0.01 and lrs["lordo_local_r16-s0"] == 0.015
    spec_path.write_text(tuned)
    assert resolved_config(load_spec(spec_path), experiment_grid(load_spec(spec_path), "cpu")[0], tmp_path).optim.lr \
        == 0.02
    spec_path.write_text(tuned.replace("    tuned: [lr]", "    tuned: [lr]\n    tuned_from: v0"))
    with pytest.raises(ConfigError, match=r"tuned_from: .*tuned_lr_v0.yaml does not exist"):
        experiment_grid(load_spec(spec_path), "cpu")
    spec_path.write_text(SPEC.replace("    overrides: [optim.lr=3e-3]", "    overrides: [optim.lr=3e-3]\n"
                                      "    tuned_from: v1"))
    with pytest.raises(ConfigError, match=r"presets.cpu.tuned_from.*takes no tuned lr"):
        load_spec(spec_path)


@pytest.mark.parametrize("edit, match", [
    ("name: demo\nbasis: x\n", "unknown key"),
    (SPEC.replace("labels: [lordo]", "labels: [lordo_global]"), r"labels \['lordo_global'\]"),
    (SPEC.replace("sweep_overrides", "sweeps"), r"presets.smoke has unknown key\(s\) \['sweeps'\]"),
])
def test_bad_experiment_configs_are_named(spec_path, edit, match):
    spec_path.write_text(edit)
    with pytest.raises(ConfigError, match=match):
        load_spec(spec_path)


@pytest.mark.parametrize("table, match", [
    ("{kind: choice, settings: [optim.lr], features: [balanc]}", r"table.features names 'balanc'"),
    ("{kind: gap, settings: [train.devices]}", r"table kind 'gap' needs gaps: add it to the table spec"),
    ("{kind: choise}", r"table.kind='choise' is unknown"),
])
def test_a_bad_table_spec_is_named_before_any_run_trains(spec_path, tmp_path, table, match):
    spec_path.write_text(SPEC.replace("table: {kind: sweep}", f"table: {table}"))
    store = ResultsStore(tmp_path / "results")
    with pytest.raises(ConfigError, match=match):
        experiment.run_experiment(spec_path, "smoke", store)
    assert not (tmp_path / "results").exists()  # nothing trained, nothing written


def test_undefined_preset_is_named(spec_path):
    with pytest.raises(ConfigError, match="preset 'paper' is not defined in demo"):
        experiment_grid(load_spec(spec_path), "paper")


def write_run(run_dir: Path, cfg, record: dict) -> None:
    run_dir.mkdir(parents=True)
    OmegaConf.save(cfg, run_dir / "config.yaml")
    (run_dir / "metrics.csv").write_text("step,loss\n0,5.0\n")
    (run_dir / "record.json").write_text(json.dumps(record))


def test_a_run_is_reused_only_when_complete_with_the_same_config(spec_path, tmp_path):
    spec = load_spec(spec_path)
    run = experiment_grid(spec, "cpu")[0]
    cfg = resolved_config(spec, run, tmp_path / "runs")
    assert stale_reason(tmp_path / "runs" / "missing", cfg) == "not run yet"
    cases = {"complete": {"status": "complete"}, "old": {}, "interrupted": {"status": "interrupted"}}
    for name, record in cases.items():
        write_run(tmp_path / name, cfg, record)
    assert stale_reason(tmp_path / "complete", cfg) is None
    assert "no status" in stale_reason(tmp_path / "old", cfg)
    assert "'interrupted'" in stale_reason(tmp_path / "interrupted", cfg)
    other = resolved_config(spec, experiment_grid(spec, "cpu", extra=["optim.omega=0.5"])[0], tmp_path / "runs")
    # the stored run has no optim.omega: it ran at the optimizer's default 0.7
    assert stale_reason(tmp_path / "complete", other) == "its config differs (optim.omega: stored 0.7, now 0.5)"
    same = resolved_config(spec, experiment_grid(spec, "cpu", extra=["optim.omega=0.7"])[0], tmp_path / "runs")
    assert stale_reason(tmp_path / "complete", same) is None  # naming the default value is the same run
    for key, value, run_at in (("sync.outer_momentum", 0.9, None), ("sync.outer_momentum", 0.6, "0.9, now 0.6")):
        named = resolved_config(spec, experiment_grid(spec, "cpu", extra=[f"{key}={value}"])[0], tmp_path / "runs")
        expected = run_at and f"its config differs ({key}: stored {run_at})"
        assert stale_reason(tmp_path / "complete", named) == expected  # the sync kind's defaults likewise
    moved = resolved_config(spec, run, tmp_path.resolve() / "elsewhere" / "runs")
    assert stale_reason(tmp_path / "complete", moved) is None  # run.out_dir is where it lies, not what it trained


def test_a_schema_key_added_after_the_run_stands_for_its_default(spec_path, tmp_path):
    """A run stored before `train.compile` existed ran uncompiled: it stands for compile=false, not for true."""
    spec = load_spec(spec_path)
    run = experiment_grid(spec, "cpu")[0]
    cfg = resolved_config(spec, run, tmp_path / "runs")
    stored = OmegaConf.to_container(cfg)
    del stored["train"]["compile"]
    write_run(tmp_path / "older", OmegaConf.create(stored), {"status": "complete"})
    assert stale_reason(tmp_path / "older", cfg) is None
    compiled = resolved_config(spec, experiment_grid(spec, "cpu", extra=["train.compile=true"])[0], tmp_path / "runs")
    assert stale_reason(tmp_path / "older", compiled) == "its config differs (train.compile: stored False, now True)"


def test_config_difference_names_the_first_differing_key():
    assert config_difference({"a": {"b": 1, "c": 2}}, {"a": {"b": 1, "c": 2}}) is None
    assert config_difference({"a": {"b": 1}}, {"a": {"b": 2}}) == "a.b: stored 1, now 2"


def test_verdict_against_the_stored_reference_flags_three_std_not_one():
    reference = pd.DataFrame({"label": ["a", "b", "c"], "final_val_loss": [4.0, 4.0, 4.0],
                              "final_val_loss_std": [0.1, 0.1, math.nan], "seeds": [3, 3, 1]})
    ours = pd.DataFrame({"label": ["a", "b", "c", "d"], "final_val_loss": [4.3, 3.9, 4.0, 4.0], "seeds": [1, 1, 1, 1]})
    verdicts = compare_to_reference(ours, reference).set_index("label")
    assert verdicts.loc["a", "verdict"] == "OUTSIDE 2 std" and verdicts.loc["a", "distance (std)"] == pytest.approx(3)
    assert verdicts.loc["b", "verdict"] == "within 2 std" and verdicts.loc["b", "distance (std)"] == pytest.approx(1)
    assert verdicts.loc["c", "verdict"] == "no stored spread"
    assert verdicts.loc["d", "verdict"] == "no stored row"
    assert within_reference(4.3, 4.0, 0.1) is False and within_reference(3.9, 4.0, 0.1) is True


def test_sample_std_over_seeds():
    assert sample_std([1.0, 2.0, 3.0]) == pytest.approx(1.0) and math.isnan(sample_std([1.0]))


def test_wall_clock_model_and_steps_to_a_target():
    # 1 MB at 8 Gbit/s takes 1 ms; 3 collectives of 50 us
    assert step_time(0.2, 1e6, 3, 8.0, 50e-6) == pytest.approx(0.2 + 1e-3 + 150e-6)
    steps, losses = [0, 10, 20, 30], [8.0, 6.0, 5.0, 4.0]
    assert steps_to_reach(steps, losses, 5.5) == pytest.approx(15.0)
    assert steps_to_reach(steps, losses, 9.0) == 0.0
    assert steps_to_reach(steps, losses, 4.0) == 30.0
    assert math.isnan(steps_to_reach(steps, losses, 3.0))



def test_crossover_rate_equalizes_the_modeled_times_to_the_target():
    a, b = (200.0, 0.3, 3e5, 0.1), (100.0, 0.35, 8e6, 1.0)  # steps, compute s, bytes, collectives per step

    def time_to_target(method, mbit):
        steps, compute, sent, collectives = method
        return steps * step_time(compute, sent, collectives, mbit / 1e3, 1e-3)
    rate = crossover_rate_mbit(*a, *b, 1e-3)
    assert time_to_target(a, rate) == pytest.approx(time_to_target(b, rate))
    assert time_to_target(a, 0.9 * rate) < time_to_target(b, 0.9 * rate)
    assert time_to_target(a, 1.1 * rate) > time_to_target(b, 1.1 * rate)
    assert crossover_rate_mbit(100.0, 0.3, 3e5, 0.1, *b, 1e-3) == math.inf  # first at every rate
    assert crossover_rate_mbit(*b, 100.0, 0.3, 3e5, 0.1, 1e-3) == 0.0  # first at none
    assert math.isnan(crossover_rate_mbit(100.0, 0.3, 9e6, 1.0, 300.0, 0.3, 3e5, 1.0, 1e-3))  # first only above
    assert compute_seconds(1e8, 1e4, 6e12) == pytest.approx(1.0)  # 6 N T FLOPs

def committed_tables() -> list[tuple[str, str]]:
    return sorted((p.parent.parent.name, p.parent.name) for p in (ROOT / "results").glob("*/*/table.csv"))


def test_every_committed_table_row_traces_to_committed_runs(monkeypatch):
    """Every results/<name>/<preset>/table.csv comes from experiments/<name>/ and every row from its stored runs."""
    monkeypatch.chdir(ROOT)  # stored configs name results/ relative to the repository
    for name, preset in committed_tables():
        config = ROOT / "experiments" / name / "config.yaml"
        assert config.exists(), f"results/{name}/{preset}/table.csv has no experiment config {config}"
        assert provenance_problems(config, preset, ResultsStore(Path("results"))) == [], f"results/{name}/{preset}"


def test_progress_lines_name_the_run_and_estimate_the_rest(capsys, monkeypatch):
    clock = iter([100.0, 160.0, 200.0, 290.0])
    monkeypatch.setattr(experiment.time, "time", lambda: next(clock))
    progress = experiment.Progress("demo/cpu", total=4, to_train=3)
    a, b = (experiment.GridRun(label, label, None, 0, ()) for label in ("ddp", "lordo"))
    progress.start(1, a, "not run yet")
    progress.finish(1, a, {"final_val_loss": 4.25})
    progress.start(2, b, "not run yet")
    progress.finish(2, b, {"final_val_loss": 4.5})
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "[demo/cpu] 1/4 ddp seed 0: started (not run yet)"
    assert lines[1] == "[demo/cpu] 1/4 ddp seed 0: done in 1m00s, validation loss 4.2500; 2 to go, ETA 2m00s"
    assert lines[3].endswith("done in 1m30s, validation loss 4.5000; 1 to go, ETA 1m15s")  # mean of 60 s and 90 s


def store_source(spec, run, source: Path, record: dict) -> None:
    """A complete run of `run`'s config stored at `source`, as another experiment would have left it."""
    same = OmegaConf.to_container(resolved_config(spec, run, source.parent))
    same["run"]["name"] = source.name
    write_run(source, same, record)


def stub_training(monkeypatch) -> list[str]:
    """The runner with training and tables stubbed out; returns the list of the run names it trains."""
    trained = []

    def train(cfg):
        trained.append(cfg.run.name)
        write_run(Path(cfg.run.out_dir) / cfg.run.name, cfg, {"status": "complete", "final_val_loss": 4.5})

    monkeypatch.setattr(experiment, "train", train)
    monkeypatch.setattr(experiment, "RunResult", type("Loaded", (), {"read": staticmethod(lambda *place: place[-1])}))
    monkeypatch.setattr(experiment, "build_tables", lambda params, results: results)
    monkeypatch.setattr(experiment, "write_tables", lambda tables, params, out_dir: None)
    return trained


def test_same_commit_reuses_and_copies_only_runs_of_this_commit(spec_path, tmp_path, monkeypatch):
    spec = load_spec(spec_path)
    run = experiment_grid(spec, "smoke")[0]
    out = tmp_path / "results"
    store_source(spec, run, out / "other" / "claim" / "runs" / "lordo-s0", {"status": "complete", "git_commit": "old"})
    trained = stub_training(monkeypatch)
    monkeypatch.setattr(experiment, "git_commit", lambda: "new")
    experiment.run_experiment(spec_path, "smoke", ResultsStore(out), same_commit=True)
    assert trained == [run.name]  # the other experiment's run is of another commit: trained here, not copied
    here = out / "demo" / "smoke" / "runs" / run.name
    (here / "record.json").write_text(json.dumps({"status": "complete", "git_commit": "new"}))
    experiment.run_experiment(spec_path, "smoke", ResultsStore(out), same_commit=True)
    assert trained == [run.name]  # resumed at the same commit: reused
    monkeypatch.setattr(experiment, "git_commit", lambda: "newer")
    experiment.run_experiment(spec_path, "smoke", ResultsStore(out), same_commit=True)
    assert trained == [run.name, run.name]
    monkeypatch.setattr(experiment, "git_commit", lambda: "newer-dirty")
    with pytest.raises(ConfigError, match="--same-commit needs a clean git checkout"):
        experiment.run_experiment(spec_path, "smoke", ResultsStore(out), same_commit=True)


def test_a_run_another_experiment_already_trained_is_copied_not_retrained(spec_path, tmp_path, monkeypatch):
    spec = load_spec(spec_path)
    run = experiment_grid(spec, "smoke")[0]
    out = tmp_path / "results"
    source = out / "other" / "claim" / "runs" / "lordo-s0"
    store_source(spec, run, source, {"status": "complete", "final_val_loss": 4.0})
    trained = stub_training(monkeypatch)
    experiment.run_experiment(spec_path, "smoke", ResultsStore(out))
    copied = out / "demo" / "smoke" / "runs" / run.name
    assert trained == [] and OmegaConf.load(copied / "config.yaml").run.name == run.name
    assert json.loads((copied / "record.json").read_text()) == {"status": "complete", "final_val_loss": 4.0,
                                                                 "copied_from": "other/claim/runs/lordo-s0"}
    assert stale_reason(copied, resolved_config(spec, run, copied.parent)) is None  # reused from now on
    experiment.run_experiment(spec_path, "smoke", ResultsStore(out), force=True)  # --force trains it anew
    assert trained == [run.name]
    other = resolved_config(spec, experiment_grid(spec, "smoke", extra=["optim.lr=5e-3"])[0], source.parent)
    OmegaConf.save(other, source / "config.yaml")
    shutil.rmtree(copied)
    experiment.run_experiment(spec_path, "smoke", ResultsStore(out))  # a different config is trained, not copied
    assert trained == [run.name, run.name] and "copied_from" not in json.loads((copied / "record.json").read_text())


def test_given_labels_print_their_table_and_leave_the_presets_stored_tables_alone(spec_path, tmp_path, monkeypatch,
                                                                                   capsys):
    trained = stub_training(monkeypatch)
    written = []
    monkeypatch.setattr(experiment, "write_tables", lambda tables, params, out_dir: written.append(tables))
    monkeypatch.setattr(experiment, "markdown", lambda tables, params: f"rows {[r.name for r in tables]}")
    experiment.run_experiment(spec_path, "cpu", ResultsStore(tmp_path), labels=["lordo_local"])
    assert written == [] and capsys.readouterr().out.splitlines()[-1] == f"rows {trained}"
    experiment.run_experiment(spec_path, "cpu", ResultsStore(tmp_path))
    assert len(written) == 1 and len(written[0]) == len(experiment_grid(load_spec(spec_path), "cpu"))


@pytest.mark.parametrize("source_has, copied", [
    ({}, False),  # neither scores nor model: the experiment could not score it, so it is trained
    ({"downstream": {"heldout_passage_ending": {"acc": 0.5}}}, True),
    ({"model.pt": True}, True),
])
def test_a_run_is_copied_only_where_the_experiments_downstream_tasks_can_be_scored(spec_path, tmp_path, monkeypatch,
                                                                                   source_has, copied):
    spec_path.write_text(SPEC + "downstream: [heldout_passage_ending]\n")
    spec = load_spec(spec_path)
    run = experiment_grid(spec, "smoke")[0]
    out = tmp_path / "results"
    source = out / "lr_sweep" / "cpu" / "runs" / "lordo-s0"
    store_source(spec, run, source, {"status": "complete", "final_val_loss": 4.0,
                                     **({"downstream": source_has["downstream"]} if "downstream" in source_has else {})})
    if "model.pt" in source_has:
        (source / "model.pt").write_bytes(b"")
    trained, scored = stub_training(monkeypatch), []
    monkeypatch.setattr(experiment, "evaluate_downstream", lambda run_dir, tasks: scored.append((run_dir.name, tasks)))
    experiment.run_experiment(spec_path, "smoke", ResultsStore(out))
    record = json.loads((out / "demo" / "smoke" / "runs" / run.name / "record.json").read_text())
    assert ("copied_from" in record) == copied and trained == ([] if copied else [run.name])
    assert scored == [(run.name, ["heldout_passage_ending"])]
