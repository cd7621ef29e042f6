"""ExperimentSpec: every experiment config parses into a frozen, typed spec once; a bad one is named by file and
key before anything runs."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from lowcomm.config import ConfigError
from lowcomm.repro.spec import (
    ExperimentSpec,
    TuningSpec,
    Where,
    experiments,
    load_spec,
    make_rules,
    reported,
    tuning_sweep,
)

ROOT = Path(__file__).resolve().parents[2]
GOOD = """
name: demo
base: experiments/base.yaml
presets:
  cpu: {seeds: [0, 1], overrides: [train.steps=8], run_sweep: {b: [2]}, table: {kind: sweep, show: [rank]},
        figure: choice}
sweep: {key: optim.rank, values: [4, 8], tag: r}
runs:
  - {label: a, overrides: [method=lordo]}
  - {label: b, overrides: [method=lordo_local, optim.lr=1e-3], seeds: 1, sweep_overrides: {2: [optim.omega=0.5]}}
table: {kind: methods, baselines: [a], compact: [label, seeds]}
report: {order: 3, mirrors: "a demo", figure: loss}
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "demo" / "config.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    return path


def test_a_config_parses_into_a_frozen_typed_spec(tmp_path):
    spec = load_spec(write(tmp_path, GOOD))
    assert spec.readme == tmp_path / "demo" / "README.md" and spec.report.target == "demo" and spec.report.in_all
    assert [run.method for run in spec.runs] == ["lordo", "lordo_local"] and spec.run("b").seeds == 1
    assert spec.run("b").sweep_overrides == {"2": ("optim.omega=0.5",)}
    cpu = spec.preset("cpu")
    assert (cpu.seeds, cpu.overrides, cpu.run_sweep["b"]) == ((0, 1), ("train.steps=8",), (2,))
    assert spec.table_of("cpu").kind == "sweep" and spec.table_of("cpu").show == ("rank",)
    without = dataclasses.replace(spec, presets={"cpu": dataclasses.replace(cpu, figure=None)})
    assert spec.figure_of("cpu") == "choice" and without.figure_of("cpu") == "loss"  # else the report's
    assert spec.table.compact == ("label", "seeds") and spec.table["baselines"] == ["a"] and "baselines" in spec.table
    assert spec.sweep.label("a", 4) == "a_r4"
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.name = "other"
    with pytest.raises(TypeError):
        spec.presets["new"] = cpu
    assert load_spec(tmp_path / "demo" / "config.yaml") is spec  # parsed once


def test_an_edited_config_is_parsed_again(tmp_path):
    path = write(tmp_path, GOOD)
    first = load_spec(path)
    path.write_text(GOOD.replace("order: 3", "order: 4"))
    assert load_spec(path).report.order == 4 and first.report.order == 3


@pytest.mark.parametrize("edit, message", [
    (("basis: x\n", ""), "the top level has unknown key(s) ['basis']"),
    (("runs:\n", "table2: {}\nruns:\n"), "the top level has unknown key(s) ['table2']"),
    (("overrides: [method=lordo]}", "overrides: method=lordo}"), "runs[0].overrides must be a list of key=value"),
    (("seeds: 1,", "seed: 1,"), "runs[1] has unknown key(s) ['seed']"),
    (("run_sweep: {b: [2]}", "run_sweep: {c: [2]}"), "presets.cpu names labels ['c'] that no run has"),
    (("table: {kind: sweep, show: [rank]}", "tables: {}"), "presets.cpu has unknown key(s) ['tables']"),
    (("table: {kind: methods,", "table: {"), "table must be a mapping with a `kind`"),
    (("tag: r}", "}"), "sweep lacks ['tag']"),
    (('mirrors: "a demo", ', ""), "report lacks ['mirrors']"),
    (("- {label: b,", "- {label: a,"), "runs name ['a'] more than once"),
])
def test_a_bad_config_is_named_by_file_and_key(tmp_path, edit, message):
    old, new = edit
    text = GOOD.replace(old, new) if old != "basis: x\n" else GOOD + old
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load_spec(path)
    assert str(err.value).startswith(f"{path}: ") and message in str(err.value), str(err.value)


def test_an_undefined_preset_lists_the_defined_ones(tmp_path):
    with pytest.raises(ConfigError, match=r"preset 'paper' is not defined in demo: choose one of \['cpu'\]"):
        load_spec(write(tmp_path, GOOD)).preset("paper")


def test_every_experiment_folder_parses_and_the_index_follows_its_order():
    specs = experiments(ROOT / "experiments")
    assert {s.config.parent.name for s in specs} == {p.parent.name for p in (ROOT / "experiments").glob("*/config.yaml")
                                                     if p.parent.name != "train"}
    assert all(isinstance(s, ExperimentSpec) and s.name == s.config.parent.name for s in specs)
    orders = [s.report.order for s in reported(ROOT / "experiments").values()]
    assert orders == sorted(orders)
    assert tuning_sweep(ROOT / "experiments").tuning.stages[0] == "cpu"


def test_the_makefile_targets_come_from_the_specs():
    specs = reported(ROOT / "experiments")
    rules = make_rules(specs)
    defined = next(line for line in rules.splitlines() if line.startswith("DEFINED := ")).split()[2:]
    assert defined == list(specs)
    assert "table3: PRESET = quick\ntable3: table3_main" in rules  # report.make and make_preset
    sweep = tuning_sweep(ROOT / "experiments")
    stages = [line.split()[4] for line in rules.split(f"{sweep.name}: install\n")[1].split("\n\n")[0].splitlines()
              if "lowcomm.repro.experiment" in line]
    assert stages == list(sweep.tuning.stages) + list(sweep.tuning.horizon_stages)


def test_a_horizon_stage_runs_after_the_stages_and_may_not_be_one_of_them():
    spec = TuningSpec.parse({"stages": ["cpu", "claim"], "nonmatrix_lr_from": "ddp", "horizon_stages": ["short"]},
                            Where(Path("x.yaml")))
    assert spec.every_stage == ("cpu", "claim", "short")
    with pytest.raises(ConfigError, match=r"horizon_stages names \['claim'\], which `stages` names too"):
        TuningSpec.parse({"stages": ["cpu", "claim"], "nonmatrix_lr_from": "ddp", "horizon_stages": ["claim"]},
                         Where(Path("x.yaml")))
