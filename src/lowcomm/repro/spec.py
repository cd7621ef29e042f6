"""An experiment, parsed once: `experiments/<name>/config.yaml` as a frozen, typed `ExperimentSpec` (runs, presets,
sweep, table, report entry). A config error names the file and the key, and the keys that are valid there.

    name: <folder under the results root>
    base: <training config file every run starts from>
    presets: {<preset>: {seeds: [...], overrides: [key=value, ...],
                         labels: [<label>, ...],              # optional: only these runs
                         sweep: [...],                        # optional: this preset's sweep values
                         sweep_overrides: {<value>: [...]},   # optional: extra overrides at one sweep value
                         run_overrides: {<label>: [...]},     # optional: extra overrides of one run
                         method_overrides: {<method>: [...]}, # optional: the defaults of every run of a method
                                                              # here (its runs' own overrides win)
                         run_sweep: {<label>: [...]},         # optional: one run's sweep values in this preset
                         run_seeds: {<label>: [...]},         # optional: one run's seeds in this preset
                         tuned: [lr, adamw_lr],               # optional: lrs from experiments/tuned_lr.yaml
                         tuned_from: <version>,               # optional: from experiments/tuned_lr_<version>.yaml,
                                                              # an earlier protocol's choice its runs were made at
                         table: {kind: ..., ...},             # optional: this preset's table instead
                         figure: <figures kind>}}             # optional: this preset's figure instead
    runs: [{label: <row name>, overrides: [key=value, ...], seeds: <at most this many of the seeds>,
            sweep: [...], sweep_overrides: {<value>: [...]},  # optional: this run's values, its overrides
            data_seed: <int>}, ...]                          # optional: the data order of this seed, whatever the
                                                             # run's seed (which then sets the initialization only)
    sweep: {key: <config key>, values: [...], tag: <label suffix>}   # optional: every run at every value
    keep_diverged: true                                              # optional: a diverged run is a result
    tuning: {stages: [<preset>, ...], nonmatrix_lr_from: <method>,   # optional: the lr protocol's sweep
             horizon_stages: [<preset>, ...]}                        # optional: stages whose choice holds only at
                                                                     # their own horizon
    table: {kind: <lowcomm.repro.tables kind>, show: [<column>, ...], compact: [<column>, ...], ...}
                                                                     # the kind and its parameters; `show` adds
                                                                     # columns to table.md, `compact` replaces the
                                                                     # kind's printed view
    downstream: [<lm-eval task>, ...]                                # optional: scored into each run's record
    report: {order: <place in the index>, mirrors: <paper table or question>, figure: <figures kind>,
             make: <make target, default the name>, make_preset: <the preset `make <make>` runs, default PRESET>,
             in_all: <run by `make experiments`, default true>,
             extra_tables: [{table: <stem under results/<name>/>, title: ..., command: ...}]}   # optional
    claims: [...]                                                    # the paper claims it tests (lowcomm.repro.judge)
"""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from omegaconf import OmegaConf

from lowcomm.config import ConfigError, load_yaml
from lowcomm.paths import EXPERIMENTS
from lowcomm.repro.judge import ClaimSpec, parse_claims

Overrides = tuple[str, ...]


def frozen_map(mapping: Mapping) -> Mapping:
    return MappingProxyType(dict(mapping))


@dataclass(frozen=True)
class Where:
    """A place in an experiment config, for errors: the file and the dotted key."""

    path: Path
    key: str = ""

    def __truediv__(self, key: Any) -> "Where":
        return Where(self.path, f"{self.key}.{key}" if self.key else str(key))

    def error(self, problem: str) -> ConfigError:
        return ConfigError(f"{self.path}: {self.key or 'the top level'} {problem}")


def checked_keys(tree: Any, where: Where, allowed: set[str], required: set[str] = frozenset()) -> Mapping:
    """`tree` as a mapping holding only `allowed` keys and every `required` one; a ConfigError names the others."""
    if not isinstance(tree, Mapping):
        raise where.error(f"is a {type(tree).__name__}, not a mapping of {sorted(allowed)}")
    unknown, missing = sorted(set(tree) - allowed), sorted(required - set(tree))
    if unknown:
        raise where.error(f"has unknown key(s) {unknown}; valid keys: {sorted(allowed)}")
    if missing:
        raise where.error(f"lacks {missing}")
    return tree


def overrides(items: Any, where: Where) -> Overrides:
    """A list of `key=value` overrides."""
    if not isinstance(items, list) or not all(isinstance(i, str) and "=" in i for i in items):
        raise where.error(f"must be a list of key=value strings, got {items!r}")
    return tuple(items)


def values(items: Any, where: Where) -> tuple:
    if not isinstance(items, list):
        raise where.error(f"must be a list, got {items!r}")
    return tuple(items)


def overrides_by(tree: Any, where: Where) -> Mapping[str, Overrides]:
    """{key: overrides}, keys as strings (a sweep value 0.7 is the key '0.7')."""
    if not isinstance(tree, Mapping):
        raise where.error(f"must be a mapping of lists of key=value strings, got {tree!r}")
    return frozen_map({str(k): overrides(v, where / k) for k, v in tree.items()})


@dataclass(frozen=True)
class SweepSpec:
    """One config key swept over values; a swept run's label gets `_<tag><value>`."""

    key: str
    tag: str
    values: tuple = ()

    @classmethod
    def parse(cls, tree: Any, where: Where) -> "SweepSpec":
        tree = checked_keys(tree, where, {"key", "tag", "values"}, {"key", "tag"})
        return cls(str(tree["key"]), str(tree["tag"]), values(tree.get("values", []), where / "values"))

    def label(self, label: str, value: Any) -> str:
        return f"{label}_{self.tag}{value}"


@dataclass(frozen=True)
class RunSpec:
    """One row of the experiment: a label, its overrides, and optionally its own seeds cap, sweep and data seed."""

    label: str
    overrides: Overrides
    seeds: int | None = None
    sweep: tuple | None = None
    sweep_overrides: Mapping[str, Overrides] = field(default_factory=lambda: frozen_map({}))
    data_seed: int | None = None

    KEYS = {"label", "overrides", "seeds", "sweep", "sweep_overrides", "data_seed"}

    @classmethod
    def parse(cls, tree: Any, where: Where) -> "RunSpec":
        tree = checked_keys(tree, where, cls.KEYS, {"label", "overrides"})
        sweep = tree.get("sweep")
        return cls(str(tree["label"]), overrides(tree["overrides"], where / "overrides"),
                   None if tree.get("seeds") is None else int(tree["seeds"]),
                   None if sweep is None else values(sweep, where / "sweep"),
                   overrides_by(tree.get("sweep_overrides", {}), where / "sweep_overrides"),
                   None if tree.get("data_seed") is None else int(tree["data_seed"]))

    @property
    def method(self) -> str | None:
        """The method preset the run's overrides name (the last `method=`), or None."""
        named = [item.split("=", 1)[1] for item in self.overrides if item.startswith("method=")]
        return named[-1] if named else None


@dataclass(frozen=True)
class TableSpec:
    """The table kind (lowcomm.repro.tables), the columns table.md adds to the kind's (`show`), the printed view
    (`compact`, the kind's own when empty) and the kind's parameters."""

    kind: str
    show: tuple[str, ...] = ()
    compact: tuple[str, ...] = ()
    params: Mapping[str, Any] = field(default_factory=lambda: frozen_map({}))

    @classmethod
    def parse(cls, tree: Any, where: Where = Where(Path("<table spec>"))) -> "TableSpec":
        if not isinstance(tree, Mapping) or "kind" not in tree:
            raise where.error(f"must be a mapping with a `kind`, got {tree!r}")
        rest = {k: v for k, v in tree.items() if k not in ("kind", "show", "compact")}
        return cls(str(tree["kind"]), tuple(values(tree.get("show", []), where / "show")),
                   tuple(values(tree.get("compact", []), where / "compact")), frozen_map(rest))

    def get(self, key: str, default: Any = None) -> Any:
        return self.params.get(key, default)

    def __getitem__(self, key: str) -> Any:
        return self.params[key]

    def __contains__(self, key: str) -> bool:
        return key in self.params


@dataclass(frozen=True)
class PresetSpec:
    """A preset: its seeds and overrides, which runs and sweep values it trains, and where its lrs come from."""

    name: str
    seeds: tuple[int, ...] = ()
    overrides: Overrides = ()
    labels: tuple[str, ...] | None = None
    sweep: tuple | None = None
    sweep_overrides: Mapping[str, Overrides] = field(default_factory=lambda: frozen_map({}))
    run_overrides: Mapping[str, Overrides] = field(default_factory=lambda: frozen_map({}))
    method_overrides: Mapping[str, Overrides] = field(default_factory=lambda: frozen_map({}))
    run_sweep: Mapping[str, tuple] = field(default_factory=lambda: frozen_map({}))
    run_seeds: Mapping[str, tuple[int, ...]] = field(default_factory=lambda: frozen_map({}))
    tuned: tuple[str, ...] = ()
    tuned_from: str | None = None
    table: TableSpec | None = None
    figure: str | None = None

    KEYS = {"seeds", "overrides", "labels", "sweep", "sweep_overrides", "run_overrides", "method_overrides",
            "run_sweep", "run_seeds", "tuned", "tuned_from", "table", "figure"}

    @classmethod
    def parse(cls, name: str, tree: Any, where: Where) -> "PresetSpec":
        tree = checked_keys(tree or {}, where, cls.KEYS)
        sweep, labels = tree.get("sweep"), tree.get("labels")
        run_sweep, run_seeds = tree.get("run_sweep", {}), tree.get("run_seeds", {})
        for key, mapping in (("run_sweep", run_sweep), ("run_seeds", run_seeds)):
            if not isinstance(mapping, Mapping):
                raise (where / key).error(f"must be a mapping of label -> values, got {mapping!r}")
        if "tuned_from" in tree and not tree.get("tuned"):
            raise (where / "tuned_from").error("names the tuned file of a preset that takes no tuned lr: list what it "
                                               "takes in `tuned`, or leave tuned_from out")
        return cls(name, tuple(int(s) for s in values(tree.get("seeds", []), where / "seeds")),
                   overrides(tree.get("overrides", []), where / "overrides"),
                   None if labels is None else tuple(values(labels, where / "labels")),
                   None if sweep is None else values(sweep, where / "sweep"),
                   overrides_by(tree.get("sweep_overrides", {}), where / "sweep_overrides"),
                   overrides_by(tree.get("run_overrides", {}), where / "run_overrides"),
                   overrides_by(tree.get("method_overrides", {}), where / "method_overrides"),
                   frozen_map({k: values(v, where / "run_sweep" / k) for k, v in run_sweep.items()}),
                   frozen_map({k: tuple(int(s) for s in values(v, where / "run_seeds" / k))
                               for k, v in run_seeds.items()}),
                   tuple(values(tree.get("tuned", []), where / "tuned")),
                   None if tree.get("tuned_from") is None else str(tree["tuned_from"]),
                   None if tree.get("table") is None else TableSpec.parse(tree["table"], where / "table"),
                   None if tree.get("figure") is None else str(tree["figure"]))

    def named_labels(self) -> set[str]:
        """Every run label the preset names (labels, run_overrides, run_sweep, run_seeds)."""
        return set(self.labels or ()) | set(self.run_overrides) | set(self.run_sweep) | set(self.run_seeds)


@dataclass(frozen=True)
class ExtraTable:
    """An experiment-wide table its README section shows: <results>/<experiment>/<table>.md, with a title and the
    command that writes it."""

    table: str
    title: str
    command: str

    @classmethod
    def parse(cls, tree: Any, where: Where) -> "ExtraTable":
        keys = {"table", "title", "command"}
        tree = checked_keys(tree, where, keys, keys)
        return cls(str(tree["table"]), str(tree["title"]), str(tree["command"]))


@dataclass(frozen=True)
class ReportSpec:
    """The experiment's entry in the README index and the report: its order, what it mirrors, its figure kind,
    its make target, whether `make experiments` runs it, and the experiment-wide tables its README shows."""

    order: int
    mirrors: str
    figure: str
    target: str
    in_all: bool = True
    extra_tables: tuple[ExtraTable, ...] = ()
    make_preset: str | None = None

    KEYS = {"order", "mirrors", "figure", "make", "in_all", "extra_tables", "make_preset"}

    @classmethod
    def parse(cls, name: str, tree: Any, where: Where) -> "ReportSpec":
        tree = checked_keys(tree, where, cls.KEYS, {"order", "mirrors", "figure"})
        extra = values(tree.get("extra_tables", []), where / "extra_tables")
        return cls(int(tree["order"]), str(tree["mirrors"]), str(tree["figure"]), str(tree.get("make", name)),
                   bool(tree.get("in_all", True)),
                   tuple(ExtraTable.parse(e, where / f"extra_tables[{i}]") for i, e in enumerate(extra)),
                   tree.get("make_preset"))


@dataclass(frozen=True)
class TuningSpec:
    """The lr protocol's sweep (lowcomm.repro.tuning): its presets in order (a later stage's choice replaces an
    earlier one's), the method whose tuned lr is the non-matrix lr (`adamw_lr`) of the Muon and Dion rows, and the
    stages whose choice serves only the runs at their own horizon (replacing nothing)."""

    stages: tuple[str, ...]
    nonmatrix_lr_from: str
    horizon_stages: tuple[str, ...] = ()

    @classmethod
    def parse(cls, tree: Any, where: Where) -> "TuningSpec":
        tree = checked_keys(tree, where, {"stages", "nonmatrix_lr_from", "horizon_stages"},
                            {"stages", "nonmatrix_lr_from"})
        stages = tuple(values(tree["stages"], where / "stages"))
        horizon_stages = tuple(values(tree.get("horizon_stages", []), where / "horizon_stages"))
        both = sorted(set(stages) & set(horizon_stages))
        if both:
            raise (where / "horizon_stages").error(f"names {both}, which `stages` names too: list a stage in one")
        return cls(stages, str(tree["nonmatrix_lr_from"]), horizon_stages)

    @property
    def every_stage(self) -> tuple[str, ...]:
        """The stages in the order they run: `stages`, then `horizon_stages`."""
        return self.stages + self.horizon_stages


@dataclass(frozen=True)
class ExperimentSpec:
    """One experiment: what it runs (runs x sweep values x seeds per preset), how its table is built, and its
    report entry (None: an experiment the index and the report leave out)."""

    name: str
    config: Path
    base: Path
    runs: tuple[RunSpec, ...]
    presets: Mapping[str, PresetSpec]
    table: TableSpec
    sweep: SweepSpec | None = None
    downstream: tuple[str, ...] = ()
    keep_diverged: bool = False
    report: ReportSpec | None = None
    tuning: TuningSpec | None = None
    claims: tuple[ClaimSpec, ...] = ()

    KEYS = {"name", "base", "presets", "runs", "sweep", "table", "downstream", "keep_diverged", "report", "tuning",
            "claims"}

    @property
    def folder(self) -> Path:
        return self.config.parent

    @property
    def readme(self) -> Path:
        return self.folder / "README.md"

    def preset(self, name: str) -> PresetSpec:
        """The preset `name`; a ConfigError lists the defined ones."""
        if name not in self.presets:
            raise ConfigError(f"preset {name!r} is not defined in {self.name}: choose one of {sorted(self.presets)}")
        return self.presets[name]

    def table_of(self, preset: str) -> TableSpec:
        """The table the preset's results are built into: its own, else the experiment's."""
        return self.preset(preset).table or self.table

    def figure_of(self, preset: str) -> str | None:
        """The figure kind of the preset's results: its own, else the experiment's (None without a report entry)."""
        return self.preset(preset).figure or (self.report.figure if self.report else None)

    def run(self, label: str) -> RunSpec:
        return next(run for run in self.runs if run.label == label)


def parse_spec(path: Path, tree: Any) -> ExperimentSpec:
    """The ExperimentSpec of the config tree read from `path`; a ConfigError names the file and key of a problem."""
    top = Where(path)
    tree = checked_keys(tree, top, ExperimentSpec.KEYS, {"name", "base", "runs", "table"})
    runs = tuple(RunSpec.parse(run, top / f"runs[{i}]") for i, run in enumerate(values(tree["runs"], top / "runs")))
    labels = [run.label for run in runs]
    repeated = sorted({label for label in labels if labels.count(label) > 1})
    if repeated:
        raise (top / "runs").error(f"name {repeated} more than once (each label is one run directory per seed): "
                                   "give every run its own label")
    presets_tree = tree.get("presets") or {}
    presets = {str(k): PresetSpec.parse(str(k), v, top / "presets" / k) for k, v in presets_tree.items()}
    for preset in presets.values():
        missing = sorted(preset.named_labels() - set(labels))
        if missing:
            raise (top / "presets" / preset.name).error(f"names labels {missing} that no run has; runs: {labels}")
        methods = {run.method for run in runs if preset.labels is None or run.label in preset.labels}
        unused = sorted(set(preset.method_overrides) - methods)
        if unused:
            raise (top / "presets" / preset.name / "method_overrides").error(
                f"names methods {unused} that none of the preset's runs has; its methods: {sorted(map(str, methods))}")
    name = str(tree["name"])
    return ExperimentSpec(
        name, path, Path(tree["base"]), runs, frozen_map(presets), TableSpec.parse(tree["table"], top / "table"),
        None if tree.get("sweep") is None else SweepSpec.parse(tree["sweep"], top / "sweep"),
        tuple(values(tree.get("downstream", []), top / "downstream")), bool(tree.get("keep_diverged", False)),
        None if tree.get("report") is None else ReportSpec.parse(name, tree["report"], top / "report"),
        None if tree.get("tuning") is None else TuningSpec.parse(tree["tuning"], top / "tuning"),
        parse_claims(tree.get("claims", []), str(path)))


@functools.cache
def _tree(path: Path, text: str) -> dict:
    """The config file's tree, read once per content."""
    return OmegaConf.to_container(load_yaml(path))


@functools.cache
def _parsed(path: Path, text: str) -> ExperimentSpec:
    return parse_spec(path, _tree(path, text))


def load_spec(path: str | Path) -> ExperimentSpec:
    """The experiment config at `path`, parsed once per process and content of the file."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"experiment config {path} does not exist")
    return _parsed(path, path.read_text())


def experiments(root: Path = EXPERIMENTS) -> list[ExperimentSpec]:
    """Every experiment under `root` (a folder whose config.yaml lists `runs`; a training config has none), by
    name."""
    configs = sorted(root.glob("*/config.yaml"))
    return [load_spec(p) for p in configs if "runs" in _tree(p, p.read_text())]


def tuning_sweep(root: Path = EXPERIMENTS) -> ExperimentSpec:
    """The one experiment with a `tuning` section: the lr protocol's sweep."""
    found = [s for s in experiments(root) if s.tuning]
    if len(found) != 1:
        raise ConfigError(f"{len(found)} experiments under {root} have a `tuning` section "
                          f"({[s.name for s in found]}): exactly one is the lr sweep")
    return found[0]


def reported(root: Path = EXPERIMENTS) -> dict[str, ExperimentSpec]:
    """name -> spec of every experiment with a report entry, in index order."""
    ordered = sorted((s for s in experiments(root) if s.report), key=lambda s: (s.report.order, s.name))
    return {s.name: s for s in ordered}


def make_rules(specs: dict[str, ExperimentSpec]) -> str:
    """The Makefile's experiment targets (`python -m lowcomm.repro.spec --make`): DEFINED and EXPERIMENTS (those
    `make experiments` runs), a target per experiment running $(PRESET) through `run_experiment`, or, for the lr sweep,
    each of its stages followed by `make tune`; a `make` name other than the experiment's is an alias that runs its
    `make_preset`."""
    lines = ["# Generated by `python -m lowcomm.repro.spec --make` from experiments/*/config.yaml; do not edit.",
             f"DEFINED := {' '.join(specs)}",
             f"EXPERIMENTS := {' '.join(name for name, s in specs.items() if s.report.in_all)}"]
    for name, spec in specs.items():
        lines += ["", f"{name}: install"]
        if spec.tuning:
            lines += [line for stage in spec.tuning.every_stage for line in (
                f"\t$(PY) -m lowcomm.repro.experiment {spec.config} {stage} --out $(OUT) $(if $(FORCE),--force) "
                "$(if $(SAME_COMMIT),--same-commit)",
                "\t$(MAKE) --no-print-directory tune")]
        else:
            lines.append(f"\t$(call run_experiment,{name})")
        if spec.report.target != name:
            preset = [f"{spec.report.target}: PRESET = {spec.report.make_preset}"] if spec.report.make_preset else []
            lines += [*preset, f"{spec.report.target}: {name}"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m lowcomm.repro.spec",
                                     description="Parse every experiment config (an error names the file and key).")
    parser.add_argument("--make", action="store_true", help="print the Makefile's experiment targets")
    args = parser.parse_args(argv)
    try:
        specs = reported(Path("experiments"))  # the paths as the Makefile, in the repository root, names them
    except ConfigError as err:
        sys.exit(f"error: {err}")
    print(make_rules(specs) if args.make else "\n".join(f"{s.name}: {s.config}" for s in specs.values()), end="")


if __name__ == "__main__":
    main()
