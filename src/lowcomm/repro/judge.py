"""Claims as data, one judge. Every paper claim an experiment tests is an entry of its config's top-level `claims:`
list, judged by a rule of RULES on the experiment's stored tables:

    - paper: <the paper's words, as the report quotes them>
      source: {paper: <paper (arXiv id)>, table: <its table or section>}
      paper_number: <the paper's number, quoted; optional>
      preset: <the stored preset the claim reads; default cpu>
      rule: <a name of RULES>
      <parameter>: <value>                 # the rule's parameters
      parts: [{rule: <name>, <parameter>: <value>, ...}, ...]   # instead of `rule`: several rules, verdicts combined
      show: [{<kind of SHOWS>: <value>, <parameter>: <value>, ...}, ...]   # optional: more of our numbers
      sizes: [<model size>, ...]           # optional: read the rows of the experiment's analytic.csv at these sizes
                                           # (its method column as the label) instead of the stored table
      setting: <the setting column; default the stored preset's>
      command: <what writes the tables it reads; default `make <experiment> [PRESET=<preset>] OUT=results`>

A rule is a function `rule(stored, **parameters) -> (verdict, our numbers)` and a show kind one `show(stored,
**parameters) -> text`; their keyword parameters are what an entry may and must give (parse_claims checks them).
Rules and shows name rows by their table label; a pair side may also be `{method: <config run label>, at: <sweep
value>}`. Whatever a rule reads and is not stored (a table, row, column or comparison) leaves the claim pending,
with the command that writes it.
"""

from __future__ import annotations

import copy
import inspect
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import pandas as pd

from lowcomm.config import ConfigError
from lowcomm.repro.accounting import ACCOUNTING_FIX
from lowcomm.repro.stats import EQUIVALENT, HIGHER, INCONCLUSIVE, LOWER, MIN_SEEDS, TOO_FEW
from lowcomm.repro.store import StoredPreset, commits_named

PRESET = "cpu"
LOSS = "final_val_loss"
REPRODUCED, NOT_REPRODUCED, PENDING = "reproduced", "not reproduced", "pending"
NOT_TESTABLE = "not testable at this scale"
NO_VERDICT = f"no verdict (fewer than {MIN_SEEDS} paired seeds)"


@dataclass(frozen=True)
class Claim:
    """A paper claim (quoted from its config entry), our verdict, our numbers, and the setting they come from (preset,
    steps, where the lrs come from, the commits of the runs)."""

    paper: str
    verdict: str
    ours: str
    setting: str = ""


class NotStored(LookupError):
    """A table, row, column or comparison a rule reads is not stored."""


def first(table: pd.DataFrame | None, where: Callable[[pd.DataFrame], pd.Series], what: str) -> pd.Series:
    """The first row of `table` where `where` holds; NotStored without one."""
    rows = table[where(table)] if table is not None else []
    if not len(rows):
        raise NotStored(what)
    return rows.iloc[0]


def cell(row: pd.Series, column: str) -> Any:
    """The row's column; NotStored where its table has no such column."""
    if column not in row.index:
        raise NotStored(f"column {column}")
    return row[column]


# ------------------------------------------------------------------------------------------ stored tables

def with_whole_state(table: pd.DataFrame) -> pd.DataFrame:
    """The table with `whole_state_mb`: MB of every kind of state a worker keeps (its memory/<kind>_bytes columns)."""
    kinds = [c for c in table.columns if c.startswith("memory/") and c.endswith("_bytes")]
    if not kinds or "whole_state_mb" in table:
        return table
    return pd.concat([table, (table[kinds].fillna(0).sum(axis=1) / 1e6).rename("whole_state_mb")], axis=1)


class Stored:
    """The stored tables of one experiment at a preset (None where a table is missing), and the experiment's analytic
    table (results/<experiment>/analytic.csv), read instead where a claim names model `sizes`. What a rule reads and
    is not stored (a row, a column, a comparison) raises NotStored."""

    def __init__(self, stored: StoredPreset, tuned: tuple[str, ...] = (),
                 pinned: Mapping[str, tuple[str, ...]] = MappingProxyType({}), tuned_from: str | None = None):
        """`stored`: the preset's place in the results store; `tuned`: what the preset takes from the tuned file;
        `pinned`: its method_overrides (a method's settings in this preset other than its method preset's);
        `tuned_from`: the earlier protocol whose tuned file its lrs come from (None: the current one)."""
        self.name, self.preset, self.tuned, self.pinned = stored.experiment, stored.preset, tuned, pinned
        self.tuned_from = tuned_from
        self.sizes: tuple[str, ...] = ()
        self.table = with_whole_state(stored.table()) if stored.has() else None
        self.comparisons = stored.table("comparisons") if stored.has("comparisons") else None
        analytic = stored.experiment_file("analytic.csv").exists()
        self.analytic = stored.store.experiment_table(self.name, "analytic", ACCOUNTING_FIX) if analytic else None

    def at_sizes(self, sizes: tuple[str, ...]) -> Stored:
        """These tables, their rows read from the analytic table at `sizes`."""
        sized = copy.copy(self)
        sized.sizes = sizes
        return sized

    def row(self, label: str) -> pd.Series:
        return first(self.table, lambda t: t["label"] == label, f"row {label}")

    def value(self, label: str, column: str) -> Any:
        return cell(self.row(label), column)

    def comparison(self, a: str, b: str, metric: str = LOSS) -> pd.Series:
        return first(self.comparisons, lambda c: (c["a"] == a) & (c["b"] == b) & (c["metric"] == metric),
                     f"comparison {a} - {b} ({metric})")

    def all_comparisons(self) -> pd.DataFrame:
        if self.comparisons is None:
            raise NotStored("comparisons")
        return self.comparisons

    def labels(self, rows: list[str] = (), method: str | list[str] = ()) -> list[str]:
        """`rows`, or the labels of the table's rows of `method` (one or a list), in table order."""
        if rows:
            return list(rows)
        methods = [method] if isinstance(method, str) else list(method)
        found = list(self.table.loc[self.table["method"].isin(methods), "label"]) if self.table is not None else []
        if not found:
            raise NotStored(f"rows of {methods}")
        return found

    def side(self, side: str | Mapping) -> str:
        """A pair side's label: the label itself, or that of the row of {method, at: sweep value}."""
        if isinstance(side, str):
            return side
        return first(self.table, lambda t: (t["method"] == side["method"])
                     & (t["sweep_value"].astype(float) == float(side["at"])), f"row of {side}")["label"]

    def views(self) -> list[tuple[str, Callable[[str, str], Any]]]:
        """(where, (label, column) -> value) of every table a row is read from: the stored table (where ''), or the
        analytic table at each of `sizes` (its method column as the label)."""
        if not self.sizes:
            return [("", self.value)]

        def at(size: str) -> Callable[[str, str], Any]:
            return lambda label, column: cell(first(self.analytic, lambda a: (a["size"] == size)
                                                    & (a["method"] == label), f"{label} at {size}"), column)

        return [(size, at(size)) for size in self.sizes]

    @property
    def command(self) -> str:
        """The command that writes these tables."""
        preset = "" if self.preset == PRESET else f" PRESET={self.preset}"
        return f"make {self.name}{preset} OUT=results"

    @property
    def setting(self) -> str:
        """'claim preset, 1,024 steps, tuned lrs, lordo at optim.qh_scale=1.0': the preset, its runs' steps, where its
        lrs come from (the tuned file where the preset lists `tuned: [lr]`, naming an earlier protocol's, else its
        config), its method_overrides."""
        of = f" of protocol {self.tuned_from}" if self.tuned_from else ""
        lrs = (f"tuned lrs{of}" if "lr" in self.tuned else
               f"lrs named in its config{', tuned adamw_lr' + of if of and 'adamw_lr' in self.tuned else ''}")
        stored = self.table is not None and "steps" in self.table
        steps = sorted({int(v) for v in self.table["steps"].dropna()}) if stored else []
        span = (f"{steps[0]:,} steps" if len(steps) == 1 else
                f"{steps[0]:,}-{steps[-1]:,} steps" if steps else "not stored")
        methods_by_pin: dict[tuple[str, ...], list[str]] = {}
        for method, overrides in self.pinned.items():
            methods_by_pin.setdefault(tuple(overrides), []).append(method)
        pins = "".join(f", {' and '.join(methods)} at {' '.join(pin)}" for pin, methods in methods_by_pin.items())
        return f"{self.preset} preset, {span}, {lrs}{pins}"

    @property
    def commits(self) -> str:
        """'runs at commit 1a2b3c4' (or 'commits ...'; store.commits_named): '' where the table names none or the
        claim reads the analytic table (`sizes`), which no run made."""
        named = commits_named(self.table) if self.table is not None and not self.sizes else ""
        return f"runs at {named}" if named else ""


# ------------------------------------------------------------------------------------------ formatting and verdicts

EXTEND_FROM, EXTEND_TO, EXTEND_ABOVE = 5, 10, 0.05  # the n = 10 rule: paired seeds, seeds, half-width in nats


def num(x: float, digits: int = 4) -> str:
    return "n/a" if x is None or not math.isfinite(float(x)) else f"{float(x):.{digits}g}"


def diff_text(c: pd.Series, unit: str = "nats") -> str:
    """'a - b = d [low, high] nats (n = 3 paired seeds)' of a comparison row (the 95 % t-interval; no unit for '')."""
    unpaired = c.get("unpaired_seeds")
    unpaired = f"; unpaired seeds {unpaired} left out" if isinstance(unpaired, str) and unpaired else (
        f"; unpaired seed {int(unpaired)} left out" if isinstance(unpaired, (int, float)) and math.isfinite(unpaired)
        else "")
    interval = f" [{num(c['ci_low'], 3)}, {num(c['ci_high'], 3)}]" if math.isfinite(c["ci_low"]) else ""
    seeds = "paired seed" if c["n"] == 1 else "paired seeds"
    unit = f" {unit}" if unit else ""
    return f"{c['a']} - {c['b']} = {num(c['diff'])}{interval}{unit} (n = {int(c['n'])} {seeds}{unpaired})"


def verdict_of(c: pd.Series, wanted: str = LOWER) -> str:
    """Verdict of a claim 'a is `wanted` than b' (lower, higher or equivalent) from a paired comparison row."""
    got = c["verdict"]
    if got == TOO_FEW:
        return NO_VERDICT
    if got == wanted:
        return REPRODUCED
    if got in (EQUIVALENT, INCONCLUSIVE):
        return got
    return NOT_REPRODUCED


def no_worse_of(c: pd.Series) -> str:
    """Verdict of a claim 'a ends no worse than b': reproduced where a is lower or equivalent, not reproduced where it
    is higher."""
    return {TOO_FEW: NO_VERDICT, LOWER: REPRODUCED, EQUIVALENT: REPRODUCED, HIGHER: NOT_REPRODUCED}.get(
        c["verdict"], INCONCLUSIVE)


def outcome_of(c: pd.Series) -> str:
    """The answer of a comparison that no paper claims (a question beyond the papers): which row is lower."""
    return {LOWER: f"{c['a']} lower", HIGHER: f"{c['b']} lower", EQUIVALENT: EQUIVALENT, INCONCLUSIVE: INCONCLUSIVE,
            TOO_FEW: NO_VERDICT}[c["verdict"]]


def verdict_on_seeds(n: int, needed: int, got: str) -> str:
    """`got` (a verdict resting on n paired seeds), held as pending while n is below `needed`."""
    if n >= needed:
        return got
    so_far = "" if got == NO_VERDICT else f" ({got} so far)"
    return f"{PENDING}: {n} of {needed} paired seeds{so_far}"


def combine(verdicts: list[str]) -> str:
    """All parts reproduced -> reproduced; any part pending (a part held below its seeds too) -> pending; any part not
    reproduced -> not reproduced; else the weakest part."""
    if any(v.startswith(PENDING) for v in verdicts):
        return PENDING
    for v in (NOT_REPRODUCED, NO_VERDICT, INCONCLUSIVE, EQUIVALENT):
        if v in verdicts:
            return v
    return REPRODUCED if verdicts else PENDING


def about(ours: float, claimed: float, band: float) -> str:
    """Reproduced where `ours` lies within `band` (a share) of `claimed`."""
    if not math.isfinite(ours):
        return PENDING
    return REPRODUCED if abs(ours / claimed - 1) <= band else NOT_REPRODUCED


def inverted(value: float, invert: bool) -> float:
    return 1 / value if invert else value


def ratio(a: float, b: float) -> float:
    return a / b if b > 0 else math.nan


def quantities(s: Stored, row: str, column: str, invert: bool, over: list[str]) -> list[tuple[str, float]]:
    """(text, value) of every quantity a ratio rule judges, in each view of the stored tables: the row's column (1 / it
    with `invert`), or with `over` each of those rows' column over the row's."""
    found = []
    for where, value in s.views():
        at, own = f"{where}: " if where else "", value(row, column)
        if not over:
            found.append((f"{at}{num(inverted(own, invert), 3)}x", inverted(own, invert)))
        for other in over:
            r = ratio(value(other, column), own)
            found.append((f"{at}{other} / {row} = {num(r, 3)}x ({num(value(other, column))} / {num(own)})", r))
    return found


def listed(found: list[tuple[str, float]], note: str) -> str:
    return "; ".join(text for text, _ in found) + (f" {note}" if note else "")


def spread(row: pd.Series, column: str) -> str:
    """'1.32 +- 0.0038': the row's column, with its std over seeds where the table has one."""
    std = row.get(f"{column}_std")
    return num(cell(row, column)) + (f" +- {num(std, 2)}" if std is not None else "")


def at_sweep(c: pd.Series) -> str:
    """'8: ' for a comparison at sweep value 8; '' without one."""
    value = c.get("sweep_value")
    return "" if value is None or pd.isna(value) else f"{num(value)}: "


# ------------------------------------------------------------------------------------------ rules

def ratio_about(s: Stored, *, row: str, column: str, factor: float, band: float, invert: bool = False,
                over: list[str] = (), note: str = "") -> tuple[str, str]:
    """Reproduced when every quantity (the row's column, 1 / it with `invert`, or each `over` row's column over the
    row's) lies within `band` (a share) of `factor`."""
    found = quantities(s, row, column, invert, over)
    return combine([about(v, factor, band) for _, v in found]), listed(found, note)


def at_least(s: Stored, *, row: str, column: str, least: float, invert: bool = False, over: list[str] = (),
             note: str = "") -> tuple[str, str]:
    """Reproduced when every quantity (as ratio_about's) is at least `least`."""
    found = quantities(s, row, column, invert, over)
    verdicts = [PENDING if not math.isfinite(v) else REPRODUCED if v >= least else NOT_REPRODUCED for _, v in found]
    return combine(verdicts), listed(found, note)


def each_at_least(s: Stored, *, column: str, least: float, rows: list[str] = (), method: str | list[str] = (),
                  note: str = "") -> tuple[str, str]:
    """Reproduced when the column of every row (`rows`, or the rows of `method`) is at least `least`."""
    labels = s.labels(rows, method)
    found = {label: float(s.value(label, column)) for label in labels}
    smallest = min(found, key=found.get)
    ours = (f"smallest {column} over {len(labels)} rows: {smallest} {num(found[smallest], 3)}, against {num(least)}"
            + (f" ({note})" if note else ""))
    if not all(math.isfinite(v) for v in found.values()):
        return PENDING, ours
    return (REPRODUCED if found[smallest] >= least else NOT_REPRODUCED), ours


def stays_below(s: Stored, *, row: str, column: str, below: float, than_row: str = "", than_column: str = "",
                share: float = 1.0, note: str = "") -> tuple[str, str]:
    """Reproduced when the row's column is below `below` and, with `than_row`, below `share` of that row's
    `than_column` (default `column`)."""
    value, bounds = s.value(row, column), [below]
    ours = f"{row} {column} {num(value, 3)}"
    if than_row:
        other = s.value(than_row, than_column or column)
        bounds.append(share * other)
        ours += f", {than_row} {than_column or column} {num(other, 3)}"
    ours += f" ({note})" if note else ""
    if not all(math.isfinite(x) for x in (value, *bounds)):
        return PENDING, ours
    return (REPRODUCED if all(value < b for b in bounds) else NOT_REPRODUCED), ours


def stays_within(s: Stored, *, column: str, of: float, within: float, rows: list[str] = (),
                 method: str | list[str] = (), note: str = "") -> tuple[str, str]:
    """Reproduced when the column of every row (`rows`, or the rows of `method`) stays within `within` of `of`."""
    labels = s.labels(rows, method)
    worst = pd.Series([s.value(label, column) for label in labels], dtype=float).sub(of).abs().max()
    seeds = min(int(s.value(label, "seeds")) for label in labels)
    ours = f"largest distance of {column} from {num(of)} over {', '.join(labels)} ({seeds} seeds): {num(worst, 3)}"
    return (REPRODUCED if worst < within else NOT_REPRODUCED), ours + (f" ({note})" if note else "")


def increases_along(s: Stored, *, method: str | list[str], column: str, along: str = "sweep_value",
                    unit: str = "") -> tuple[str, str]:
    """Reproduced when each row of `method` (one or a list), in order of `along` (a table column: the sweep value, a
    config setting such as train.devices), is higher in `column` than the row before by the paired rule (every step
    combined). Two rows at one value of `along` are a ConfigError (they have no order)."""
    labels = sorted(s.labels(method=method), key=lambda label: float(s.value(label, along)))
    at = [float(s.value(label, along)) for label in labels]
    if len(set(at)) < len(at):
        raise ConfigError(f"increases_along: rows {labels} of {method} share a value of {along} ({at}): name rows "
                          "with one row per value")
    steps = [s.comparison(b, a, column) for a, b in zip(labels, labels[1:])]
    means = "; ".join(f"{along} {num(s.value(label, along))}: {spread(s.row(label), column)}" for label in labels)
    ours = f"{means} ({column}); " + "; ".join(diff_text(c, unit) for c in steps)
    return combine([verdict_of(c, HIGHER) for c in steps]), ours


def compared(s: Stored, pairs: list, metric: str, smallest: int) -> list[pd.Series]:
    """The comparison rows of `pairs` ([a, b] labels or sides); with `smallest`, pairs of methods (config run labels),
    each at its `smallest` lowest sweep values."""
    if not smallest:
        return [s.comparison(s.side(a), s.side(b), metric) for a, b in pairs]
    c = s.all_comparisons().sort_values("sweep_value", kind="stable")
    c = c[c["metric"] == metric]
    a_method, b_method = (c[side].map(lambda label: s.value(label, "method")) for side in ("a", "b"))
    found = [r for a, b in pairs for _, r in c[(a_method == a) & (b_method == b)].head(smallest).iterrows()]
    if not found:
        raise NotStored(f"comparisons of {pairs}")
    return found


def more_seeds_due(c: pd.Series, verdict: str) -> str:
    """The n = 10 rule of the lr protocol v2 (experiments/lr_sweep/README.md, step 6): a loss comparison still
    inconclusive at 5 to 9 paired seeds with a half-width above 0.05 nats goes to 10 seeds once; '' otherwise."""
    n, half_width = int(c["n"]), (c["ci_high"] - c["ci_low"]) / 2
    due = verdict == INCONCLUSIVE and c["metric"] == LOSS and EXTEND_FROM <= n < EXTEND_TO
    if not (due and half_width > EXTEND_ABOVE):
        return ""
    return f"; half-width {num(half_width, 2)} > {EXTEND_ABOVE} at n = {n}: to n = {EXTEND_TO} once, by rule"


def paired(s: Stored, verdict: Callable[[pd.Series], str], pairs: list, metric: str, unit: str, min_seeds: int,
           smallest: int, merge: Callable[[list[str]], str] = combine) -> tuple[str, str]:
    """The verdicts of the comparisons, merged, and held as pending while any comparison rests on fewer than
    `min_seeds` paired seeds; and the comparisons (each with the n = 10 rule's call where it is due)."""
    found = compared(s, pairs, metric, smallest)
    verdicts = [verdict(c) for c in found]
    ours = "; ".join(f"{at_sweep(c) if smallest else ''}{diff_text(c, unit)}{more_seeds_due(c, v)}"
                     for c, v in zip(found, verdicts))
    merged = verdicts[0] if len(verdicts) == 1 else merge(verdicts)
    return verdict_on_seeds(min(int(c["n"]) for c in found), min_seeds, merged), ours


def lower(s: Stored, *, pairs: list, metric: str = LOSS, unit: str = "nats", min_seeds: int = 0,
          smallest: int = 0) -> tuple[str, str]:
    """Reproduced when a ends lower than b by the paired rule, in every pair."""
    return paired(s, lambda c: verdict_of(c, LOWER), pairs, metric, unit, min_seeds, smallest)


def higher(s: Stored, *, pairs: list, metric: str = LOSS, unit: str = "nats", min_seeds: int = 0,
           smallest: int = 0) -> tuple[str, str]:
    """Reproduced when a ends higher than b by the paired rule, in every pair."""
    return paired(s, lambda c: verdict_of(c, HIGHER), pairs, metric, unit, min_seeds, smallest)


def equivalent(s: Stored, *, pairs: list, metric: str = LOSS, unit: str = "nats", min_seeds: int = 0,
               smallest: int = 0) -> tuple[str, str]:
    """Reproduced when a and b are equivalent by the paired rule (within its margin), in every pair."""
    return paired(s, lambda c: verdict_of(c, EQUIVALENT), pairs, metric, unit, min_seeds, smallest)


def no_worse(s: Stored, *, pairs: list, metric: str = LOSS, unit: str = "nats", min_seeds: int = 0,
             smallest: int = 0) -> tuple[str, str]:
    """Reproduced when a ends lower than or equivalent to b by the paired rule, in every pair."""
    return paired(s, no_worse_of, pairs, metric, unit, min_seeds, smallest)


def outcome(s: Stored, *, pairs: list, metric: str = LOSS, unit: str = "nats", min_seeds: int = 0,
            smallest: int = 0) -> tuple[str, str]:
    """A question beyond the papers: which row of each pair ends lower by the paired rule."""
    return paired(s, outcome_of, pairs, metric, unit, min_seeds, smallest, merge="; ".join)


def reaches_sooner(s: Stored, *, a: str, b: str, metric: str, unit: str) -> tuple[str, str]:
    """Reproduced when a reaches the target in less `metric` than b by the paired rule; not reproduced when a seed of
    a never reaches it (the final losses shown instead)."""
    seeds, ours, theirs = s.value(a, "seeds"), s.value(a, metric), s.value(b, metric)
    missed = int(seeds - s.value(a, f"{metric}_n"))
    if missed:
        return NOT_REPRODUCED, (f"did not reach it within the run in {missed} of {int(seeds)} seeds; final "
                                f"validation loss: {diff_text(s.comparison(a, b))}")
    c = s.comparison(a, b, metric)
    return verdict_of(c), (f"{num(100 * (1 - ours / theirs), 3)} % fewer ({num(ours)} vs {num(theirs)} {unit}); "
                           f"{diff_text(c, unit)}")


def goal(s: Stored, *, rows: list[str], column: str, least: float, against: str, invert: bool = False,
         note: str = "") -> tuple[str, str]:
    """'reached by <rows>': the rows whose ratio column (1 / it with `invert`) is at least `least` and that end no
    worse than `against` by the paired rule; 'not reached' when every such row ends worse; else inconclusive."""
    held = [(label, inverted(s.value(label, column), invert), s.comparison(label, against)) for label in rows]
    small = [(label, c) for label, value, c in held if value >= least]
    reached = [label for label, c in small if no_worse_of(c) == REPRODUCED]
    verdict = (f"reached by {', '.join(reached)}" if reached else
               "not reached" if all(no_worse_of(c) == NOT_REPRODUCED for _, c in small) else INCONCLUSIVE)
    return verdict, "; ".join(f"{label}: {num(value, 4)}x {note}, {diff_text(c)}" for label, value, c in held)


def not_testable(s: Stored, *, reason: str, scale_of: str = "") -> tuple[str, str]:
    """Not testable at this scale, for `reason`; with `scale_of`, that row's tokens per worker-step and parameters."""
    if not scale_of:
        return NOT_TESTABLE, f"not at this scale: {reason}"
    tokens, steps, workers, parameters = (s.value(scale_of, c) for c in ("tokens", "steps", "world_size", "parameters"))
    return NOT_TESTABLE, (f"not at this scale: {num(tokens / steps / workers)} tokens per worker-step and "
                          f"{num(parameters / 1e6, 2)}M parameters here, {reason}")


def open_question(s: Stored, *, a_methods: list[str], question: str, note: str = "") -> tuple[str, str]:
    """An open question, answered by the numbers: every comparison whose a row is of `a_methods`, with its verdict."""
    c = s.all_comparisons()
    c = c.sort_values("sweep_value", kind="stable") if "sweep_value" in c else c
    chosen = c[c["a"].map(lambda label: s.value(label, "method")).isin(a_methods)]
    if chosen.empty:
        raise NotStored(f"comparisons of {a_methods}")
    answers = "; ".join(f"{at_sweep(r)}{diff_text(r)} ({r['verdict']})" for _, r in chosen.iterrows())
    return f"open question ({question}), answered by the numbers", answers + (f" ({note})" if note else "")


RULES: dict[str, Callable[..., tuple[str, str]]] = {rule.__name__: rule for rule in (
    lower, higher, equivalent, no_worse, outcome, ratio_about, at_least, each_at_least, stays_below, stays_within,
    increases_along, reaches_sooner, goal, not_testable, open_question)}


# ------------------------------------------------------------------------------------------ more of our numbers

def compare(s: Stored, *, compare: list[str], metric: str = LOSS, unit: str = "nats", text: str = "") -> str:
    """'text: a - b = d [low, high] (n = ...)': a paired comparison."""
    c = diff_text(s.comparison(s.side(compare[0]), s.side(compare[1]), metric), unit)
    return f"{text}: {c}" if text else c


def values(s: Stored, *, values: str, text: str, rows: list[str] = (), method: str | list[str] = (),
           invert: bool = False, unit: str = "") -> str:
    """'text: <row> v, ...': a column of rows (1 / it with `invert`) in each view of the stored tables."""
    labels = s.labels(rows, method)
    items = [f"{where + ' ' if where else ''}{label} {num(inverted(value(label, values), invert), 3)}{unit}"
             for where, value in s.views() for label in labels]
    return f"{text}: {', '.join(items)}"


def gap(s: Stored, *, gap: str, rows: list[str], text: str = "") -> str:
    """'text a vs b (g %)': two rows' column and the first's relative gap to the second."""
    a, b = (s.value(label, gap) for label in rows)
    return f"{text or gap} {num(a)} vs {num(b)} ({num(100 * (a / b - 1), 3)} %)"


def lowest(s: Stored, *, lowest: str, rows: list[str] = (), method: str | list[str] = (),
           text: str = "lowest") -> str:
    """'text: <row> (column v)': the row with the lowest column among `rows` or the rows of `method`."""
    best = min(s.labels(rows, method), key=lambda label: s.value(label, lowest))
    return f"{text}: {best} ({lowest} {num(s.value(best, lowest))})"


SHOWS: dict[str, Callable[..., str]] = {show.__name__: show for show in (compare, values, gap, lowest)}


# ------------------------------------------------------------------------------------------ claims as data

@dataclass(frozen=True)
class ClaimPart:
    """One rule of RULES and its parameters."""

    rule: str
    params: Mapping[str, Any]


@dataclass(frozen=True)
class ClaimSpec:
    """A paper claim as its config entry states it (the format is this module's docstring)."""

    paper: str
    source: Mapping[str, str]
    rule: str
    params: Mapping[str, Any]
    parts: tuple[ClaimPart, ...] = ()
    show: tuple[tuple[str, Mapping[str, Any]], ...] = ()
    preset: str = PRESET
    sizes: tuple[str, ...] = ()
    setting: str = ""
    command: str = ""
    paper_number: str = ""

    @property
    def judged(self) -> tuple[ClaimPart, ...]:
        """The rules the claim is judged on: its parts, or its one rule."""
        return self.parts or (ClaimPart(self.rule, self.params),)


CLAIM_KEYS = {"paper", "source", "paper_number", "preset", "rule", "parts", "show", "sizes", "setting", "command"}
SOURCE_KEYS = {"paper", "table"}


def checked(fn: Callable, params: Mapping, at: str, what: str) -> Mapping[str, Any]:
    """`params` as the keyword parameters of `fn`; a ConfigError names a missing or unknown one."""
    signature = list(inspect.signature(fn).parameters.values())[1:]
    names = {p.name for p in signature}
    missing = sorted(p.name for p in signature if p.default is inspect.Parameter.empty and p.name not in params)
    unknown = sorted(set(params) - names)
    if unknown:
        raise ConfigError(f"{at}: {unknown} not parameter(s) of {what}; its parameters: {sorted(names)}")
    if missing:
        raise ConfigError(f"{at}: {what} needs parameter(s) {missing}")
    return MappingProxyType(dict(params))


def parse_part(tree: Any, at: str) -> ClaimPart:
    if not isinstance(tree, Mapping):
        raise ConfigError(f"{at} must be a mapping with a rule, got {tree!r}")
    name = tree.get("rule")
    if name not in RULES:
        raise ConfigError(f"{at}.rule {name!r} is not a rule; rules: {sorted(RULES)}")
    params = {k: v for k, v in tree.items() if k != "rule"}
    return ClaimPart(name, checked(RULES[name], params, at, f"rule {name}"))


def parse_show(tree: Any, at: str) -> tuple[str, Mapping[str, Any]]:
    kinds = [k for k in SHOWS if isinstance(tree, Mapping) and k in tree]
    if len(kinds) != 1:
        raise ConfigError(f"{at} must be a mapping naming one kind of {sorted(SHOWS)}, got {tree!r}")
    return kinds[0], checked(SHOWS[kinds[0]], tree, at, f"show {kinds[0]}")


def parse_claim(tree: Any, at: str) -> ClaimSpec:
    """One entry of a `claims:` list; a ConfigError names the key (`at`: the file and the entry)."""
    if not isinstance(tree, Mapping):
        raise ConfigError(f"{at} must be a mapping, got {tree!r}")
    missing = sorted({"paper", "source"} - set(tree))
    if missing or ("rule" in tree) == ("parts" in tree):
        raise ConfigError(f"{at} lacks {missing or 'a rule'} (an entry has a paper, a source and either a rule or "
                          "parts)")
    source = tree["source"]
    if not isinstance(source, Mapping) or "paper" not in source or set(source) - SOURCE_KEYS:
        raise ConfigError(f"{at}.source must be a mapping of {sorted(SOURCE_KEYS)} with a paper, got {source!r}")
    rest = {k: v for k, v in tree.items() if k not in CLAIM_KEYS}
    if "parts" in tree:
        if rest:
            raise ConfigError(f"{at} has unknown key(s) {sorted(rest)}; valid keys: {sorted(CLAIM_KEYS)}")
        parts = tuple(parse_part(p, f"{at}.parts[{j}]") for j, p in enumerate(tree["parts"]))
        rule, params = "", MappingProxyType({})
    else:
        parts, rule, params = (), tree["rule"], parse_part({"rule": tree["rule"], **rest}, at).params
    return ClaimSpec(str(tree["paper"]), MappingProxyType(dict(source)), rule, params, parts,
                     tuple(parse_show(e, f"{at}.show[{j}]") for j, e in enumerate(tree.get("show", []))),
                     str(tree.get("preset", PRESET)), tuple(str(size) for size in tree.get("sizes", [])),
                     str(tree.get("setting", "")), str(tree.get("command", "")), str(tree.get("paper_number", "")))


def parse_claims(entries: Any, where: str) -> tuple[ClaimSpec, ...]:
    """The `claims:` list of the config at `where`; a ConfigError names the file and the key of a problem."""
    if not isinstance(entries, list):
        raise ConfigError(f"{where}: claims must be a list of claims, got {entries!r}")
    return tuple(parse_claim(entry, f"{where}: claims[{i}]") for i, entry in enumerate(entries))


def stated_bands(claims: tuple[ClaimSpec, ...]) -> list[float]:
    """The bands the claims' rules state (ratio_about's `band`), each once, in order."""
    return sorted({p.params["band"] for c in claims for p in c.judged if "band" in p.params})


def judge(claim: ClaimSpec, stored: Stored) -> Claim:
    """The claim's verdict and our numbers on `stored`; pending, with the command that writes them, while a table, row,
    column or comparison it reads is not stored."""
    s = stored.at_sizes(claim.sizes) if claim.sizes else stored
    try:
        judged = [RULES[part.rule](s, **part.params) for part in claim.judged]
        shown = [SHOWS[kind](s, **params) for kind, params in claim.show]
    except NotStored:
        return Claim(claim.paper, PENDING, f"not stored yet: `{claim.command or stored.command}`")
    verdict = judged[0][0] if len(judged) == 1 else combine([v for v, _ in judged])
    setting = ", ".join(part for part in (claim.setting or stored.setting, s.commits) if part)
    return Claim(claim.paper, verdict, "; ".join([*(ours for _, ours in judged), *shown]), setting)
