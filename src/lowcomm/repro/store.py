"""The results store: the one owner of where results lie and of reading them back.

    <root>/<experiment>/<preset>/runs/<label>-s<seed>/{record.json, config.yaml, metrics.csv}   one run
    <root>/<experiment>/<preset>/{table.csv, comparisons.csv, ..., table.md}                     its tables
    <root>/<experiment>/<file>                                                                  experiment-wide tables
    <figures>/<experiment>_<preset>.{png,pdf}                                                   its figure

The results root is one setting (`--out` / `--results` of the commands, `results` by default). Files that cannot be
read follow the rule of lowcomm.stored.
"""

from __future__ import annotations

import functools
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
from omegaconf import DictConfig, OmegaConf

from lowcomm.stored import RERUN, StoredFileError, read_config_tree, readable, reading
from lowcomm.training.run_dir import read_record

RESULTS = Path("results")
FIGURES = Path("paper_figures")


def run_name(label: str, seed: int) -> str:
    """A run's directory name: <label>-s<seed>."""
    return f"{label}-s{seed}"


def seed_of(name: str) -> int:
    """The seed in a run's directory name <label>-s<seed>."""
    return int(name.rsplit("-s", 1)[1])


def read_table(path: Path, fix: str) -> pd.DataFrame:
    """The CSV table stored at `path`; a StoredFileError naming `fix` when it is missing, not CSV or cut short (its
    last line without its line break)."""
    with reading(path, "a CSV table", fix):
        text = path.read_text()
        table = pd.read_csv(io.StringIO(text))
    if not text.endswith("\n"):
        raise StoredFileError(path, "cut short (its last line has no line break)", fix)
    return table


def read_run_files(run_dir: Path) -> tuple[dict, dict, pd.DataFrame]:
    """A stored run's record.json, config.yaml (as plain containers) and metrics.csv; a StoredFileError when one
    cannot be read."""
    return (read_record(run_dir), read_config_tree(run_dir / "config.yaml", RERUN),
            read_table(run_dir / "metrics.csv", RERUN))


@dataclass
class RunResult:
    """One finished run: its place in the grid (label, method, sweep value, seed, name), its record, its resolved
    config (as stored: plain containers) and its metrics.csv."""

    label: str
    method: str
    sweep_value: Any
    seed: int
    name: str
    record: dict
    config_tree: dict
    metrics: pd.DataFrame

    @functools.cached_property
    def config(self) -> DictConfig:
        """The resolved config as a DictConfig, built on first use: building it costs more than reading the file."""
        return OmegaConf.create(self.config_tree)

    @classmethod
    def read(cls, label: str, method: str, sweep_value: Any, seed: int, run_dir: Path) -> "RunResult":
        """The run stored in run_dir, at its place in the grid; a StoredFileError when one of its files cannot be
        read."""
        return cls(label, method, sweep_value, seed, run_dir.name, *read_run_files(run_dir))

    def validation_curve(self) -> pd.DataFrame:
        """(step, val_loss) at every validation point."""
        return self.metrics.loc[self.metrics["val_loss"].notna(), ["step", "val_loss"]].reset_index(drop=True)

    @property
    def tokens_per_step(self) -> int:
        c = self.config
        return c.data.batch_size * c.data.context * c.train.devices * c.train.num_nodes


@dataclass(frozen=True)
class StoredPreset:
    """The stored results of one experiment at one preset."""

    store: "ResultsStore"
    experiment: str
    preset: str

    @property
    def dir(self) -> Path:
        return self.store.root / self.experiment / self.preset

    @property
    def runs_dir(self) -> Path:
        return self.dir / "runs"

    def run_dir(self, name: str) -> Path:
        return self.runs_dir / name

    def has(self, table: str = "table") -> bool:
        return (self.dir / f"{table}.csv").exists()

    def table(self, table: str = "table") -> pd.DataFrame:
        """<preset dir>/<table>.csv, a table the experiment runner writes."""
        fix = (f"rebuild it: python -m lowcomm.repro.experiment experiments/{self.experiment}/config.yaml "
               f"{self.preset} --out {self.store.root} --tables-only")
        return read_table(self.dir / f"{table}.csv", fix)

    def markdown_path(self) -> Path:
        return self.dir / "table.md"

    def runs(self) -> list[RunResult]:
        """The runs of the stored table, in table order: table.csv names each row's label, method, sweep value and
        runs. A run whose files cannot be read is skipped (lowcomm.stored)."""
        def read(place: tuple[Any, str]) -> RunResult:
            row, name = place
            return RunResult.read(row.label, row.method, row.sweep_value, seed_of(name), self.run_dir(name))

        return readable(read, [(row, name) for row in self.table().itertuples() for name in row.runs.split()])

    def experiment_file(self, name: str) -> Path:
        """A file of the experiment beside its presets (an experiment-wide table)."""
        return self.store.experiment_dir(self.experiment) / name

    @property
    def figure(self) -> Path:
        """The figure's path without its suffix (.png and .pdf are written)."""
        return self.store.figures / f"{self.experiment}_{self.preset}"


@dataclass(frozen=True)
class ResultsStore:
    """Where results lie (`root`, and `figures` for the figures drawn from them) and how they are read back."""

    root: Path = RESULTS
    figures: Path = FIGURES

    def experiment_dir(self, experiment: str) -> Path:
        return self.root / experiment

    def preset(self, experiment: str, preset: str) -> StoredPreset:
        return StoredPreset(self, experiment, preset)

    def tabled(self) -> list[StoredPreset]:
        """Every experiment and preset with a stored table, in path order."""
        return [self.preset(t.parent.parent.name, t.parent.name) for t in sorted(self.root.glob("*/*/table.csv"))]

    def presets_of(self, experiment: str) -> list[StoredPreset]:
        """The experiment's presets with a stored table.md, in name order."""
        return [self.preset(experiment, t.parent.name)
                for t in sorted(self.experiment_dir(experiment).glob("*/table.md"))]

    def experiment_table(self, experiment: str, stem: str, fix: str) -> pd.DataFrame:
        """<root>/<experiment>/<stem>.csv, an experiment-wide table (`fix`: the command that writes it)."""
        return read_table(self.experiment_dir(experiment) / f"{stem}.csv", fix)

    def run_dirs(self) -> list[Path]:
        """Every stored run directory (one with a config.yaml) of any experiment and preset."""
        return sorted(c.parent for c in self.root.glob("*/*/runs/*/config.yaml"))

    def relative(self, path: Path) -> Path:
        """`path` as it is named inside the store (a run's `copied_from`)."""
        return path.relative_to(self.root)


def commits_named(table: pd.DataFrame) -> str:
    """'commit 1a2b3c4' or 'commits 1a2b3c4 9f8e7d6': the commits the table's runs were made at (its `commits`
    column), each once, short ('-dirty' kept: a run made from a checkout with changes); '' where it names none."""
    cells = table.get("commits", pd.Series(dtype=str)).dropna()
    found = sorted({c[:7] + ("-dirty" if c.endswith("-dirty") else "") for cell in cells for c in str(cell).split()})
    return f"commit{'s' if len(found) > 1 else ''} {' '.join(found)}" if found else ""
