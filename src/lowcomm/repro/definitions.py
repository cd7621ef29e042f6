"""Every experiment, defined once: `experiments/<name>/config.yaml` holds what runs and how its table is built, and
its `report` section what it mirrors, its make target, its figure and its claims. The Makefile's list, the report,
the figures, the smoke tests and the README's experiment index all read these definitions.

    report: {order: <place in the index and the report>, mirrors: <paper table or question>,
             figure: <lowcomm.repro.figures.DRAW key>,
             claims: <lowcomm.repro.report.CLAIMS key, optional>, make: <make target, default the name>,
             in_all: <run by `make experiments`, default true>}
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path

from omegaconf import OmegaConf

from lowcomm.config import ConfigError
from lowcomm.paths import EXPERIMENTS

REPORT_KEYS = {"order", "mirrors", "figure", "claims", "make", "in_all"}


@dataclass(frozen=True)
class Definition:
    name: str
    order: int
    config: Path
    mirrors: str
    figure: str
    claims: str | None
    target: str
    in_all: bool

    @property
    def readme(self) -> Path:
        return self.config.parent / "README.md"


def read_definition(config: Path) -> Definition:
    """The experiment's definition from its config's `report` section; a ConfigError names a missing or unknown key."""
    report = OmegaConf.to_container(OmegaConf.load(config).get("report") or {})
    unknown, missing = sorted(set(report) - REPORT_KEYS), sorted({"order", "mirrors", "figure"} - set(report))
    if unknown or missing:
        raise ConfigError(f"{config}: report has unknown key(s) {unknown} or lacks {missing}; "
                          f"valid keys: {sorted(REPORT_KEYS)}")
    name = config.parent.name
    return Definition(name, int(report["order"]), config, report["mirrors"], report["figure"], report.get("claims"),
                      report.get("make", name), bool(report.get("in_all", True)))


@cache
def definitions(root: Path = EXPERIMENTS) -> dict[str, Definition]:
    """name -> Definition for every experiment folder (a config.yaml with a `report` section), in index order."""
    found = [read_definition(p) for p in root.glob("*/config.yaml") if "report" in OmegaConf.load(p)]
    return {d.name: d for d in sorted(found, key=lambda d: (d.order, d.name))}


def with_claims() -> list[Definition]:
    """The experiments whose claims the report states, in index order."""
    return [d for d in definitions().values() if d.claims]


def index_markdown() -> str:
    """The README's experiment index: one row per experiment with what it mirrors and its command."""
    rows = [f"| [{d.name}](experiments/{d.name}/) | {d.mirrors} | `make {d.target}` |" for d in definitions().values()]
    return "\n".join(["| experiment | mirrors | command |", "|---|---|---|", *rows])
