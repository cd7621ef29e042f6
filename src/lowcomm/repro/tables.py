"""Experiment tables from run records: one builder per table kind (`table.kind` of an experiment config).

Every table has one row per label (a configuration over its seeds): the mean over seeds of every numeric field of
the records and of the features derived here, sample standard deviations of the key ones (`<column>_std`), the
number of seeds, the runs and the commits they came from. Kinds that compare rows add comparisons.csv:
a - b paired over seeds, its 95 % t-interval and verdict (lowcomm.repro.stats.paired_difference). Derived per run:
  optimizer_state_bytes / error_feedback_bytes / anchor_bytes   the record's memory/* split as the paper counts it
  step_time_s            median over logged intervals of tokens per step / tokens per second (measured)
  collectives_per_step   collective calls per training step (comm/training_collectives / steps)
  nu_*_over_training, active_rank_share_over_training           from the logged metrics
  angle_*_over_syncs     largest principal angle between consecutive bases, at the sync steps (t % K == 0)
  probe_cosine_mean_over_syncs   mean cosine of Delta to the full-batch direction over the syncs (probe runs)
  dense_basis_angle_mean_over_syncs   mean over the syncs of the largest angle between the basis of a compressed
                         Delta and that of the dense Delta (sync.probe_dense_basis)
Modeled columns follow lowcomm.cost.wallclock and carry their parameters (bandwidth, latency) as columns.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from omegaconf import DictConfig, OmegaConf
from torch import nn

from lowcomm.config import ConfigError, parse_sections
from lowcomm.cost.bytes import analytic_bytes_per_step
from lowcomm.cost.method import AccountedMethod
from lowcomm.cost.shapes import ParamShapes, meta_model, param_shapes
from lowcomm.cost.state import matrix_moments_ratio, state_summary
from lowcomm.cost.wallclock import (
    BANDWIDTHS_GBPS,
    LATENCY_S,
    crossover_rate_mbit,
    step_time,
    steps_to_reach,
)
from lowcomm.eval.local_tasks import LOCAL_SUFFIX
from lowcomm.eval.tasks import OFFLINE_TASK
from lowcomm.optim.dion import fixed_rank
from lowcomm.optim.lowrank_adam import resolve_rank
from lowcomm.repro.spec import TableSpec, frozen_map
from lowcomm.repro.stats import against_best, paired_difference, sample_std
from lowcomm.repro.store import RunResult, commits_named

KEY_STDS = ("final_val_loss", "final_val_ppl")


def _numeric(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _flatten(prefix: str, tree: Any) -> dict[str, Any]:
    if isinstance(tree, dict):
        return {k: v for key, sub in tree.items() for k, v in _flatten(f"{prefix}/{key}", sub).items()}
    return {prefix: tree}


def _column_stat(metrics: pd.DataFrame, column: str, how: str) -> float:
    if column not in metrics:
        return math.nan
    values = metrics[column].dropna()
    return float(getattr(values, how)()) if len(values) else math.nan


def basis_change_rows(run: RunResult) -> pd.DataFrame:
    """The metrics rows that log a change of basis (subspace/max_angle present): for K-step methods only the sync
    steps t % K == 0, K as the sync options resolve it."""
    m = run.metrics
    if "subspace/max_angle" not in m:
        return m.iloc[0:0]
    opts = parse_sections(run.config).sync
    rows = m[(m["step"] > 0) & m["subspace/max_angle"].notna()]
    return rows[rows["step"] % opts.sync_every == 0] if opts.kind.k_step else rows


def sync_angles(run: RunResult) -> pd.Series:
    """subspace/max_angle at each change of basis (the angle between the bases before and after it); empty for a run
    that logs no basis."""
    return basis_change_rows(run).get("subspace/max_angle", pd.Series(dtype=float))


def run_features(run: RunResult) -> dict[str, Any]:
    """The record's numeric fields and the per-run features of the module docstring."""
    rec, m = run.record, run.metrics
    out = {k: v for k, v in rec.items() if _numeric(v)}
    out["diverged"] = int(rec.get("status") == "diverged")
    if out["diverged"]:  # its last finite validation loss is not where the run ended
        out["final_val_loss"] = out["final_val_ppl"] = math.inf
    out.update(state_summary({k[len("memory/"):-len("_bytes")]: v for k, v in rec.items()
                              if k.startswith("memory/") and k.endswith("_bytes")}))
    rates = m["tokens_per_s"].dropna() if "tokens_per_s" in m else pd.Series(dtype=float)
    out["step_time_s"] = float((run.tokens_per_step / rates[rates > 0]).median()) if (rates > 0).any() else math.nan
    out["collectives_per_step"] = rec.get("comm/training_collectives", math.nan) / rec["steps"]
    out["nu_mean_over_training"] = _column_stat(m, "spectral/nu_mean", "mean")
    out["nu_max_over_training"] = _column_stat(m, "spectral/nu_max", "max")
    out["active_rank_share_over_training"] = _column_stat(m, "spectral/active_rank_share", "mean")
    out["probe_cosine_mean_over_syncs"] = _column_stat(m, "probe/pseudo_gradient_cosine", "mean")
    out["dense_basis_angle_mean_over_syncs"] = _column_stat(m, "probe/dense_basis_max_angle", "mean")
    angles = sync_angles(run)
    out["angle_max_over_syncs"] = float(angles.max()) if len(angles) else math.nan
    out["angle_median_over_syncs"] = float(angles.median()) if len(angles) else math.nan
    for key, value in _flatten("downstream", rec.get("downstream", {})).items():
        if key != "downstream" and (_numeric(value) or isinstance(value, str)):
            out[key] = value  # a score, or the words saying why there is none (a task that cannot load offline)
    return out


def per_run_frame(results: list[RunResult]) -> pd.DataFrame:
    """One row per run: label, method, sweep value, seed, run name, commit and its features."""
    return pd.DataFrame([{"label": r.label, "method": r.method, "sweep_value": r.sweep_value, "seed": r.seed,
                          "run": r.name, "commit": r.record.get("git_commit", "unknown"), **run_features(r)}
                         for r in results])


def summarize(runs: pd.DataFrame, std_of: tuple[str, ...] = ()) -> pd.DataFrame:
    """One row per label (in first-appearance order): means of the numeric columns, `<column>_std` of KEY_STDS and
    `std_of`, the seed count, the runs and the commits."""
    rows = []
    for label, group in runs.groupby("label", sort=False):
        row = {"label": label, "method": group["method"].iloc[0], "sweep_value": group["sweep_value"].iloc[0]}
        numeric = group.drop(columns=["seed", "sweep_value"]).select_dtypes("number")
        row.update(numeric.mean().to_dict())
        words = [c for c in group if c.startswith("downstream/") and c not in numeric]
        row.update({c: " / ".join(sorted(set(group[c].dropna().astype(str)))) for c in words})
        for col in (*KEY_STDS, *std_of):
            row[f"{col}_std"] = sample_std(group[col]) if col in group else math.nan
        row.update(seeds=len(group), runs=" ".join(group["run"]), commits=" ".join(sorted(set(group["commit"]))))
        rows.append(row)
    return pd.DataFrame(rows)


COMPARISON_COLUMNS = ["a", "b", "metric", "a_mean", "b_mean", "n", "diff", "ci_low", "ci_high", "unpaired_seeds",
                      "verdict"]


def per_seed(runs: pd.DataFrame, label: str, column: str) -> dict[int, float]:
    """{seed: value} of one label's runs."""
    rows = runs[runs["label"] == label]
    return dict(zip(rows["seed"].astype(int), rows[column])) if column in rows else {}


def compare_rows(runs: pd.DataFrame, table: pd.DataFrame, pairs: list[list[str]],
                 metric: str = "final_val_loss") -> pd.DataFrame:
    """For each pair [a, b] (or [a, b, metric]) of labels in `table`: the means of each side and the paired
    per-seed difference a - b over the runs `runs` (stats.paired_difference: n, mean, 95 % t-interval, verdict)."""
    rows = []
    by_label = table.set_index("label")
    for pair in pairs:
        a, b, col = (*pair, metric) if len(pair) == 2 else pair
        if a not in by_label.index or b not in by_label.index:
            continue
        d = paired_difference(per_seed(runs, a, col), per_seed(runs, b, col))
        rows.append({"a": a, "b": b, "metric": col, "a_mean": by_label.loc[a, col], "b_mean": by_label.loc[b, col],
                     "n": d.n, "diff": d.diff, "ci_low": d.low, "ci_high": d.high,
                     "unpaired_seeds": " ".join(map(str, d.unpaired)), "verdict": d.verdict})
    return pd.DataFrame(rows, columns=COMPARISON_COLUMNS)


def mean_curves(results: list[RunResult]) -> dict[str, pd.Series]:
    """Per label: the validation loss at each validation step, averaged over seeds."""
    frames = {}
    for r in results:
        frames.setdefault(r.label, []).append(r.validation_curve().set_index("step")["val_loss"])
    return {label: pd.concat(curves, axis=1).mean(axis=1) for label, curves in frames.items()}


def _reach(curve: pd.Series, target: float) -> float:
    return steps_to_reach(list(curve.index), list(curve.values), target)


def add_modeled_times(table: pd.DataFrame, steps: pd.Series, bandwidths: list[float], latency_s: float,
                      name: str) -> None:
    """Columns t_step_s_<bw>gbps and <name>_s_<bw>gbps = steps x t_step (lowcomm.cost.wallclock), and the latency."""
    table["modeled_latency_s"] = latency_s
    for bw in bandwidths:
        t = [step_time(c, b, n, bw, latency_s) for c, b, n in
             zip(table["step_time_s"], table["bytes_per_step/total"], table["collectives_per_step"])]
        table[f"t_step_s_{bw:g}gbps"] = t
        table[f"{name}_s_{bw:g}gbps"] = steps.values * pd.Series(t).values


def add_times_to_common_target(table: pd.DataFrame, curves: dict[str, pd.Series], bandwidths: list[float],
                               latency_s: float) -> None:
    """Columns target_loss (the worst final validation loss of the rows, so that every row reaches it),
    steps_to_target (on the mean curve) and the modeled t_step and time_to_target at each bandwidth."""
    target = float(table["final_val_loss"].max())
    table["target_loss"] = target
    steps = pd.Series([_reach(curves[label], target) for label in table["label"]])
    table["steps_to_target"] = steps
    add_modeled_times(table, steps, bandwidths, latency_s, "time_to_target")


def label_at(table: pd.DataFrame, method: str, value: Any) -> str | None:
    """The label of run label `method` at sweep value `value` (compared as numbers), or None."""
    rows = table[(table["method"] == method) & (table["sweep_value"].astype(float) == float(value))]
    return rows["label"].iloc[0] if len(rows) else None


def pairs_at_values(pairs: list[list[str]], table: pd.DataFrame) -> list[list[str]]:
    """Sweep pairs [a, b] (or [a, b, metric]) of run labels, expanded to the table's labels at every sweep value."""
    values = list(dict.fromkeys(table["sweep_value"]))
    expanded = [[label_at(table, a, v), label_at(table, b, v), *rest] for v in values for a, b, *rest in pairs]
    return [p for p in expanded if p[0] and p[1]]


# ---------------------------------------------------------------------------------------------- kinds

def methods_table(results: list[RunResult], params: TableSpec) -> dict[str, pd.DataFrame]:
    """LoRDO's Table 3: loss and perplexity, downstream accuracy ('not evaluated' without a record's `downstream`),
    bytes per worker per step and their ratio to each baseline, optimizer state and its ratio to AdamW's (the
    `state_baseline` row), AdamW's moments of the hidden matrices over the low-rank moments, and the modeled time
    to the final loss at `bandwidth_gbps`; with `target_bandwidths_gbps`, also the modeled time to a common target
    (`add_times_to_common_target`) at each of those bandwidths."""
    runs = per_run_frame(results)
    table = summarize(runs)
    by_label = table.set_index("label")
    for base in params.get("baselines", []):
        if base in by_label.index:
            table[f"bytes_ratio_to_{base}"] = table["bytes_per_step/total"] / by_label.loc[base, "bytes_per_step/total"]
    state_base = params.get("state_baseline")
    if state_base in by_label.index:
        base = by_label.loc[state_base]
        table["state_ratio_to_adamw"] = table["optimizer_state_bytes"] / base["optimizer_state_bytes"]
        if "memory/moments_bytes" in table:
            table["matrix_moments_ratio"] = matrix_moments_ratio(
                base["memory/adamw_moments_bytes"], table["memory/adamw_moments_bytes"],
                table["memory/moments_bytes"].where(table["memory/moments_bytes"] > 0))
    if not any(c.startswith("downstream/") for c in table):
        table["downstream"] = "not evaluated"
    curves = mean_curves(results)
    steps = pd.Series([_reach(curves[label], loss) for label, loss in zip(table["label"], table["final_val_loss"])])
    table["steps_to_final"] = steps
    add_modeled_times(table, steps, [params.get("bandwidth_gbps", 10.0)], params.get("latency_s", LATENCY_S),
                      "time_to_final")
    if "target_bandwidths_gbps" in params:
        add_times_to_common_target(table, curves, params["target_bandwidths_gbps"], params.get("latency_s", LATENCY_S))
    return {"table": table, "comparisons": compare_rows(runs, table, params.get("compare", []))}


def optimizer_setting(cfg: DictConfig, key: str) -> float | str:
    """An optimizer option of a resolved config with the optimizer's default filled in (NaN when it has none; a
    word option as it is)."""
    value = getattr(parse_sections(cfg).optim, key, math.nan)
    return math.nan if value is None else value if isinstance(value, str) else float(value)


def update_balance(run: RunResult) -> float:
    """Median over the logged steps after the warmup of update_rms/full over update_rms/low (the applied
    (1 - omega) full term over the applied omega low term); NaN for a run without both."""
    metrics = run.metrics
    if "update_rms/full" not in metrics or "update_rms/low" not in metrics:
        return math.nan
    later = metrics[metrics["step"] > run.config.train.warmup]
    return float((later["update_rms/full"] / later["update_rms/low"]).median())


RUN_FEATURES: dict[str, Callable[[RunResult], float]] = {"balance": update_balance}  # a table's `features`


def stagnation_table(results: list[RunResult], params: TableSpec) -> dict[str, pd.DataFrame]:
    """Loss and the optimizer settings `settings` (default omega and weight decay) per row, the subspace movement at
    the syncs (largest principal angle between consecutive bases: its maximum and median over the syncs) and the
    balance of the update's terms (update_balance)."""
    runs = per_run_frame(results)
    for key in params.get("settings", ["omega", "weight_decay"]):
        runs[key] = [optimizer_setting(r.config, key) for r in results]
    runs["balance"] = [update_balance(r) for r in results]
    table = summarize(runs, ("angle_max_over_syncs",))
    for key in params.get("settings", []):  # a word setting is no mean: the row's value
        if key not in table:
            table[key] = runs.groupby("label", sort=False)[key].first().values
    return {"table": table, "comparisons": compare_rows(runs, table, params.get("compare", []))}


def config_setting(cfg: DictConfig, key: str) -> float | str:
    """The value of a dotted config key in a resolved run config, the optimizer's and the sync kind's defaults filled
    in (`optim.omega`, `sync.outer_lr`, `train.devices`); a number as a float, a word as it is; NaN for a sync key
    the run's sync kind does not act on (ddp's outer lr)."""
    section, name = key.split(".", 1)
    if section == "optim" and name != "name":
        return optimizer_setting(cfg, name)
    if section == "sync":
        sync = parse_sections(cfg).sync
        value = getattr(sync, name) if sync.uses(name) else math.nan
    else:
        value = OmegaConf.select(cfg, key)
    return value if isinstance(value, str) else float(value)


def with_settings(table: pd.DataFrame, results: list[RunResult], keys: list[str]) -> pd.DataFrame:
    """The table with a column per dotted config key (config_setting), each row's value from its first run."""
    first_run = {}
    for r in results:
        first_run.setdefault(r.label, r)
    for key in keys:
        table[key] = [config_setting(first_run[label].config, key) for label in table["label"]]
    return table


def grid_edges(table: pd.DataFrame, winner: str, settings: list[str]) -> str:
    """The numeric settings at which the winner's value is the least or the greatest of several in `table`
    (`sync.outer_lr high`): where the grid should be extended."""
    row = table.set_index("label").loc[winner]
    edges = []
    for key in settings:
        values = table[key]
        if values.nunique() > 1 and pd.api.types.is_numeric_dtype(values):
            edges += [f"{key} low"] if row[key] == values.min() else [f"{key} high"] if row[key] == values.max() else []
    return " ".join(edges)


def choice_table(results: list[RunResult], params: TableSpec) -> dict[str, pd.DataFrame]:
    """The protocol's choice among settings (spec/experiments.md, v2), within each group of rows that share the
    values of the `group` keys (e.g. optim.name and train.devices, the worker count M): per row its `settings`
    (dotted config keys), the means of the per-run `features` (RUN_FEATURES: e.g. LoRDO's balance), the mean and
    spread of its final loss over seeds and the paired difference to the group's best mean (stats.against_best);
    `chosen` marks the winner, whose row also names the rows whose interval to it contains 0 (`tie`) and the
    settings at which it lies on an edge of the group's grid (`edge`)."""
    runs = per_run_frame(results)
    settings, group_keys = list(params["settings"]), list(params.get("group", []))
    for name in params.get("features", []):
        runs[name] = [RUN_FEATURES[name](r) for r in results]
    table = with_settings(summarize(runs), results, [*settings, *group_keys])
    groups = table.groupby(group_keys, sort=False) if group_keys else [(None, table)]
    ranked, ties, edges = {}, {}, {}
    for _, group in groups:
        best, rows = against_best({label: per_seed(runs, label, "final_val_loss") for label in group["label"]})
        ranked.update(rows)
        ties[best] = " ".join(label for label, row in rows.items() if label != best and row["ci_low"] <= 0 <= row["ci_high"])
        edges[best] = grid_edges(group, best, settings)
    ranked = pd.DataFrame([ranked[label] for label in table["label"]]).drop(columns=["seeds"])
    table = pd.concat([table, ranked], axis=1)
    table["tie"] = table["label"].map(ties).fillna("")
    table["edge"] = table["label"].map(edges).fillna("")
    return {"table": table}


def paired_mean(runs: pd.DataFrame, label: str, base: Any) -> float:
    """The mean final loss of `base` over the seeds it shares with `label` (nan without a base)."""
    if not isinstance(base, str):
        return math.nan
    row, of_base = per_seed(runs, label, "final_val_loss"), per_seed(runs, base, "final_val_loss")
    return float(np.mean([of_base[seed] for seed in row if seed in of_base]))


def gap_table(results: list[RunResult], params: TableSpec) -> dict[str, pd.DataFrame]:
    """The paired gap of each row a to its baseline b (`gaps`: [a, b] pairs of labels), L_a - L_b in nats with its
    95 % t-interval, and in % of b's mean over the paired seeds, 100 (L_a - L_b) / L_b (its interval the nats interval
    over the same L_b),
    beside the paper's gap in % (`paper_pct`: {a: %}); each row shows its `settings` (dotted config keys). The
    comparisons hold the gaps and the `compare` pairs (e.g. M = 2 against M = 1: whether the gap grows with M)."""
    runs = per_run_frame(results)
    table = with_settings(summarize(runs), results, list(params.get("settings", [])))
    named = {label for pair in params["gaps"] for label in pair} | set(params.get("paper_pct", {}))
    absent = sorted(named - set(table["label"]))
    if absent:
        raise ConfigError(f"table.gaps or paper_pct name {absent}, which no run has: use the labels "
                          f"{list(table['label'])}")
    gaps = compare_rows(runs, table, params["gaps"])
    gap = gaps.set_index("a")
    for name, column in (("baseline", "b"), ("gap", "diff"), ("gap_low", "ci_low"), ("gap_high", "ci_high"),
                         ("gap_n", "n"), ("gap_verdict", "verdict")):
        table[name] = table["label"].map(gap[column])
    table["baseline_loss"] = [paired_mean(runs, label, base) for label, base in zip(table["label"], table["baseline"])]
    for name, column in (("gap_pct", "gap"), ("gap_pct_low", "gap_low"), ("gap_pct_high", "gap_high")):
        table[name] = 100 * table[column] / table["baseline_loss"]
    table["paper_gap_pct"] = table["label"].map(dict(params.get("paper_pct", {})))
    return {"table": table, "comparisons": pd.concat([gaps, compare_rows(runs, table, params.get("compare", []))],
                                                     ignore_index=True)}


def sweep_table(results: list[RunResult], params: TableSpec) -> dict[str, pd.DataFrame]:
    """Loss per run label and sweep value; the `compare` pairs of run labels at every sweep value."""
    runs = per_run_frame(results)
    table = summarize(runs)
    pairs = pairs_at_values(params.get("compare", []), table)
    comparisons = compare_rows(runs, table, pairs)
    comparisons.insert(0, "sweep_value", [table.set_index("label").loc[a, "sweep_value"] for a in comparisons["a"]])
    return {"table": table, "comparisons": comparisons}


def horizon_table(results: list[RunResult], params: TableSpec) -> dict[str, pd.DataFrame]:
    """Per run label and horizon (sweep value: train.steps): the loss, the paired gap to the `baseline` row at the
    same horizon, the steps the baseline's longest run (mean curve) needs to reach the row's final loss, and the
    `compare` pairs [a, b] of run labels (e.g. K = 8 against K = 32) at every horizon both have."""
    base = params["baseline"]
    runs = per_run_frame(results)
    table = summarize(runs)
    longest = max((r for r in results if r.method == base), key=lambda r: float(r.sweep_value), default=None)
    if longest is not None:
        curve = mean_curves([r for r in results if r.label == longest.label])[longest.label]
        table["baseline_steps_to_final"] = [_reach(curve, loss) for loss in table["final_val_loss"]]
    gaps = [[method, base] for method in dict.fromkeys(table["method"]) if method != base]
    comparisons = compare_rows(runs, table, pairs_at_values(gaps + params.get("compare", []), table))
    comparisons.insert(0, "sweep_value", [table.set_index("label").loc[a, "sweep_value"] for a in comparisons["a"]])
    return {"table": table, "comparisons": comparisons}


def dion_rank(cfg: DictConfig) -> int:
    """The largest rank r = ceil(rank_fraction x min(m, n)), at most min(m, n), over the hidden matrices of a
    Dion-family run (lowcomm.optim.dion.fixed_rank)."""
    fraction = optimizer_setting(cfg, "rank_fraction")
    return max(fixed_rank(fraction, *s) for s in model_shapes_of(cfg).lowrank)


def nu_table(results: list[RunResult], params: TableSpec) -> dict[str, pd.DataFrame]:
    """nu_t per method and rank: its mean over the logged steps (with the std over seeds), its maximum, its final
    value, beside the rank r and Dion's bound sqrt(r)."""
    runs = per_run_frame(results)
    runs["rank"] = [dion_rank(r.config) for r in results]
    table = summarize(runs, ("nu_mean_over_training",))
    table["sqrt_rank"] = table["rank"] ** 0.5
    rising = [[b, a, "nu_mean_over_training"] for _, rows in table.sort_values("rank").groupby("method", sort=False)
              for a, b in zip(rows["label"], rows["label"].iloc[1:])]
    return {"table": table, "comparisons": compare_rows(runs, table, rising)}


def beta_table(results: list[RunResult], params: TableSpec) -> dict[str, pd.DataFrame]:
    """Loss per run label and beta; each beta against the `reference` beta of the same run label, or of the label
    `reference_of` names for it (a form whose reference is another's)."""
    runs = per_run_frame(results)
    table = summarize(runs)
    ref, reference_of = params["reference"], params.get("reference_of", {})
    pairs = [[label, label_at(table, reference_of.get(method, method), ref)] for label, method, value in
             zip(table["label"], table["method"], table["sweep_value"])
             if float(value) != float(ref) or method in reference_of]
    return {"table": table, "comparisons": compare_rows(runs, table, [p for p in pairs if p[1]])}


def convergence_table(results: list[RunResult], params: TableSpec) -> dict[str, pd.DataFrame]:
    """Steps to reach the best validation loss of the `target` label (per seed: the target run of that seed), the
    time that takes at the measured step time, the measured step time, and Ada-Orth-Dion's active rank share."""
    target = params["target"]
    best = {r.seed: r.validation_curve()["val_loss"].min() for r in results if r.label == target}
    runs = per_run_frame(results)
    runs["steps_to_target"] = [_reach(r.validation_curve().set_index("step")["val_loss"], best.get(r.seed, math.nan))
                               for r in results]
    runs["time_to_target_s"] = runs["steps_to_target"] * runs["step_time_s"]
    table = summarize(runs, ("steps_to_target", "time_to_target_s", "step_time_s"))
    reached = runs.groupby("label", sort=False)["steps_to_target"].agg(lambda s: int(s.notna().sum()))
    table["steps_to_target_n"] = table["time_to_target_s_n"] = reached.values
    table["target_label"] = target
    return {"table": table, "comparisons": compare_rows(runs, table, params.get("compare", []))}


def run_model(cfg: DictConfig) -> nn.Module:
    """A run's model (its `model` section: size and overrides) on the meta device."""
    return meta_model(**OmegaConf.to_container(cfg.model))


def model_shapes_of(cfg: DictConfig) -> ParamShapes:
    """ParamShapes of a run's model."""
    return param_shapes(run_model(cfg))


def accounted_run(cfg: DictConfig, model: nn.Module) -> AccountedMethod:
    """What a run sends and keeps (lowcomm.cost.method.AccountedMethod): its sync options and the rank its
    optimizer's options dataclass declares: `rank` (a low-rank optimizer, resolved on `model`), or else
    `rank_fraction` (the Dion family), or neither (a full-rank optimizer)."""
    sections = parse_sections(cfg)
    opts, sync = sections.optim, sections.sync
    declared = {f.name for f in dataclasses.fields(opts)}
    if "rank" in declared:
        return AccountedMethod(sync, rank=resolve_rank(opts, model))
    return AccountedMethod(sync, rank_fraction=opts.rank_fraction if "rank_fraction" in declared else None)


def analytic_bytes(run: RunResult) -> float:
    """Bytes per worker per step the analytic model gives for the run (amortized over its steps; Ada-Orth-Dion at
    its rank cap)."""
    c = run.config
    model = run_model(c)
    per_kind = analytic_bytes_per_step(accounted_run(c, model), param_shapes(model),
                                       c.train.devices * c.train.num_nodes, steps=run.record["steps"])
    return sum(per_kind.values())


def communication_table(results: list[RunResult], params: TableSpec) -> dict[str, pd.DataFrame]:
    """Measured bytes (beside the analytic model's), collectives, step time and state per method at this size, and
    the modeled time per step and time to the target loss (the worst final validation loss of the rows, so that
    every row reaches it) at each bandwidth."""
    runs = per_run_frame(results)
    runs["analytic_bytes_per_step"] = [analytic_bytes(r) for r in results]
    table = summarize(runs)
    add_times_to_common_target(table, mean_curves(results), params.get("bandwidths_gbps", list(BANDWIDTHS_GBPS)),
                               params.get("latency_s", LATENCY_S))
    return {"table": table}


def measured_elapsed(run: RunResult) -> pd.Series:
    """Training seconds elapsed at each logged step (validation excluded): the sum over the logged intervals of
    steps in the interval x tokens per step / tokens per second."""
    m = run.metrics[run.metrics["tokens_per_s"].notna() & (run.metrics["tokens_per_s"] > 0)]
    steps = m["step"].diff().fillna(m["step"].iloc[0])
    elapsed = (steps * run.tokens_per_step / m["tokens_per_s"]).cumsum()
    return pd.Series(elapsed.values, index=m["step"].values)


def time_to_reach(run: RunResult, target: float) -> float:
    """Measured training seconds until the validation loss reaches `target` (linear between validation points;
    the elapsed time at a validation step is interpolated between the logged steps around it)."""
    elapsed = measured_elapsed(run)
    curve = run.validation_curve()
    steps = [0.0, *elapsed.index]
    seconds = [0.0, *elapsed.values]
    times = [float(np.interp(step, steps, seconds)) for step in curve["step"]]
    return steps_to_reach(times, list(curve["val_loss"]), target)


def emulated_network_table(results: list[RunResult], params: TableSpec) -> dict[str, pd.DataFrame]:
    """Runs over the emulated network (rows: method at link rate, lowcomm.training.emulated_network) beside the
    model of lowcomm.cost.wallclock. Measured: seconds per step (training time / steps) and to the target.
    Modeled: t_compute + 8 B / R + latency x collectives at the run's measured link rate R, t_compute being the
    method's median over its runs of (measured s/step - modeled communication): each run's compute, `compute_run_s`,
    varies from run to run on a shared CPU, and the median over the rates keeps one slow or fast run from setting
    the method's line. Steps to the target x t_step gives the modeled time to it. The target is a loss every row
    reaches: the worst final loss raised by `target_margin` of the way back to the initial loss. `crossover` pairs
    [a, b] give the link rate below which a reaches the target before b, measured (log-linear between the rates
    run) and modeled."""
    latency = params.get("latency_s", LATENCY_S)
    runs = per_run_frame(results)
    runs["link_rate_mbit"] = runs["sweep_value"].astype(float)
    runs["link_rate_measured_mbit"] = [float(np.mean(r.record.get("link_rate_measured_mbit", [math.nan])))
                                       for r in results]
    runs["step_time_measured_s"] = [measured_elapsed(r).iloc[-1] / r.record["steps"] for r in results]
    worst, initial = runs["final_val_loss"].max(), runs["initial_val_loss"].mean()
    target = float(worst + params.get("target_margin", 0.1) * (initial - worst))
    runs["steps_to_target"] = [_reach(r.validation_curve().set_index("step")["val_loss"], target) for r in results]
    runs["time_to_target_measured_s"] = [time_to_reach(r, target) for r in results]
    table = summarize(runs, ("step_time_measured_s", "time_to_target_measured_s"))
    table["target_loss"], table["modeled_latency_s"] = target, latency
    communication = [step_time(0.0, b, n, rate / 1e3, latency) for b, n, rate in zip(
        table["bytes_per_step/total"], table["collectives_per_step"], table["link_rate_measured_mbit"])]
    table["compute_run_s"] = table["step_time_measured_s"] - communication
    table["compute_s"] = table.groupby("method")["compute_run_s"].transform("median")
    table["step_time_modeled_s"] = table["compute_s"] + communication
    table["step_time_ratio"] = table["step_time_measured_s"] / table["step_time_modeled_s"]
    table["time_to_target_modeled_s"] = table["steps_to_target"] * table["step_time_modeled_s"]
    table["time_to_target_ratio"] = table["time_to_target_measured_s"] / table["time_to_target_modeled_s"]
    return {"table": table, "crossover": crossover_rates(table, params.get("crossover", []), latency)}


def crossover_rates(table: pd.DataFrame, pairs: list[list[str]], latency_s: float) -> pd.DataFrame:
    """Per pair [a, b] of methods: the link rate (Mbit/s) below which a reaches the target before b. Measured:
    log-linear interpolation of log(time_a / time_b) between the two rates run where its sign changes (NaN where it
    does not change). Modeled: lowcomm.cost.wallclock.crossover_rate_mbit with the median over the rates of each
    method's steps to target S, compute c, bytes B and collectives n."""
    rows = []
    for a, b in pairs:
        ta = table[table["method"] == a].set_index("link_rate_mbit")
        tb = table[table["method"] == b].set_index("link_rate_mbit")
        rates = sorted(set(ta.index) & set(tb.index))
        logs = [math.log(ta.loc[r, "time_to_target_measured_s"] / tb.loc[r, "time_to_target_measured_s"])
                for r in rates]
        measured = math.nan
        for (r0, l0), (r1, l1) in zip(zip(rates, logs), zip(rates[1:], logs[1:])):
            if l0 * l1 <= 0 and l0 != l1:
                measured = math.exp(math.log(r0) + l0 / (l0 - l1) * (math.log(r1) - math.log(r0)))

        def medians(frame: pd.DataFrame) -> list[float]:
            return [float(frame[c].median()) for c in
                    ("steps_to_target", "compute_s", "bytes_per_step/total", "collectives_per_step")]
        modeled = crossover_rate_mbit(*medians(ta), *medians(tb), latency_s)
        rows.append({"a": a, "b": b, "rates_mbit": " ".join(f"{r:g}" for r in rates),
                     "crossover_measured_mbit": measured, "crossover_modeled_mbit": modeled})
    return pd.DataFrame(rows, columns=["a", "b", "rates_mbit", "crossover_measured_mbit", "crossover_modeled_mbit"])


def stability_table(results: list[RunResult], params: TableSpec) -> dict[str, pd.DataFrame]:
    """Per label: loss over seeds and the median full / low balance (update_balance); `spread`: per run label (a
    sweep's values together: the noise reruns of one config are one row) the loss over its runs and the spread
    (sample std over runs) of the validation loss at every validation step (`val_std/<step>`); `loss_spread`: per
    logged step, the sample std over each run label's runs of the training loss (noise reruns read the same batches,
    so theirs is how far the runs have drifted apart); `runs`: one row per
    run with the seed of its initialization (train.seed), of its data order (data.seed) and of its weight noise
    (train.init_noise_seed where train.init_noise > 0), its validation loss at every validation step and its
    balance."""
    runs = per_run_frame(results)
    rows = []
    for r in results:
        t = r.config.train
        curve = r.validation_curve().set_index("step")["val_loss"]
        rows.append({"label": r.method, "run": r.name, "init_seed": int(t.seed), "data_seed": int(r.config.data.seed),
                     "noise_seed": int(t.init_noise_seed) if t.get("init_noise", 0) else math.nan,
                     "balance": update_balance(r), **{f"val/{s}": v for s, v in curve.items() if s > 0}})
    per_run = pd.DataFrame(rows)
    runs["balance"] = per_run["balance"].values
    val_columns = [c for c in per_run if c.startswith("val/")]
    spread = per_run.groupby("label", sort=False).agg(
        runs=("run", "size"), final_val_loss=(val_columns[-1], "mean"), balance=("balance", "median"),
        **{c.replace("val/", "val_std/"): (c, sample_std) for c in val_columns}).reset_index()
    losses = pd.concat([r.metrics.dropna(subset=["loss"]).set_index("step")["loss"].rename(r.name) for r in results],
                       axis=1)
    labels = {r.name: r.method for r in results}
    loss_spread = losses.T.groupby(labels, sort=False).agg(sample_std).T.rename_axis("step").reset_index()
    return {"table": summarize(runs), "spread": spread, "loss_spread": loss_spread, "runs": per_run}


@dataclass(frozen=True)
class TableKind:
    """A table kind: its builder (finished runs and the table spec -> named tables), the columns of table.md's main
    table (an entry ending in "/" shows every column it prefixes; table.csv keeps every column) and the columns
    printed at the end of an experiment run (`compact`; the shown ones when empty)."""

    build: Callable[[list[RunResult], TableSpec], dict[str, pd.DataFrame]]
    shown: Sequence[str]
    compact: Sequence[str] = ()
    needs: Sequence[str] = ()  # the parameters its spec must give (each not empty)
    accepts: Sequence[str] = ()  # the others it reads (its builder's, and its figure's)


METHODS_PARAMS = ("baselines", "state_baseline", "bandwidth_gbps", "latency_s", "target_bandwidths_gbps", "compare")
KINDS: dict[str, TableKind] = {
    "methods": TableKind(
        methods_table,
        ["label", "seeds", "final_val_loss", "final_val_loss_std", "final_val_ppl", "final_val_ppl_std", "downstream",
         "downstream/", "bytes_per_step/total", "bytes_ratio_to_ddp", "bytes_ratio_to_lowrank_ddp",
         "optimizer_state_bytes", "state_ratio_to_adamw", "matrix_moments_ratio", "error_feedback_bytes",
         "anchor_bytes", "time_to_final_s_10gbps"],
        ["label", "seeds", "final_val_loss", "final_val_ppl", "bytes_per_step/total", "bytes_ratio_to_ddp",
         "state_ratio_to_adamw", "downstream/heldout_passage_ending/acc"],
        accepts=METHODS_PARAMS),
    "stagnation": TableKind(
        stagnation_table,
        ["label", "seeds", "omega", "weight_decay", "qh_scale", "qh_denominator", "final_val_loss",
         "final_val_loss_std", "final_val_ppl", "angle_max_over_syncs", "angle_median_over_syncs", "balance"],
        accepts=("settings", "compare")),
    "sweep": TableKind(
        sweep_table,
        ["label", "sweep_value", "seeds", "final_val_loss", "final_val_loss_std", "final_val_ppl",
         "final_val_ppl_std"],
        accepts=("compare",)),
    "nu": TableKind(
        nu_table,
        ["label", "sweep_value", "seeds", "rank", "sqrt_rank", "nu_mean_over_training", "nu_mean_over_training_std",
         "nu_max_over_training", "spectral/nu_mean", "final_val_loss"]),
    "spectral": TableKind(
        methods_table,
        ["label", "seeds", "final_val_loss", "final_val_loss_std", "final_val_ppl", "final_val_ppl_std",
         "bytes_per_step/total", "bytes_ratio_to_ddp", "optimizer_state_bytes", "state_ratio_to_adamw",
         "nu_mean_over_training", "probe_cosine_mean_over_syncs"],
        ["label", "seeds", "final_val_loss", "final_val_ppl", "bytes_ratio_to_ddp", "state_ratio_to_adamw",
         "nu_mean_over_training"],
        accepts=METHODS_PARAMS),
    "beta": TableKind(
        beta_table,
        ["label", "sweep_value", "seeds", "final_val_loss", "final_val_loss_std", "final_val_ppl"],
        needs=("reference",), accepts=("reference_of",)),
    "convergence": TableKind(
        convergence_table,
        ["label", "seeds", "final_val_loss", "final_val_loss_std", "steps_to_target", "steps_to_target_std",
         "steps_to_target_n", "step_time_s", "time_to_target_s", "active_rank_share_over_training"],
        needs=("target",), accepts=("compare",)),
    "modeled_time": TableKind(
        communication_table,
        ["label", "seeds", "bytes_per_step/total", "analytic_bytes_per_step", "collectives_per_step", "step_time_s",
         "optimizer_state_bytes", "final_val_loss", "steps_to_target", "t_step_s_1gbps", "t_step_s_10gbps",
         "t_step_s_100gbps", "time_to_target_s_1gbps", "time_to_target_s_10gbps", "time_to_target_s_100gbps"],
        ["label", "seeds", "final_val_loss", "bytes_per_step/total", "step_time_s", "steps_to_target",
         "time_to_target_s_1gbps", "time_to_target_s_100gbps"],
        accepts=("bandwidths_gbps", "latency_s")),
    "gap_by_horizon": TableKind(
        horizon_table,
        ["label", "sweep_value", "seeds", "final_val_loss", "final_val_loss_std", "baseline_steps_to_final"],
        needs=("baseline",), accepts=("compare",)),
    "emulated_network": TableKind(
        emulated_network_table,
        ["label", "link_rate_mbit", "link_rate_measured_mbit", "seeds", "final_val_loss", "bytes_per_step/total",
         "collectives_per_step", "compute_run_s", "compute_s", "step_time_measured_s", "step_time_modeled_s",
         "step_time_ratio", "target_loss", "steps_to_target", "time_to_target_measured_s", "time_to_target_modeled_s",
         "time_to_target_ratio"],
        accepts=("latency_s", "target_margin", "crossover")),
    "stability": TableKind(
        stability_table,
        ["label", "seeds", "final_val_loss", "final_val_loss_std", "balance"],
        accepts=("balance_of",)),
    "gap": TableKind(
        gap_table,
        ["label", "train.devices", "sync.outer_lr", "sync.outer_momentum", "optim.lr", "seeds", "final_val_loss",
         "final_val_loss_std", "baseline", "baseline_loss", "gap", "gap_low", "gap_high", "gap_n", "gap_pct",
         "gap_pct_low", "gap_pct_high", "paper_gap_pct"],
        needs=("gaps", "settings"), accepts=("paper_pct", "compare")),
    "choice": TableKind(
        choice_table,
        ["label", "optim.name", "train.devices", "sync.outer_lr", "sync.outer_momentum", "optim.lr", "optim.omega",
         "optim.qh_scale", "optim.qh_denominator", "seeds", "mean", "std", "diff_to_winner", "ci_low", "ci_high",
         "chosen", "tie", "edge"],
        needs=("settings",), accepts=("group", "features")),
}


def columns(table: pd.DataFrame, entries: Sequence[str]) -> list[str]:
    """The table's columns that `entries` name, in entry order (an entry ending in "/" names every column it
    prefixes)."""
    return [c for entry in entries for c in table if c == entry or entry.endswith("/") and c.startswith(entry)]


def compact_columns(table: pd.DataFrame, spec: TableSpec) -> list[str]:
    """The columns of the printed view that the table holds: the spec's `compact`, else its kind's, else the kind's
    table.md columns."""
    kind = table_kind(spec)
    return columns(table, spec.compact or kind.compact or kind.shown)


def table_kind(spec: TableSpec) -> TableKind:
    """The kind the table spec names; a ConfigError lists the kinds."""
    if spec.kind not in KINDS:
        raise ConfigError(f"table.kind={spec.kind!r} is unknown: use one of {sorted(KINDS)}")
    return KINDS[spec.kind]


def check_table(spec: TableSpec) -> TableKind:
    """The spec's kind, its needed parameters given and its `features` known, or a ConfigError that names the fix
    (the runner checks before its first run trains)."""
    kind = table_kind(spec)
    missing = [name for name in kind.needs if name not in spec or spec[name] in (None, [], {}, "")]
    if missing:
        raise ConfigError(f"table kind {spec.kind!r} needs {', '.join(missing)}: add it to the table spec")
    unread = sorted(set(spec.params) - {*kind.needs, *kind.accepts})
    if unread:
        raise ConfigError(f"table kind {spec.kind!r} reads no {unread}: its parameters are "
                          f"{sorted({*kind.needs, *kind.accepts})}")
    unknown = [name for name in spec.get("features", []) if name not in RUN_FEATURES]
    if unknown:
        raise ConfigError(f"table.features names {unknown[0]!r}: use one of {sorted(RUN_FEATURES)}")
    rows = [pair[0] for pair in spec.get("gaps", [])]
    if len(rows) != len(set(rows)):
        raise ConfigError(f"table.gaps gives a row more than one baseline ({rows}): one pair per row")
    return kind


def table_of_rows(spec: TableSpec, labels: list[str]) -> TableSpec:
    """The spec for a table of the rows `labels` only (the runner's --labels): a gap table keeps the gaps and paper
    numbers of those rows, or a ConfigError names a kept row's baseline that `labels` leaves out."""
    if "gaps" not in spec:
        return spec
    gaps = [pair for pair in spec["gaps"] if pair[0] in labels]
    if not gaps:
        raise ConfigError(f"--labels {','.join(labels)} keeps no row of the table's gaps: add one of "
                          f"{[a for a, _ in spec['gaps']]}")
    left_out = sorted({b for _, b in gaps} - set(labels))
    if left_out:
        raise ConfigError(f"--labels {','.join(labels)} leaves out {left_out}, the baseline of a gap the table shows: "
                          f"add it (--labels {','.join([*labels, *left_out])})")
    paper = {a: pct for a, pct in spec.get("paper_pct", {}).items() if a in labels}
    return dataclasses.replace(spec, params=frozen_map({**spec.params, "gaps": gaps, "paper_pct": paper}))


def build_tables(spec: TableSpec, results: list[RunResult]) -> dict[str, pd.DataFrame]:
    """The tables of the spec's kind from the finished runs."""
    return check_table(spec).build(results, spec)


def downstream_sources(table: pd.DataFrame) -> str:
    """One line naming the data each downstream task ran on ('' without downstream columns): the offline task's
    files shipped with the package (lowcomm/eval/task_files/), a local copy (a `<task>_local` task of
    lowcomm.eval.local_tasks), the hub, or none (needs hub)."""
    tasks = list(dict.fromkeys(c.split("/")[1] for c in table if c.startswith("downstream/")))
    if not tasks:
        return ""

    def source(task: str) -> str:
        words = table.get(f"downstream/{task}")
        if words is not None and words.astype(str).str.contains("needs hub").all():
            return "not run (needs the hub)"
        if task == OFFLINE_TASK:
            return f"local files (lowcomm/eval/task_files/{OFFLINE_TASK}/)"
        return "local copy" if task.endswith(LOCAL_SUFFIX) else "hub"
    return "Downstream data: " + "; ".join(f"{task}: {source(task)}" for task in tasks) + "."


def markdown(tables: dict[str, pd.DataFrame], spec: TableSpec) -> str:
    """table.md: the kind's shown columns of the main table and the spec's `show` columns (and the downstream data
    line and the commits of its runs), then every other table that has rows, whole."""
    parts = []
    for name, table in tables.items():
        if name != "table" and table.empty:
            continue
        shown = list(table.columns) if name != "table" else columns(table, (*table_kind(spec).shown, *spec.show))
        notes = []
        if name == "table":
            commits = commits_named(table)
            notes = [downstream_sources(table), f"Runs at {commits}." if commits else ""]
        parts.append(f"### {name}\n\n" + table[shown].to_markdown(index=False, floatfmt=".4g")
                     + "".join(f"\n\n{note}" for note in notes if note))
    return "\n\n".join(parts) + "\n"
