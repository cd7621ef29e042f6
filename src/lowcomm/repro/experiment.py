"""`python -m lowcomm.repro.experiment experiments/<name>/config.yaml [preset] [--out DIR] [--seeds 0,1]
[--labels a,b] [--force] [--tables-only] [key=value ...]`: run an experiment's grid (runs x sweep values x seeds) with
`lowcomm.training.train` into <out>/<name>/<preset>/runs/<label>-s<seed>/, then aggregate the run records into <out>/<name>/<preset>/table.csv
(one row per label; comparisons.csv where the table compares rows) and table.md (with --labels, only those rows,
their table printed and not written). When <out> is not the stored
results/, the table is printed beside the stored reference results/<name>/<preset>/ with a verdict per row.

The experiment config is parsed once into a lowcomm.repro.spec.ExperimentSpec (its format is there); results lie
where lowcomm.repro.store.ResultsStore says.

Every preset starts from the overrides of experiments/presets.yaml for its name. Overrides apply in the order
presets.yaml, preset, tuned lrs, method_overrides, run, sweep value (with the preset's, then the run's
sweep_overrides), run_overrides, command line, seed (`train.seed` and `data.seed`; a run's `data_seed` replaces
the latter). With `tuned`, each run takes its method's tuned peak lr (`lr`; the lr tuned at the run's own horizon
where the file has one) and, where its optimizer has one, the non-matrix lr (`adamw_lr`) from the file `make tune`
writes (lowcomm.repro.tuning.tuned_overrides); the values go into the run's overrides and its stored config.

A run is reused only when its record.json says `status: complete` (or `diverged`, with keep_diverged) and its
stored config.yaml equals the run's resolved config (both on the optimizer's defaults); otherwise (or with --force)
its directory is replaced by a new run. So an interrupted
experiment resumes, and a changed config is rerun, never silently reused. Files that cannot be read follow the rule of
lowcomm.stored: a run with one is trained again, and --tables-only leaves it out. A run to train whose config equals a
complete run of another experiment or preset under <out> (name and place aside: a row of one experiment and the
same config under another label in another) is copied from it instead, its record naming the source (`copied_from`), provided it
holds the scores the experiment's `downstream` tasks need or its model.pt (which results/ does not commit); --force
trains it anew. With --same-commit, only runs whose record names this (clean) checkout's commit are reused or copied:
every run of the preset comes from one commit, and an interrupted preset still resumes. With `downstream`, every run whose
record has no scores for those tasks is evaluated (lowcomm.eval.evaluate.evaluate_run_dir; hub tasks record "needs hub"
when the hub cannot be reached).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
from omegaconf import DictConfig, OmegaConf

from lowcomm.config import ConfigError, load_config, parse_sections, with_defaults
from lowcomm.data import DataUnavailable
from lowcomm.paths import ROOT, SHARED_PRESETS
from lowcomm.repro.stats import within_reference
from lowcomm.repro.spec import ExperimentSpec, PresetSpec, RunSpec, TableSpec, load_spec
from lowcomm.repro.store import (
    ResultsStore,
    RunResult,
    StoredPreset,
    read_run_files,
    read_table,
    run_name,
    seed_of,
)
from lowcomm.repro.tables import (
    build_tables,
    check_table,
    compact_columns,
    downstream_sources,
    markdown,
    table_of_rows,
)
from lowcomm.repro.tuning import horizon_of, tuned_overrides, tuned_path
from lowcomm.stored import RERUN, StoredFileError, counting_skipped, read_config_tree, readable, skip
from lowcomm.training.run_dir import git_commit, read_record
from lowcomm.training.command import RunEnded
from lowcomm.training.train import train
from lowcomm.training.validation import validate


@dataclass(frozen=True)
class GridRun:
    """One training run of an experiment: its table row `label` (the config's run label, plus the sweep tag and
    value when swept), the config's run label `method`, the sweep value, the seed and the overrides."""

    label: str
    method: str
    sweep_value: Any
    seed: int
    overrides: tuple[str, ...]

    @property
    def name(self) -> str:
        return run_name(self.label, self.seed)


def shared_overrides(preset: str) -> list[str]:
    """The overrides every experiment's preset `preset` starts from (experiments/presets.yaml)."""
    return list(OmegaConf.load(SHARED_PRESETS).get(preset, []))


def sweep_values(spec: ExperimentSpec, preset: PresetSpec, run: RunSpec) -> list[Any]:
    """The sweep values of one run: the preset's for that run, else the run's own, else the preset's, else the
    experiment's ([None]: no sweep)."""
    if spec.sweep is None:
        return [None]
    for found in (preset.run_sweep.get(run.label), run.sweep, preset.sweep):
        if found is not None:
            return list(found)
    return list(spec.sweep.values) or [None]


def experiment_grid(spec: ExperimentSpec, preset: str, seeds: list[int] | None = None,
                    extra: list[str] = (), labels: list[str] | None = None) -> list[GridRun]:
    """Every run of `preset`, in config order (runs, then sweep values, then seeds); `seeds` replaces the preset's
    (and its runs' own, `run_seeds`); `labels` keeps only those of the preset's run labels."""
    p = spec.preset(preset)
    given, seeds = seeds is not None, list(p.seeds if seeds is None else seeds)
    if not seeds:
        raise ConfigError(f"{spec.name}: preset {preset} has no seeds: list them in presets.{preset}.seeds "
                          "or give --seeds 0,1")
    own_labels = [run.label for run in spec.runs if p.labels is None or run.label in p.labels]
    unknown = [label for label in labels or () if label not in own_labels]
    if unknown:
        raise ConfigError(f"{spec.name}: preset {preset} has no run labels {unknown}: its labels are {own_labels}")
    runs, tuned_file = [], tuned_path(p.tuned_from)
    for run in spec.runs:
        if run.label not in own_labels or labels is not None and run.label not in labels:
            continue
        for value in sweep_values(spec, p, run):
            swept = () if value is None else (f"{spec.sweep.key}={value}", *p.sweep_overrides.get(str(value), ()),
                                              *run.sweep_overrides.get(str(value), ()))
            label = run.label if value is None else spec.sweep.label(run.label, value)
            head = (*shared_overrides(preset), *p.overrides)
            tail = (*p.method_overrides.get(run.method, ()), *run.overrides, *swept,
                    *p.run_overrides.get(run.label, ()), *extra)
            tuned = tuned_overrides(run.method, list(p.tuned), tuned_file,
                                    lambda: horizon_of(load_config(spec.base, [*head, *tail])))
            data_seed = run.data_seed
            own = seeds if given else list(p.run_seeds.get(run.label, seeds))
            for seed in own[: len(own) if run.seeds is None else run.seeds]:
                overrides = (*head, *tuned, *tail, f"train.seed={seed}",
                             f"data.seed={seed if data_seed is None else data_seed}")
                runs.append(GridRun(label, run.label, value, seed, overrides))
    names = [run.name for run in runs]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ConfigError(f"{spec.name}: preset {preset} trains {twice} more than once (a sweep value listed twice?): "
                          "list each value once")
    return runs


def resolved_config(spec: ExperimentSpec, run: GridRun, runs_dir: Path) -> DictConfig:
    """The full config of `run`, trained into runs_dir/<run.name>/ with the per-step progress line."""
    return load_config(spec.base, [*run.overrides, f"run.out_dir={runs_dir}", f"run.name={run.name}",
                                   "train.progress_bar=false"])


def config_difference(stored: dict, resolved: dict, prefix: str = "") -> str | None:
    """The first key (dotted) whose value differs between two config trees, or None when they are equal."""
    for key in sorted(set(stored) | set(resolved), key=str):
        a, b = stored.get(key, "<absent>"), resolved.get(key, "<absent>")
        if isinstance(a, dict) and isinstance(b, dict):
            found = config_difference(a, b, f"{prefix}{key}.")
            if found:
                return found
        elif a != b:
            return f"{prefix}{key}: stored {a!r}, now {b!r}"
    return None


def with_option_defaults(tree: dict) -> dict:
    """A config tree whose optim and sync sections list every option of their optimizer and sync kind, a key they lack
    at its default (the value the run had): a stored run and a config naming that same value are the same run."""
    sections = parse_sections(tree)
    options = dataclasses.asdict(sections.optim)
    optim = {"name": tree["optim"]["name"], **{k: list(v) if isinstance(v, tuple) else v for k, v in options.items()}}
    return {**tree, "optim": optim, "sync": dataclasses.asdict(sections.sync)}


def comparable(tree: dict) -> dict:
    """A config tree as runs are compared: on the optimizer's and the sync kind's defaults, without run.out_dir and
    run.name (where a run directory lies and what it is called is how it is found, not what was trained: `--out
    results` and `--out /abs/path/results` train the same runs, and so do two experiments' labels for one config)."""
    tree = with_option_defaults(tree)
    return {**tree, "run": {k: v for k, v in tree["run"].items() if k not in ("out_dir", "name")}}


def stored_comparable(run_dir: Path) -> dict:
    """The run's stored config.yaml, on the schema's defaults, as a `comparable` tree."""
    return comparable(with_defaults(read_config_tree(run_dir / "config.yaml", RERUN)))


def stored_config_difference(run_dir: Path, cfg: DictConfig) -> str | None:
    """config_difference between the run's stored config.yaml and `cfg`, as `comparable` trees."""
    return config_difference(stored_comparable(run_dir), comparable(OmegaConf.to_container(cfg)))


def unreadable(run_dir: Path) -> StoredFileError | None:
    """Why the record.json, config.yaml or metrics.csv of a stored run cannot be read (None: they can)."""
    try:
        read_run_files(run_dir)
    except StoredFileError as err:
        return err
    return None


def readable_grid(grid: list[GridRun], runs_dir: Path) -> list[GridRun]:
    """The grid's runs but those stored (with a record.json) with a file that cannot be read, which are skipped
    (lowcomm.stored.skip)."""
    stored = [run for run in grid if (runs_dir / run.name / "record.json").exists()]
    errors = {run.name: err for run in stored if (err := unreadable(runs_dir / run.name))}
    for err in errors.values():
        skip(err)
    return [run for run in grid if run.name not in errors]


def record_problem(run_dir: Path, keep_diverged: bool = False) -> str | None:
    """Why the run stored in `run_dir` cannot stand for any run, whatever its config (None: it is complete); a
    StoredFileError when its record cannot be read."""
    if not (run_dir / "record.json").exists():
        return "not run yet"
    status = read_record(run_dir).get("status")
    if status is None:
        return "its record has no status (written before runs were marked complete)"
    if status != "complete" and not (keep_diverged and status == "diverged"):
        return f"its record says status {status!r}"
    if not (run_dir / "config.yaml").exists():
        return "it has no config.yaml"
    return None


def stale_reason(run_dir: Path, cfg: DictConfig, keep_diverged: bool = False) -> str | None:
    """Why the run stored in `run_dir` cannot stand for the run of `cfg` (None: it can be reused); a run with a file
    that cannot be read is stale, the reason naming the file."""
    try:
        problem = record_problem(run_dir, keep_diverged)
        if problem is not None:
            return problem
        diff = stored_config_difference(run_dir, cfg)
        read_table(run_dir / "metrics.csv", RERUN)
    except StoredFileError as err:
        return f"its {err.path.name}: {err.problem}"
    return f"its config differs ({diff})" if diff else None


def made_elsewhere(run_dir: Path, commit: str) -> str | None:
    """Why the stored run does not come from `commit` (None: its record names it)."""
    made = read_record(run_dir).get("git_commit")
    return None if made == commit else f"it was made at commit {made}, not at this checkout's {commit}"


def this_commit() -> str:
    """The commit of a clean checkout, that every run of a table trained with --same-commit will name."""
    commit = git_commit()
    if commit == "unknown" or commit.endswith("-dirty"):
        raise ConfigError(f"--same-commit needs a clean git checkout to name one commit (this one: {commit}): commit "
                          "or stash the changes, or run from a worktree of the commit (git worktree add)")
    return commit


def scorable(run_dir: Path, tasks: Sequence[str]) -> bool:
    """Whether the run holds scores on every one of `tasks`, or the model.pt to compute them."""
    scored = read_record(run_dir).get("downstream", {})
    return all(t in scored for t in tasks) or (run_dir / "model.pt").exists()


def complete_runs(store: ResultsStore, keep_diverged: bool = False, leave_out: set[Path] = frozenset(),
                  tasks: Sequence[str] = ()) -> dict[Path, dict]:
    """Every run directory of any experiment and preset in the store but `leave_out` that can stand for a run
    (record_problem is None) and be scored on `tasks` (scorable), with its `comparable` config tree; one with a file
    that cannot be read is skipped (lowcomm.stored)."""
    dirs = [d for d in store.run_dirs() if d not in leave_out]

    def reusable(run_dir: Path) -> tuple[Path, dict | None]:
        usable = record_problem(run_dir, keep_diverged) is None and scorable(run_dir, tasks)
        return run_dir, stored_comparable(run_dir) if usable else None

    return {d: tree for d, tree in readable(reusable, dirs) if tree is not None}


def identical_run(stored: dict[Path, dict], cfg: DictConfig) -> Path | None:
    """The first of `stored` (complete_runs) whose config equals `cfg` but for its name and place, or None."""
    tree = comparable(OmegaConf.to_container(cfg))
    return next((d for d, stored_tree in stored.items() if config_difference(stored_tree, tree) is None), None)


def copy_run(source: Path, run_dir: Path, cfg: DictConfig, store: ResultsStore) -> None:
    """The stored run `source` as the run of `cfg` in run_dir: its files, config.yaml written for run_dir's name and
    place, and `copied_from` (source, as the store names it) added to its record."""
    shutil.copytree(source, run_dir)
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg))
    record = read_record(run_dir)
    record["copied_from"] = str(store.relative(source))
    (run_dir / "record.json").write_text(json.dumps(record, indent=2, sort_keys=True, allow_nan=False))


def duration(seconds: float) -> str:
    minutes, secs = divmod(int(round(seconds)), 60)
    return f"{minutes}m{secs:02d}s"


class Progress:
    """One line when a run starts and one when it ends, with the experiment's ETA from the runs finished so far."""

    def __init__(self, experiment: str, total: int, to_train: int):
        self.prefix, self.total, self.left = experiment, total, to_train
        self.finished: list[float] = []
        self.started = 0.0

    def line(self, index: int, run: GridRun, text: str) -> None:
        print(f"[{self.prefix}] {index}/{self.total} {run.label} seed {run.seed}: {text}", flush=True)

    def start(self, index: int, run: GridRun, reason: str) -> None:
        self.started = time.time()
        self.line(index, run, f"started ({reason})")

    def finish(self, index: int, run: GridRun, record: dict) -> None:
        self.finished.append(time.time() - self.started)
        self.left -= 1
        eta = sum(self.finished) / len(self.finished) * self.left
        self.line(index, run, f"done in {duration(self.finished[-1])}, validation loss {record['final_val_loss']:.4f}; "
                              f"{self.left} to go, ETA {duration(eta)}")


def train_into(run_dir: Path, cfg: DictConfig, keep_diverged: bool, index: int, run: GridRun, reason: str,
               progress: Progress) -> None:
    """Train the run of `cfg` into run_dir; a diverged run ends the experiment unless it keeps diverged runs."""
    progress.start(index, run, reason)
    try:
        train(cfg)
    except RunEnded as err:
        if not (keep_diverged and read_record(run_dir).get("status") == "diverged"):
            raise
        progress.line(index, run, f"diverged, kept as a result ({err})")
    else:
        progress.finish(index, run, read_record(run_dir))


def run_experiment(path: str | Path, preset: str = "cpu", store: ResultsStore = ResultsStore(Path("runs")),
                   seeds: list[int] | None = None, force: bool = False, extra: list[str] = (),
                   tables_only: bool = False, same_commit: bool = False,
                   labels: list[str] | None = None) -> StoredPreset:
    """Train every run of the grid that cannot be reused, then write the tables; returns the preset's place in the
    store. With tables_only, nothing trains: the tables are rebuilt from the stored runs (a run with a file that
    cannot be read left out), or a ConfigError names a run that is missing or stale. With same_commit, a run is
    reused or copied only when its record names this checkout's commit (every run of the preset from one commit; a
    preset interrupted part-way resumes at the same commit). `labels` trains only those run labels and prints their
    table instead of writing it: the preset's stored tables are those of all its rows."""
    commit = this_commit() if same_commit else None
    spec = load_spec(path)
    stored = store.preset(spec.name, preset)
    grid = experiment_grid(spec, preset, seeds, list(extra), labels)
    if tables_only:
        grid = readable_grid(grid, stored.runs_dir)
    configs = [resolved_config(spec, run, stored.runs_dir) for run in grid]
    table = spec.table_of(preset) if labels is None else table_of_rows(spec.table_of(preset), labels)
    check_table(table)  # the table spec and every run validated before the first one starts
    for cfg in configs:
        validate(cfg)
    reasons = ["--force" if force else stale_reason(stored.run_dir(run.name), cfg, spec.keep_diverged)
               for run, cfg in zip(grid, configs)]
    if commit is not None:
        reasons = [reason or made_elsewhere(stored.run_dir(run.name), commit) for run, reason in zip(grid, reasons)]
    stale = [(run.name, reason) for run, reason in zip(grid, reasons) if reason is not None]
    if tables_only and stale:
        raise ConfigError(f"--tables-only: {len(stale)} run(s) of {stored.dir} cannot be reused, e.g. {stale[0][0]} "
                          f"({stale[0][1]}): run without --tables-only to train them")
    replaced = {stored.run_dir(name) for name, _ in stale}  # emptied before they are trained again
    tasks = list(spec.downstream)
    complete = complete_runs(store, spec.keep_diverged, replaced, tasks) if stale and not force else {}
    if commit is not None:
        complete = {run_dir: tree for run_dir, tree in complete.items() if made_elsewhere(run_dir, commit) is None}
    sources = [None if reason is None else identical_run(complete, cfg) for cfg, reason in zip(configs, reasons)]
    progress = Progress(f"{spec.name}/{preset}", len(grid), len(stale) - sum(s is not None for s in sources))
    for index, (run, cfg, reason, source) in enumerate(zip(grid, configs, reasons, sources), start=1):
        run_dir = stored.run_dir(run.name)
        if reason is None:
            progress.line(index, run, "reused (complete, same config)")
        else:
            if run_dir.exists():
                shutil.rmtree(run_dir)  # a stale or partial run is replaced whole
            if source is not None:
                copy_run(source, run_dir, cfg, store)
                progress.line(index, run, f"copied from {store.relative(source)} (complete, same config)")
            else:
                train_into(run_dir, cfg, spec.keep_diverged, index, run, reason, progress)
        if not tables_only:
            evaluate_downstream(run_dir, tasks)
    results = readable(lambda run: RunResult.read(run.label, run.method, run.sweep_value, run.seed,
                                                  stored.run_dir(run.name)), grid)
    tables = build_tables(table, results)
    if labels is None:
        write_tables(tables, table, stored.dir)
    else:
        print(markdown(tables, table))
    return stored


def evaluate_downstream(run_dir: Path, tasks: list[str]) -> None:
    """Score the run's model on the tasks its record has no scores for (none: nothing to do)."""
    missing = [t for t in tasks if t not in read_record(run_dir).get("downstream", {})]
    if missing:
        from lowcomm.eval.evaluate import (
            evaluate_run_dir,  # lm-eval is imported only when an experiment asks for it
        )

        evaluate_run_dir(run_dir, tasks=missing)


def write_tables(tables: dict[str, pd.DataFrame], spec: TableSpec, out_dir: Path) -> None:
    """Each table as <name>.csv, and all of them in table.md (the kind's columns and the table's `show`)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, table in tables.items():
        table.to_csv(out_dir / f"{name}.csv", index=False)
    (out_dir / "table.md").write_text(markdown(tables, spec))


@functools.cache
def commit_exists(commit: str) -> bool:
    """Whether `commit` (a record's git_commit, '-dirty' allowed) is a commit of this repository."""
    sha = commit.removesuffix("-dirty")
    found = subprocess.run(["git", "cat-file", "-e", f"{sha}^{{commit}}"], cwd=ROOT,
                           capture_output=True)
    return sha != "unknown" and found.returncode == 0


def provenance_problems(config_path: str | Path, preset: str, store: ResultsStore = ResultsStore()) -> list[str]:
    """Why rows of the preset's stored table.csv do not trace to its stored runs (empty: every row does). Each
    run a row names must belong to the experiment's grid under that label, have a record (not marked other than
    complete) and a config.yaml equal to its resolved config, and a commit of this repository listed in the row."""
    spec = load_spec(config_path)
    stored = store.preset(spec.name, preset)
    table = stored.table()
    names = [name for runs in table["runs"] for name in runs.split()]
    seeds = sorted({seed_of(name) for name in names})
    # the grid at the table's seeds, and the preset's own: a run's run_seeds under its seeds cap
    grid = {run.name: run for run in (*experiment_grid(spec, preset, seeds), *experiment_grid(spec, preset))}
    problems = []
    for _, row in table.iterrows():
        runs = row["runs"].split()
        if len(runs) != row["seeds"]:
            problems.append(f"{row['label']}: {row['seeds']} seeds but runs {runs}")
        for name in runs:
            run_dir = stored.run_dir(name)
            if name not in grid or grid[name].label != row["label"]:
                problems.append(f"{row['label']}: run {name} is not in the experiment's {preset} grid")
            elif not (run_dir / "record.json").exists() or not (run_dir / "config.yaml").exists():
                problems.append(f"{row['label']}: run {name} has no record.json or config.yaml in {run_dir}")
            else:
                try:
                    record = read_record(run_dir)
                    diff = stored_config_difference(run_dir, resolved_config(spec, grid[name], stored.runs_dir))
                except StoredFileError as err:
                    problems.append(f"{row['label']}: run {name} cannot be read: {err}")
                    continue
                if diff:
                    problems.append(f"{row['label']}: run {name} was made with another config ({diff}): rerun it")
                allowed = ("complete", "diverged") if spec.keep_diverged else ("complete",)
                if record.get("status", "complete") not in allowed:
                    problems.append(f"{row['label']}: run {name} is {record['status']!r}")
                commit = record.get("git_commit", "unknown")
                if commit not in str(row["commits"]).split() or not commit_exists(commit):
                    problems.append(f"{row['label']}: run {name} has commit {commit!r}, not a listed commit of "
                                    "this repository")
    return problems


def compare_to_reference(ours: pd.DataFrame, reference: pd.DataFrame) -> pd.DataFrame:
    """Per label of `ours`: our final validation loss beside the stored mean +- std over seeds, the distance in
    stored standard deviations, and whether it lies within two of them."""
    ref = reference.set_index("label")
    rows = []
    for _, row in ours.iterrows():
        stored = ref.loc[row["label"]] if row["label"] in ref.index else None
        mean = stored["final_val_loss"] if stored is not None else float("nan")
        std = stored["final_val_loss_std"] if stored is not None else float("nan")
        inside = within_reference(row["final_val_loss"], mean, std)
        verdict = ("no stored row" if stored is None else "no stored spread" if inside is None
                   else "within 2 std" if inside else "OUTSIDE 2 std")
        rows.append({"label": row["label"], "ours": row["final_val_loss"], "our seeds": row["seeds"],
                     "stored mean": mean, "stored std": std,
                     "stored seeds": stored["seeds"] if stored is not None else 0,
                     "distance (std)": abs(row["final_val_loss"] - mean) / std if std else float("nan"),
                     "verdict": verdict})
    return pd.DataFrame(rows)


COMPARISONS_MEAN = ("a - b: the mean over the seeds both rows have of the per-seed difference, with its 95 % "
                    "t-interval; lower / higher when the interval excludes 0, equivalent inside +-0.01, else "
                    "inconclusive; fewer than 3 paired seeds give no verdict.")
REFERENCE_MEANS = ("'within 2 std': your final loss lies within two standard deviations (over the stored seeds) of "
                   "the stored mean. A single seed of yours has no spread of its own: this checks that the run "
                   "reproduces, not which method is better.")


SHORT_NAMES = {"final_val_loss": "val loss", "final_val_ppl": "val ppl", "bytes_per_step/total": "bytes/step",
               "state_ratio_to_adamw": "state / AdamW", "downstream/heldout_passage_ending/acc": "offline task acc",
               "nu_mean_over_training": "mean nu_t", "steps_to_target": "steps to target"}


def short_name(column: str) -> str:
    """A column's name in the printed view: SHORT_NAMES, `bytes / <row>` for bytes_ratio_to_<row>, else itself."""
    if column.startswith("bytes_ratio_to_"):
        return f"bytes / {column.removeprefix('bytes_ratio_to_')}"
    return SHORT_NAMES.get(column, column)


def print_summary(stored: StoredPreset, spec: TableSpec) -> None:
    """The compact table of the kind (every column: table.md / table.csv) and the comparisons, each with a line
    saying what it means."""
    table = stored.table()
    print(f"Results in {stored.dir}/ (table.md and table.csv have every column):")
    compact = table[compact_columns(table, spec)].rename(columns=short_name)
    print(compact.to_markdown(index=False, floatfmt=".4g"))
    if downstream_sources(table):
        print(downstream_sources(table))
    if stored.has("comparisons"):
        comparisons = stored.table("comparisons")
        if not comparisons.empty:
            print(f"\nComparisons. {COMPARISONS_MEAN}")
            shown = [c for c in ("sweep_value", "a", "b", "metric", "n", "diff", "ci_low", "ci_high", "verdict")
                     if c in comparisons]
            print(comparisons[shown].to_markdown(index=False, floatfmt=".4g"))


def print_beside_reference(ours: StoredPreset, reference: StoredPreset) -> None:
    if not reference.has():
        print(f"No stored reference at {reference.dir}/ yet: nothing to compare with.")
        return
    comparison = compare_to_reference(ours.table(), reference.table())
    print(f"\nFinal validation loss beside the stored reference ({reference.dir}/, mean +- std over its seeds). "
          f"{REFERENCE_MEANS}")
    print(comparison.to_markdown(index=False, floatfmt=".4g"))


def parse_seeds(text: str) -> list[int]:
    try:
        return [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise ConfigError(f"--seeds {text!r}: give comma-separated integers, e.g. --seeds 0,1") from None


def parse_labels(text: str) -> list[str]:
    labels = [label.strip() for label in text.split(",") if label.strip()]
    if not labels:
        raise ConfigError(f"--labels {text!r}: give comma-separated run labels of the preset, e.g. --labels a,b")
    return labels


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], usage=__doc__.split(":", 1)[0])
    parser.add_argument("config")
    parser.add_argument("rest", nargs="*", help="[preset] [key=value ...]")
    parser.add_argument("--out", default="runs", help="output directory (default runs/; results/ is the stored one)")
    parser.add_argument("--seeds", help="comma-separated seeds instead of the preset's (and of its run_seeds)")
    parser.add_argument("--labels", help="comma-separated run labels: only these rows of the preset (their table "
                        "printed, not written)")
    parser.add_argument("--force", action="store_true", help="rerun runs that could be reused")
    parser.add_argument("--same-commit", action="store_true",
                        help="reuse or copy only runs made at this checkout's commit (a clean one): every run of the "
                             "preset from one commit, resumable")
    parser.add_argument("--tables-only", action="store_true",
                        help="train nothing: rebuild the tables from the stored runs (an error if one is stale; "
                             "one with a file that cannot be read is left out)")
    args = parser.parse_intermixed_args(sys.argv[1:] if argv is None else argv)
    presets = [a for a in args.rest if "=" not in a]
    extra = [a for a in args.rest if "=" in a]
    if len(presets) > 1:
        sys.exit(f"error: one preset at most, got {presets}")
    preset = presets[0] if presets else "cpu"
    with counting_skipped():
        try:
            seeds = parse_seeds(args.seeds) if args.seeds else None
            store = ResultsStore(Path(args.out))
            labels = parse_labels(args.labels) if args.labels is not None else None
            stored = run_experiment(args.config, preset, store, seeds, args.force, extra, args.tables_only,
                                    args.same_commit, labels)
            if labels is not None:
                return  # the rows' table is printed; the preset's stored tables are of all its rows
            print_summary(stored, load_spec(args.config).table_of(preset))
            reference = ResultsStore()
            if store.root.resolve() != reference.root.resolve():
                print_beside_reference(stored, reference.preset(stored.experiment, preset))
        except (ConfigError, DataUnavailable, StoredFileError) as err:
            sys.exit(f"error: {err}")
        except RunEnded as err:
            print(f"error: {err}", file=sys.stderr, flush=True)
            sys.exit(err.exit_code)


if __name__ == "__main__":
    main()
