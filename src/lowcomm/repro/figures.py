"""`make figures`: one figure per stored experiment and preset, drawn from results/ only (no training, no number typed
in here): paper_figures/<experiment>_<preset>.png and .pdf.

Reads results/<experiment>/<preset>/table.csv (which names each row's runs), the runs' metrics.csv and record.json,
and for the modeled_time figure also the experiment's analytic.csv. Bands are the min-max over seeds. Files that cannot
be read follow the rule of lowcomm.stored.

    python -m lowcomm.repro.figures [results_dir] [out_dir]
"""

from __future__ import annotations

import argparse
import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from lowcomm.config import ConfigError  # noqa: E402
from lowcomm.optim.dion import Dion  # noqa: E402
from lowcomm.repro.accounting import ACCOUNTING_FIX  # noqa: E402
from lowcomm.repro.spec import ExperimentSpec, TableSpec, reported  # noqa: E402
from lowcomm.repro.store import FIGURES, RESULTS, ResultsStore, StoredPreset  # noqa: E402
from lowcomm.repro.tables import basis_change_rows  # noqa: E402
from lowcomm.stored import StoredFileError, counting_skipped  # noqa: E402

ANGLE_FLOOR = 1e-7  # angles below this (exact zeros included) are drawn at it on the log scale
BAND = ("pi", 100)  # min-max over seeds


def keep_columns(frame: pd.DataFrame, columns: list[str] | None) -> list[str]:
    """`step` and the columns named (an entry ending in "/" names every column it prefixes); all when None."""
    return [c for c in frame if columns is None or c == "step" or c in columns or
            any(c.startswith(p) for p in columns if p.endswith("/"))]


def metric_rows(stored: StoredPreset, columns: list[str] | None = None) -> pd.DataFrame:
    """Every metrics.csv row of the experiment's runs with its label and seed (only `columns` when given)."""
    return pd.concat([r.metrics[keep_columns(r.metrics, columns)].assign(label=r.label, seed=r.seed)
                      for r in stored.runs()], ignore_index=True)


def records(stored: StoredPreset) -> pd.DataFrame:
    """One row per run: label, method and sweep value of its table row, seed and the record's scalars."""
    return pd.DataFrame([{"label": r.label, "method": r.method, "sweep_value": r.sweep_value, "seed": r.seed,
                          **{k: v for k, v in r.record.items() if isinstance(v, (int, float))}}
                         for r in stored.runs()])


def label_palette(stored: StoredPreset) -> dict[str, tuple]:
    """One colour per row label of table.csv, in table order, shared by every panel of a figure."""
    labels = list(stored.table()["label"])
    return dict(zip(labels, sns.color_palette(n_colors=len(labels))))


def validation_panel(ax, stored: StoredPreset, title: str = "validation loss") -> pd.DataFrame:
    rows = metric_rows(stored, ["val_loss"]).dropna(subset=["val_loss"])
    sns.lineplot(rows, x="step", y="val_loss", hue="label", palette=label_palette(stored), errorbar=BAND, ax=ax)
    later = rows[rows["step"] > 0]["val_loss"]
    if len(later):
        ax.set_ylim(top=later.max() * 1.02)
    ax.set(xlabel="step", ylabel="validation loss (nats)", title=title)
    return rows


def sync_angle_rows(stored: StoredPreset) -> pd.DataFrame:
    """subspace/max_angle and subspace/angle/<matrix> at each change of basis of each run (tables.basis_change_rows),
    floored at ANGLE_FLOOR for the log scale."""
    columns = ["subspace/max_angle", "subspace/angle/"]
    frames = [(r, basis_change_rows(r)) for r in stored.runs()]
    frames = [f[keep_columns(f, columns)].assign(label=r.label, seed=r.seed) for r, f in frames if len(f)]
    if not frames:
        return pd.DataFrame()
    rows = pd.concat(frames, ignore_index=True)
    angle_cols = [c for c in rows if c.startswith("subspace/")]
    rows[angle_cols] = rows[angle_cols].clip(lower=ANGLE_FLOOR)
    return rows


def draw_methods(fig, stored: StoredPreset) -> None:
    ax1, ax2 = fig.subplots(1, 2)
    validation_panel(ax1, stored)
    table = stored.table()
    sns.barplot(table, x="label", y="bytes_per_step/total", hue="label", ax=ax2)
    ax2.set(yscale="log", xlabel="", ylabel="bytes per worker per step (measured)", title="bytes sent")
    ax2.tick_params(axis="x", rotation=45)


def draw_spectral(fig, stored: StoredPreset) -> None:
    """The methods panels, and where the runs carry the probe (the probe preset) the cosine of each sync's averaged
    pseudo-gradient to the full-batch direction of the same K steps."""
    column = "probe/pseudo_gradient_cosine"
    probe = metric_rows(stored, [column])
    probe = probe.dropna(subset=[column]) if column in probe else probe.iloc[0:0]
    if probe.empty:
        draw_methods(fig, stored)
        return
    ax1, ax2 = fig.subplots(1, 2)
    validation_panel(ax1, stored)
    sns.lineplot(probe, x="step", y=column, hue="label", palette=label_palette(stored), marker="o",
                 errorbar=BAND, ax=ax2)
    ax2.set(ylabel="cosine(Delta, full-batch direction)", title="pseudo-gradient direction at each sync")


def draw_stagnation(fig, stored: StoredPreset) -> None:
    angles = sync_angle_rows(stored)
    layers = [c for c in angles if c.startswith("subspace/angle/")]
    axes = fig.subplots(1, 3 if layers else 2)
    validation_panel(axes[0], stored)
    if len(angles):
        sns.lineplot(angles, x="step", y="subspace/max_angle", hue="label", palette=label_palette(stored),
                     errorbar=BAND, marker="o", ax=axes[1])
    axes[1].set(yscale="log", xlabel="sync step", ylabel="largest principal angle (rad)",
                title="basis movement per sync, max over layers")
    if layers:
        per_layer = angles.melt(id_vars=["label", "seed", "step"], value_vars=layers, var_name="matrix",
                                value_name="angle")
        per_layer["line"] = per_layer["matrix"] + " seed " + per_layer["seed"].astype(str)
        sns.lineplot(per_layer, x="step", y="angle", hue="label", palette=label_palette(stored), units="line",
                     estimator=None, alpha=0.5, lw=0.8, ax=axes[2], legend=False)
        axes[2].set(yscale="log", xlabel="sync step", ylabel="largest principal angle (rad)",
                    title="per layer (one line per matrix)")


def sweep_panel(ax, stored: StoredPreset, y: str, xlabel: str, ylabel: str) -> None:
    runs = records(stored)
    sns.lineplot(runs, x="sweep_value", y=y, hue="method", errorbar=BAND, marker="o", ax=ax)
    ax.set(xscale="log", xlabel=xlabel, ylabel=ylabel)
    values = sorted(runs["sweep_value"].unique())
    ax.set_xticks(values, [f"{v:g}" for v in values])
    ax.minorticks_off()


def draw_rank_sweep(fig, stored: StoredPreset) -> None:
    sweep_panel(fig.subplots(), stored, "final_val_ppl", "rank r", "final validation perplexity")


def draw_batch_sweep(fig, stored: StoredPreset) -> None:
    sweep_panel(fig.subplots(), stored, "final_val_ppl", "local batch (sequences per worker)",
                "final validation perplexity")


def draw_nu(fig, stored: StoredPreset) -> None:
    ax1, ax2 = fig.subplots(1, 2)
    rows = metric_rows(stored, ["spectral/nu_mean"]).dropna(subset=["spectral/nu_mean"])
    sns.lineplot(rows, x="step", y="spectral/nu_mean", hue="label", errorbar=BAND, ax=ax1)
    ax1.set(xlabel="step", ylabel="nu_t (mean over matrices)", title="nu_t over training")
    table = stored.table()
    sns.lineplot(table, x="rank", y="nu_mean_over_training", hue="method", marker="o", ax=ax2)
    ranks = sorted(table["rank"].unique())
    ax2.plot(ranks, [r ** 0.5 for r in ranks], "k--x", label="sqrt(r): Dion's bound")
    ax2.set(xlabel="rank r", ylabel="nu_t, mean over training", title="nu_t vs r")
    ax2.legend(fontsize=7)


def published_form_points(stored: StoredPreset) -> pd.DataFrame:
    """Each run at the beta of the published form(s) it belongs to (D15, M <- ef_beta B - (ef_beta - mu) P W^T):
    the summary form R = beta (M - P P^T M) at beta = ef_beta where mu = 0, the code form R = M - beta P P^T M at
    beta = 1 - mu where ef_beta = 1. mu = 0, ef_beta = 1 lies on both; Dion's default mu is the code form's 1 - mu."""
    defaults = inspect.signature(Dion).parameters
    points = []
    for r in stored.runs():
        optim = r.config.optim
        mu = optim.get("captured_share", defaults["captured_share"].default)
        ef_beta = optim.get("ef_beta", defaults["ef_beta"].default)
        for form, beta, member in (("summary", ef_beta, mu == 0), ("code", round(1 - mu, 6), ef_beta == 1)):
            if member:
                points.append({"line": f"{optim.name} {form} form", "beta": beta, "seed": r.seed,
                               "final_val_loss": r.record["final_val_loss"]})
    return pd.DataFrame(points)


def draw_beta(fig, stored: StoredPreset) -> None:
    """Final validation loss against beta: per method (ef_beta at a fixed mu), or in a preset of the published forms
    (rows named *_code) per form, each run placed by published_form_points."""
    ax = fig.subplots()
    runs = records(stored)
    if runs["method"].str.endswith("_code").any():
        runs = published_form_points(stored).rename(columns={"line": "method", "beta": "sweep_value"})
    sns.lineplot(runs, x="sweep_value", y="final_val_loss", hue="method", errorbar=BAND, marker="o", ax=ax)
    ax.set(xlabel="error-feedback coefficient beta", ylabel="final validation loss (nats)")


def draw_lr_sweep(fig, stored: StoredPreset) -> None:
    """Final validation loss against the peak lr, one line per method; a diverged run is an x on the top edge."""
    ax = fig.subplots()
    table = stored.table()
    finite = table[table["final_val_loss"] < float("inf")]
    sns.lineplot(finite, x="sweep_value", y="final_val_loss", hue="method", marker="o", ax=ax)
    diverged = table[table["final_val_loss"] == float("inf")]
    top = finite["final_val_loss"].max()
    if len(diverged):
        ax.scatter(diverged["sweep_value"], [top] * len(diverged), marker="x", color="k", label="diverged")
    ax.set(xscale="log", xlabel="peak learning rate", ylabel="final validation loss (nats)")
    ax.legend(fontsize=7)


def draw_horizon(fig, stored: StoredPreset, params: TableSpec) -> None:
    """Per horizon T: each row's paired gap to the table's baseline at T (mean over seeds, 95 % t-interval), and the
    steps the baseline's longest run (mean curve over seeds) needs to reach the row's final loss."""
    base = params["baseline"]
    axes = fig.subplots(1, 2)
    def row_of(labels: pd.Series) -> pd.Series:  # "lordo_k8_steps1024" -> "lordo_k8"
        return labels.str.rsplit("_steps", n=1).str[0]

    table = stored.table().assign(row=lambda t: row_of(t["label"]))
    gaps = stored.table("comparisons")
    gaps = gaps[gaps["b"].str.startswith(f"{base}_steps")].assign(row=lambda t: row_of(t["a"]))
    palette = dict(zip(table["row"].unique(), sns.color_palette(n_colors=table["row"].nunique())))
    for row, rows in gaps.groupby("row", sort=False):
        axes[0].errorbar(rows["sweep_value"], rows["diff"], yerr=[rows["diff"] - rows["ci_low"],
                         rows["ci_high"] - rows["diff"]], marker="o", capsize=3, color=palette[row], label=row)
    axes[0].axhline(0, color="k", lw=0.8)
    axes[0].set(xscale="log", xlabel="training steps (horizon)", ylabel=f"final validation loss - {base}'s (nats)",
                title=f"gap to {base} (paired seeds, 95 % interval)")
    sns.lineplot(table, x="sweep_value", y="baseline_steps_to_final", hue="row", palette=palette, marker="o",
                 ax=axes[1])
    axes[1].set(xscale="log", yscale="log", xlabel="training steps (horizon)",
                ylabel=f"{base} steps to the row's final loss", title=f"steps the longest {base} run needs (mean curve)")
    horizons = sorted(table["sweep_value"].unique())
    for ax in axes:
        ax.set_xticks(horizons, [f"{v:g}" for v in horizons])
        ax.minorticks_off()
    ticks = [horizons[0] / 2, *horizons]
    axes[1].set_yticks(ticks, [f"{t:g}" for t in ticks])


def draw_convergence(fig, stored: StoredPreset) -> None:
    ax = fig.subplots()
    rows = validation_panel(ax, stored)
    table = stored.table()
    target = table["target_label"].iloc[0]
    best = rows[rows["label"] == target].groupby("seed")["val_loss"].min().mean()
    ax.axhline(best, color="k", ls="--", lw=0.8, label=f"{target}'s best (mean over seeds)")
    ax.legend(fontsize=7)


def draw_over_bandwidth(frame: pd.DataFrame, hue: str, prefix: str, ax, ylabel: str, title: str) -> None:
    """Columns `<prefix><bandwidth>gbps` of `frame` as one line per `hue` over the bandwidth (log-log)."""
    cols = [c for c in frame if c.startswith(prefix)]
    long = frame.melt(id_vars=[hue], value_vars=cols, var_name="bw", value_name="seconds")
    long["bandwidth (Gbit/s)"] = long["bw"].str.extract(r"_([\d.]+)gbps$")[0].astype(float)
    sns.lineplot(long, x="bandwidth (Gbit/s)", y="seconds", hue=hue, marker="o", ax=ax)
    ax.set(xscale="log", yscale="log", ylabel=ylabel, title=title)


def draw_emulated(fig, stored: StoredPreset) -> None:
    """Runs over the emulated network: measured time per step and to the target (points) over the model's lines
    (t_step(R) = t_compute + 8 B / R + latency x collectives, from the table's columns), per method."""
    table = stored.table()
    axes = fig.subplots(1, 2)
    rates = np.geomspace(table["link_rate_measured_mbit"].min() / 2, table["link_rate_measured_mbit"].max() * 2, 50)
    palette = dict(zip(table["method"].unique(), sns.color_palette(n_colors=table["method"].nunique())))
    for method, rows in table.groupby("method", sort=False):
        first = rows.iloc[0]
        modeled = (first["compute_s"] + 8 * first["bytes_per_step/total"] / (rates * 1e6)
                   + first["modeled_latency_s"] * first["collectives_per_step"])
        for ax, measured, scale in ((axes[0], "step_time_measured_s", 1.0),
                                    (axes[1], "time_to_target_measured_s", rows["steps_to_target"].median())):
            ax.plot(rates, modeled * scale, color=palette[method], lw=1, label=method)
            ax.scatter(rows["link_rate_measured_mbit"], rows[measured], color=palette[method], s=18, zorder=3)
    axes[0].set(xscale="log", yscale="log", xlabel="link rate (Mbit/s, measured)", ylabel="seconds per step",
                title="measured (points) and modeled (lines)")
    axes[1].set(xscale="log", yscale="log", xlabel="link rate (Mbit/s, measured)",
                ylabel=f"seconds to validation loss {table['target_loss'].iloc[0]:.3f}", title="time to the target")
    axes[0].legend(fontsize=7)


def draw_communication(fig, stored: StoredPreset) -> None:
    if "step_time_measured_s" in stored.table().columns:
        return draw_emulated(fig, stored)
    analytic_path = stored.experiment_file("analytic.csv")
    axes = fig.subplots(1, 2 if analytic_path.exists() else 1, squeeze=False)[0]
    table = stored.table()
    draw_over_bandwidth(table, "label", "time_to_target_s_", axes[0], "modeled time to the target loss (s)",
                        f"measured size; latency {table['modeled_latency_s'].iloc[0]:g} s per collective")
    if len(axes) > 1:
        analytic = stored.store.experiment_table(stored.experiment, "analytic", ACCOUNTING_FIX)
        largest = analytic[analytic["size"] == analytic.sort_values("steady_mb")["size"].iloc[-1]]
        draw_over_bandwidth(largest, "method", "comm_s_", axes[1], "time on the wire per step (s, analytic)",
                            f"{largest['size'].iloc[0]}, latency {analytic['latency_s'].iloc[0]:g} s")


def draw_loss_vs_bytes(fig, stored: StoredPreset) -> None:
    """Validation loss curves, and each run's final validation loss against the bytes it sent per worker per step
    (one point per method and seed, log scale)."""
    axes = fig.subplots(1, 2)
    validation_panel(axes[0], stored)
    runs = records(stored)
    sns.scatterplot(runs, x="bytes_per_step/total", y="final_val_loss", hue="label", palette=label_palette(stored),
                    ax=axes[1], s=30)
    axes[1].set(xscale="log", xlabel="bytes sent per worker per step", ylabel="final validation loss (nats)",
                title="loss against bytes (one point per run)")


def draw_loss_only(fig, stored: StoredPreset) -> None:
    validation_panel(fig.subplots(), stored)


def draw_stability(fig, stored: StoredPreset, params: TableSpec) -> None:
    """Per run label (the noise reruns of one config together): the spread over its runs of the training loss at
    every logged step (over the seeds, or over the noise reruns, which read the same batches), every run's
    validation loss, and the balance per kind of matrix of the table's `balance_of` row (else the first row with a
    full-rank term): update_rms/full/<matrix> over update_rms/low/<matrix>, median over its runs and layers."""
    axes = fig.subplots(1, 3)
    columns = ["loss", "val_loss", "update_rms/"]
    rows = pd.concat([r.metrics[keep_columns(r.metrics, columns)].assign(label=r.method, seed=r.name)
                      for r in stored.runs()], ignore_index=True)
    palette = dict(zip(rows["label"].unique(), sns.color_palette(n_colors=rows["label"].nunique())))
    spread = rows.dropna(subset=["loss"]).groupby(["label", "step"])["loss"].std().reset_index()
    sns.lineplot(spread, x="step", y="loss", hue="label", palette=palette, ax=axes[0])
    axes[0].set(yscale="log", xlabel="step", ylabel="std over runs (nats)", title="training loss: spread over runs")
    val = rows.dropna(subset=["val_loss"])
    sns.lineplot(val[val["step"] > 0], x="step", y="val_loss", hue="label", units="seed", estimator=None,
                 palette=palette, lw=0.8, ax=axes[1])
    axes[1].set(xlabel="step", ylabel="validation loss (nats)", title="every run")
    full = [c for c in rows if c.startswith("update_rms/full/")]
    with_full = [label for label, group in rows.groupby("label", sort=False)
                 if full and (group[full].fillna(0) > 0).any().any()]
    if with_full:
        shown = params.get("balance_of", with_full[0])
        runs = rows[rows["label"] == shown].dropna(subset=full)
        ratios = pd.concat([pd.DataFrame({"step": runs["step"], "matrix": c.rsplit(".", 2)[-2],
                                          "ratio": runs[c] / runs[c.replace("/full/", "/low/")]}) for c in full])
        sns.lineplot(ratios, x="step", y="ratio", hue="matrix", estimator="median", errorbar=None, ax=axes[2])
        axes[2].axhline(1, color="k", lw=0.8)
        axes[2].set(yscale="log", xlabel="step", ylabel="full / low (RMS of the applied terms)",
                    title=f"{shown}: balance per kind of matrix")


def draw_balance(fig, stored: StoredPreset) -> None:
    """LoRDO's full-rank balance: final validation loss (mean and min-max over the tuning seeds), the median over the
    syncs of the largest principal angle between consecutive bases, and the full / low balance, each against omega,
    one line per qh_scale and qh_denominator."""
    table = stored.table()
    runs = records(stored).merge(table[["label", "qh_scale", "qh_denominator"]], on="label")
    runs["setting"] = [f"mu {m:g}, {d}" for m, d in zip(runs["qh_scale"], runs["qh_denominator"])]
    runs["omega"] = runs["sweep_value"].astype(float)
    angles = table[["omega", "angle_median_over_syncs", "balance"]].assign(
        setting=[f"mu {m:g}, {d}" for m, d in zip(table["qh_scale"], table["qh_denominator"])])
    axes = fig.subplots(1, 3)
    sns.lineplot(runs, x="omega", y="final_val_loss", hue="setting", marker="o", errorbar=BAND, ax=axes[0])
    axes[0].set(xlabel="omega", ylabel="final validation loss (nats)", title="loss over the tuning seeds")
    for ax, column, title in ((axes[1], "angle_median_over_syncs", "median largest angle per sync (rad)"),
                              (axes[2], "balance", "full / low (median over steps)")):
        sns.lineplot(angles, x="omega", y=column, hue="setting", marker="o", ax=ax, legend=False)
        ax.set(xlabel="omega", ylabel=title, yscale="log")


def setting_text(key: str, value) -> str:
    """'qh_scale 6' for the dotted key optim.qh_scale at 6.0: the key's last part and the value (a number shortest)."""
    return f"{key.rsplit('.', 1)[-1]} {value:g}" if isinstance(value, float) else f"{key.rsplit('.', 1)[-1]} {value}"


def ticks_at_values(ax, values: pd.Series) -> None:
    """The x axis ticked at each distinct value, written shortest (1e-02 as 0.01), without minor ticks."""
    ticks = sorted(values.unique())
    ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
    ax.minorticks_off()


def draw_choice(fig, stored: StoredPreset, params: TableSpec) -> None:
    """A `choice` table's grid: final validation loss (mean and min-max over the tuning seeds) against its first
    setting (on a log axis where it spans a factor above 3, as lrs do), one line per group (e.g. optimizer and worker
    count) and value of its second setting, or without groups one line per value of the other settings; the winner
    of each group starred, the grid's values on the axis; the legend right of the axes."""
    settings, group = list(params["settings"]), list(params.get("group", []))
    table = stored.table()
    lines = group or settings[1:]
    named = [[setting_text(key, value) for value in table[key]] for key in lines]
    keyed = table[["label", *settings]].assign(line=[", ".join(parts) for parts in zip(*named)] if lines else "")
    runs = records(stored).merge(keyed, on="label")
    ax = fig.subplots()
    style = settings[1] if group and len(settings) > 1 else None
    sns.lineplot(runs, x=settings[0], y="final_val_loss", hue="line", style=style, marker="o", errorbar=BAND, ax=ax)
    chosen = table[table["chosen"]]
    ax.scatter(chosen[settings[0]], chosen["mean"], marker="*", s=160, color="k", zorder=5, label="chosen")
    x = table[settings[0]]
    spans = pd.api.types.is_numeric_dtype(x) and x.min() > 0 and x.max() > 3 * x.min()
    ax.set(xscale="log" if spans else "linear", xlabel=settings[0],
           ylabel="final validation loss (nats)", title="mean over the tuning seeds")
    if spans:
        ticks_at_values(ax, x)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1), borderaxespad=0)


def draw_gap(fig, stored: StoredPreset, params: TableSpec) -> None:
    """A `gap` table: each row's gap to its baseline in % of the baseline's loss (mean over the paired seeds, 95 %
    interval) against its first setting (e.g. the worker count M, on a log-2 axis where it is positive), one line
    per baseline, the paper's gap beside each point (a cross)."""
    x = params["settings"][0]
    table = stored.table().dropna(subset=["gap_pct"]).sort_values(x, kind="stable")
    ax = fig.subplots()
    palette = dict(zip(table["baseline"].unique(), sns.color_palette(n_colors=table["baseline"].nunique())))
    for base, rows in table.groupby("baseline", sort=False):
        ax.errorbar(rows[x], rows["gap_pct"], yerr=[rows["gap_pct"] - rows["gap_pct_low"],
                    rows["gap_pct_high"] - rows["gap_pct"]], marker="o", capsize=3, color=palette[base],
                    label=f"against {base}")
        paper = rows.dropna(subset=["paper_gap_pct"])
        ax.scatter(paper[x], paper["paper_gap_pct"], marker="x", s=60, color=palette[base],
                   label=f"the paper, against {base}")
    ax.axhline(0, color="k", lw=0.8)
    if pd.api.types.is_numeric_dtype(table[x]) and table[x].min() > 0:
        ax.set_xscale("log", base=2)
        ticks_at_values(ax, table[x])
    ax.set(xlabel=x, ylabel="gap to the baseline (% of its loss)", title="paired seeds, 95 % interval")
    ax.legend(fontsize=7)


@dataclass(frozen=True)
class FigureKind:
    """A figure kind (an experiment's `report.figure`, or a preset's `figure`): the function that draws a stored
    preset, the figure's size in inches, and whether the function reads the preset's table spec (its third
    argument)."""

    draw: Callable
    size: tuple[float, float]
    uses_table: bool = False


FIGURE_KINDS: dict[str, FigureKind] = {
    "methods": FigureKind(draw_methods, (11, 4)),
    "stagnation": FigureKind(draw_stagnation, (16, 4.5)),
    "loss_by_rank": FigureKind(draw_rank_sweep, (6, 4)),
    "batch_sweep": FigureKind(draw_batch_sweep, (6, 4)),
    "nu": FigureKind(draw_nu, (11, 4)),
    "beta": FigureKind(draw_beta, (6, 4)),
    "convergence": FigureKind(draw_convergence, (6, 4)),
    "modeled_time": FigureKind(draw_communication, (12, 4.5)),
    "spectral": FigureKind(draw_spectral, (11, 4)),
    "lr_grid": FigureKind(draw_lr_sweep, (7, 4.5)),
    "loss_vs_bytes": FigureKind(draw_loss_vs_bytes, (12, 4.5)),
    "loss": FigureKind(draw_loss_only, (6, 4)),
    "gap_by_horizon": FigureKind(draw_horizon, (12, 4.5), uses_table=True),
    "stability": FigureKind(draw_stability, (16, 4.5), uses_table=True),
    "balance": FigureKind(draw_balance, (16, 4.5)),
    "choice": FigureKind(draw_choice, (9, 4.5), uses_table=True),
    "gap": FigureKind(draw_gap, (7, 4.5), uses_table=True),
}


def draw(stored: StoredPreset, spec: ExperimentSpec) -> Path:
    """The figure of one stored preset (the kind its preset names, else the experiment's) as <figure>.png and .pdf
    (stable bytes: no creation date); returns the .png."""
    kind = FIGURE_KINDS[spec.figure_of(stored.preset)]
    fig = plt.figure(figsize=kind.size)
    if kind.uses_table:
        kind.draw(fig, stored, spec.table_of(stored.preset))
    else:
        kind.draw(fig, stored)
    for ax in fig.axes:
        if isinstance(ax.yaxis.get_major_formatter(), matplotlib.ticker.ScalarFormatter):
            ax.yaxis.get_major_formatter().set_useOffset(False)  # absolute values on the axis, no "+5.372"
        legend = ax.get_legend()
        if legend is not None and legend.get_bbox_to_anchor() is ax.bbox:  # one placed outside the axes stays there
            sns.move_legend(ax, "best", fontsize=7, title=None)
    fig.suptitle(f"{stored.experiment} ({stored.preset} preset)")
    fig.tight_layout()
    out = stored.figure
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out.with_suffix(".png"), dpi=150, metadata={"Software": None})
    fig.savefig(out.with_suffix(".pdf"), metadata={"CreationDate": None, "Producer": None, "Creator": None})
    plt.close(fig)
    return out.with_suffix(".png")


def draw_all(store: ResultsStore = ResultsStore()) -> list[Path]:
    """Every stored experiment and preset's figure; returns the .png files written."""
    sns.set_theme(style="whitegrid", context="paper")
    specs = reported()
    presets = store.tabled()
    unknown = [f"{stored.experiment} {stored.preset}: {kind!r}" for stored in presets
               for kind in [specs[stored.experiment].figure_of(stored.preset)] if kind not in FIGURE_KINDS]
    if unknown:
        raise ConfigError(f"figure kinds that do not exist ({'; '.join(unknown)}): name one of {sorted(FIGURE_KINDS)} "
                          "in the preset's `figure` or the experiment's report.figure")
    return [draw(stored, specs[stored.experiment]) for stored in presets]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m lowcomm.repro.figures", description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="?", type=Path, default=RESULTS,
                        help="the stored results to draw (default results)")
    parser.add_argument("out_dir", nargs="?", type=Path, default=FIGURES,
                        help="where the figures go (default paper_figures)")
    args = parser.parse_args(argv)
    with counting_skipped():
        try:
            for path in draw_all(ResultsStore(args.results, args.out_dir)):
                print(f"wrote {path}")
        except (ConfigError, StoredFileError) as err:
            sys.exit(f"error: {err}")


if __name__ == "__main__":
    main()
