"""`python -m lowcomm.experiment experiments/<name>/config.yaml [preset] [key=value ...]`: run an experiment's
grid (runs x seeds) with `lowcomm.train` and aggregate the run records into results/<name>/<preset>/table.{csv,md}.

An experiment config:
    name: <folder under results/>
    base: <training config file the runs start from>
    presets: {<preset>: {seeds: [...], overrides: [key=value, ...]}}
    runs: [{label: <row name>, overrides: [key=value, ...]}, ...]
    table: {baselines: [<label>, ...]}   # ratio columns: bytes per step relative to each baseline
A finished run (its record.json exists) is not run again, so an interrupted experiment resumes.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
from omegaconf import OmegaConf

from .config import ConfigError, load_config
from .results import read_record
from .train import train, validate

RESULTS = Path("results")


def experiment_runs(spec, preset: str, extra: list[str]) -> list[tuple[str, int, list[str]]]:
    """(label, seed, overrides) of every run of `preset`, all validated before the first one starts."""
    if preset not in spec.presets:
        raise ConfigError(f"preset {preset!r} is not defined: choose one of {sorted(spec.presets)}")
    p = spec.presets[preset]
    runs = []
    for run in spec.runs:
        for seed in p.seeds:
            overrides = [*p.get("overrides", []), *run.overrides, *extra,
                         f"train.seed={seed}", f"data.seed={seed}"]
            validate(load_config(spec.base, overrides))
            runs.append((run.label, int(seed), overrides))
    return runs


def run_experiment(path: str, preset: str = "cpu", extra: list[str] = ()) -> Path:
    spec = OmegaConf.load(path)
    out = RESULTS / spec.name / preset
    for label, seed, overrides in experiment_runs(spec, preset, list(extra)):
        run_dir = out / "runs" / f"{label}-s{seed}"
        if (run_dir / "record.json").exists():
            continue
        cfg = load_config(spec.base, [*overrides, f"run.out_dir={run_dir.parent}", f"run.name={run_dir.name}",
                                      "train.progress_bar=false"])
        print(f"[{spec.name}/{preset}] {label} seed {seed}", flush=True)
        train(cfg)
    table = aggregate(out / "runs", [r.label for r in spec.runs], list(spec.get("table", {}).get("baselines", [])))
    write_table(table, out)
    return out


def run_rows(runs_dir: Path) -> pd.DataFrame:
    """One row per run record: label, seed and the record's scalar fields."""
    rows = []
    for record_dir in sorted(p.parent for p in runs_dir.glob("*/record.json")):
        label, seed = record_dir.name.rsplit("-s", 1)
        rows.append({"label": label, "seed": int(seed), **read_record(record_dir)})
    return pd.DataFrame(rows)


def aggregate(runs_dir: Path, labels: list[str], baselines: list[str]) -> pd.DataFrame:
    """Mean and standard deviation over seeds of the final validation loss and perplexity, bytes on the wire per
    worker per step, optimizer-state bytes; ratios of bytes per step to each baseline; the commits involved."""
    runs = run_rows(runs_dir)
    numeric = [c for c in runs.columns if c.startswith(
        ("final_val", "bytes_per_step/", "memory/", "tokens_per_s", "spectral/", "subspace/", "update_rms/"))]
    grouped = runs.groupby("label")
    table = grouped[numeric].mean()
    for col in ("final_val_loss", "final_val_ppl"):
        table[f"{col}_std"] = grouped[col].std(ddof=0)
    table["seeds"] = grouped["seed"].count()
    table["commits"] = grouped["git_commit"].agg(lambda c: " ".join(sorted(set(c))))
    table = table.reindex([label for label in labels if label in table.index])
    for base in baselines:
        if base in table.index:
            table[f"bytes_ratio_to_{base}"] = table["bytes_per_step/total"] / table.loc[base, "bytes_per_step/total"]
    return table


def write_table(table: pd.DataFrame, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    table.to_csv(out / "table.csv")
    shown = [c for c in table.columns if c in ("seeds", "memory/moments_bytes", "spectral/nu_mean")
             or c.startswith(("final_val", "bytes_per_step/total", "bytes_ratio", "subspace/"))]
    (out / "table.md").write_text(table[shown].to_markdown(floatfmt=".4g") + "\n")


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return
    preset = argv[1] if len(argv) > 1 and "=" not in argv[1] else "cpu"
    extra = [a for a in argv[1:] if "=" in a]
    try:
        out = run_experiment(argv[0], preset, extra)
    except ConfigError as err:
        sys.exit(f"error: {err}")
    print((out / "table.md").read_text())


if __name__ == "__main__":
    main()
