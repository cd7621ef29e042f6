"""Stored files (run records, run configs, metrics, tables, model weights): one error and one rule for every reader.

A stored file that cannot be read (missing, not parseable, cut short) raises StoredFileError, whose message is one
line: `<path>: <what is wrong> (<how to fix it>)`. The rule: a run any of whose files (record.json, config.yaml,
metrics.csv) cannot be read counts as not run. The experiment runner trains such a run of its grid again; a command
that aggregates stored runs (an experiment's tables, with --tables-only too; `make figures`; `make report`'s main
job; the lr choice) leaves it out (`skip`) and ends with one line that counts the files it skipped and names the
first SHOWN (`counting_skipped`). Any other file that cannot be read (a table, a benchmark summary, the model a
command evaluates) stops the command with its error.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

import yaml
from omegaconf import DictConfig, OmegaConf

RERUN = "train the run again; an experiment's runner does so for the runs of its grid"
SHOWN = 3  # files the skipped line names
T = TypeVar("T")
R = TypeVar("R")

_skipped: dict[Path, StoredFileError] = {}  # the files skipped since counting_skipped began, by path


class StoredFileError(ValueError):
    """A stored file that cannot be read: its path, what is wrong with it and how to fix it."""

    def __init__(self, path: str | Path, problem: str, fix: str):
        self.path, self.problem, self.fix = Path(path), problem, fix
        super().__init__(f"{path}: {problem} ({fix})")


def brief(err: Exception) -> str:
    """An error's problem on one line of at most 100 characters: a YAML error's problem and where it lies, else the
    first sentence of its message."""
    problem, mark = getattr(err, "problem", None), getattr(err, "problem_mark", None)
    lines = str(err).strip().splitlines()
    text = (f"{problem} at line {mark.line + 1}, column {mark.column + 1}" if problem and mark else
            lines[0].split(". ")[0] if lines else type(err).__name__)
    return text if len(text) <= 100 else text[:97] + "..."


@contextmanager
def reading(path: str | Path, kind: str, fix: str) -> Iterator[None]:
    """Turn whatever the block raises while it reads `path` as `kind` into a StoredFileError naming `fix`."""
    try:
        yield
    except FileNotFoundError:
        raise StoredFileError(path, "missing", fix) from None
    except Exception as err:  # each parser (json, yaml, pandas, pickle, zip) raises its own types
        raise StoredFileError(path, f"cannot be read as {kind} ({brief(err)})", fix) from None


def read_json(path: str | Path, fix: str) -> dict:
    """The JSON object stored at `path`; a StoredFileError when it is missing or holds none."""
    with reading(path, "JSON", fix):
        data = json.loads(Path(path).read_text())
    if not isinstance(data, dict):
        raise StoredFileError(path, "holds no JSON object", fix)
    return data


def read_config_tree(path: str | Path, fix: str) -> dict:
    """The YAML mapping stored at `path`, as plain dicts and lists; a StoredFileError when it is missing, empty or not
    a mapping. For files written by OmegaConf.save, as every run's config.yaml is: its floats always carry a '.', so
    they read back as floats under YAML's own rules too (a sixth of OmegaConf.load's time)."""
    with reading(path, "YAML", fix):
        tree = yaml.load(Path(path).read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    if not isinstance(tree, dict) or not tree:
        raise StoredFileError(path, "holds no YAML mapping", fix)
    return tree


def read_config(path: str | Path, fix: str) -> DictConfig:
    """read_config_tree's mapping as a DictConfig."""
    return OmegaConf.create(read_config_tree(path, fix))


def skip(err: StoredFileError) -> None:
    """Note the file of `err` as left out of what is aggregated: `counting_skipped` counts it, once per path."""
    _skipped.setdefault(err.path, err)


def readable(read: Callable[[T], R], items: Iterable[T]) -> list[R]:
    """read(item) for every item whose stored files can be read; every StoredFileError is skipped (`skip`)."""
    found = []
    for item in items:
        try:
            found.append(read(item))
        except StoredFileError as err:
            skip(err)
    return found


def skipped_line(errors: list[StoredFileError]) -> str:
    """'2 stored files could not be read (skipped): <path>: <problem>; <path>: <problem> (<fix>)', the first SHOWN
    named."""
    count = f"{len(errors)} stored file{'s' if len(errors) > 1 else ''}"
    named = "; ".join(f"{e.path}: {e.problem}" for e in errors[:SHOWN])
    more = f"; {len(errors) - SHOWN} more" if len(errors) > SHOWN else ""
    fixes = "; ".join(dict.fromkeys(e.fix for e in errors))
    return f"{count} could not be read (skipped): {named}{more} ({fixes})"


@contextmanager
def counting_skipped() -> Iterator[None]:
    """The body of a command that aggregates stored files: at its end (an error's too) one line on stderr counts the
    files skipped inside it; none, no line."""
    _skipped.clear()
    try:
        yield
    finally:
        if _skipped:
            print(skipped_line(list(_skipped.values())), file=sys.stderr, flush=True)
        _skipped.clear()
