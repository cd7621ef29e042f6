"""`python -m lowcomm.repro.tuning`: the learning-rate protocol's choice, from the lr_sweep results, into one file.

Protocol (experiments/lr_sweep/README.md): per method, a grid of peak lr spaced by a factor of 2, seed 0; the
lowest final validation loss wins (a diverged run counts as +inf). A winner on an edge of its grid is not chosen:
the command names the point to add, and the sweep resumes with it. Methods the `claim` preset confirms at the
claim horizon (the short-horizon winner and its two neighbours) take the winner there. The Muon and Dion rows
train their non-matrix parameters (embeddings, norms) at `adamw_lr`, ddp's tuned lr.

Writes experiments/tuned_lr.yaml (read by the experiment runner through `tuned: [lr, adamw_lr]`) and
results/lr_sweep/chosen.csv (per method: the grid, each point's loss, the choice, whether it lay on an edge).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from pathlib import Path

import pandas as pd
import yaml

from lowcomm.config import ConfigError, method_preset
from lowcomm.optim import OPTIMIZERS
from lowcomm.paths import TUNED_FILE
from lowcomm.repro.tables import stored_runs

SWEEP = "lr_sweep"
# stages of the sweep, in order: a later stage's choice replaces an earlier one's for the methods it holds
STAGES = ("cpu", "cpu_spectral", "claim")
TUNED_KEYS = ("lr", "adamw_lr")
NONMATRIX_LR_FROM = "ddp"  # adamw_lr of the Muon and Dion rows: this method's tuned lr


def load_tuned(path: Path | None = None) -> dict:
    """The tuned file ({} before the first choice)."""
    path = path or TUNED_FILE
    return (yaml.safe_load(path.read_text()) or {}) if path.exists() else {}


def has_nonmatrix_lr(method: str) -> bool:
    """Whether the method's optimizer trains its non-matrix parameters at an lr of their own (`adamw_lr`)."""
    name = method_preset(method).optim.name
    return any(f.name == "adamw_lr" for f in dataclasses.fields(OPTIMIZERS[name].options))


def tuned_overrides(method: str | None, keys: list[str], path: Path | None = None) -> list[str]:
    """`optim.lr=<tuned lr of method>` and `optim.adamw_lr=<tuned non-matrix lr>` (where the method's optimizer
    has that option), for the requested `keys`; a ConfigError names what is missing and how to make it."""
    unknown = sorted(set(keys) - set(TUNED_KEYS))
    if unknown:
        raise ConfigError(f"tuned: {unknown} are not tuned values: use a subset of {list(TUNED_KEYS)}")
    if not keys:
        return []
    if method is None:
        raise ConfigError("a preset with `tuned` needs every run to name its method (method=<preset>)")
    path = path or TUNED_FILE
    tuned = load_tuned(path)
    fix = "run the sweep and `make tune` (make lr_sweep), or name optim.lr in the experiment config"
    out = []
    if "lr" in keys:
        if method not in tuned.get("lr", {}):
            raise ConfigError(f"{path.name} has no tuned lr for method {method}: {fix}")
        out.append(f"optim.lr={tuned['lr'][method]}")
    if "adamw_lr" in keys and has_nonmatrix_lr(method):
        if "adamw_lr" not in tuned:
            raise ConfigError(f"{path.name} has no adamw_lr (the tuned lr of {NONMATRIX_LR_FROM}): {fix}")
        out.append(f"optim.adamw_lr={tuned['adamw_lr']}")
    return out


def stage_points(stage_dir: Path) -> pd.DataFrame:
    """One row per run of a stage: method, lr, final validation loss (+inf when it diverged), status, run, commit,
    steps."""
    rows = []
    for run in stored_runs(stage_dir):
        record = run.record
        status = record.get("status", "complete")
        loss = record.get("final_val_loss")
        rows.append({"method": run.method, "lr": float(run.sweep_value), "status": status,
                     "final_val_loss": math.inf if status == "diverged" or loss is None else float(loss),
                     "steps": record.get("steps"), "run": run.name, "commit": record.get("git_commit", "unknown")})
    return pd.DataFrame(rows)


def choose(points: pd.DataFrame) -> dict:
    """The protocol's choice for one method's grid: the lr of the lowest loss, whether it lies on an edge of the
    grid, and the point to add when it does."""
    points = points.sort_values("lr")
    best = points.loc[points["final_val_loss"].idxmin()]
    lrs = list(points["lr"])
    edge = "low" if best["lr"] == lrs[0] else "high" if best["lr"] == lrs[-1] else ""
    add = best["lr"] / 2 if edge == "low" else best["lr"] * 2 if edge == "high" else math.nan
    return {"lr": float(best["lr"]), "final_val_loss": float(best["final_val_loss"]), "edge": edge,
            "add": add, "grid": " ".join(f"{v:g}" for v in lrs),
            "losses": " ".join(f"{v:.4f}" for v in points["final_val_loss"]),
            "steps": int(best["steps"]), "runs": " ".join(points["run"]),
            "commits": " ".join(sorted(set(points["commit"])))}


def choices(results: Path, stages: tuple[str, ...] = STAGES) -> pd.DataFrame:
    """Per method: its choice at every stage found under results/lr_sweep/ (one row per method and stage)."""
    rows = []
    for stage in stages:
        stage_dir = results / SWEEP / stage
        if not (stage_dir / "table.csv").exists():
            continue
        for method, points in stage_points(stage_dir).groupby("method", sort=False):
            rows.append({"method": method, "stage": stage, **choose(points)})
    return pd.DataFrame(rows)


def tuned_file(chosen: pd.DataFrame) -> dict:
    """{lr: {method: lr}, adamw_lr: ddp's lr}: per method the choice of its latest stage, unless on an edge."""
    latest = chosen.groupby("method", sort=False).tail(1)
    lrs = {m: float(lr) for m, lr, edge in zip(latest["method"], latest["lr"], latest["edge"]) if not edge}
    out: dict = {"lr": lrs}
    if NONMATRIX_LR_FROM in lrs:
        out["adamw_lr"] = lrs[NONMATRIX_LR_FROM]
    return out


HEADER = """# Generated by `python -m lowcomm.repro.tuning` from results/lr_sweep/ (per method: results/lr_sweep/chosen.csv).
# Do not edit: extend the sweep and run the command again. The protocol: experiments/lr_sweep/README.md.
# lr: each method's peak lr; adamw_lr: the lr of the non-matrix parameters in the Muon and Dion rows (ddp's lr).
"""


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=Path("results"), help="where lr_sweep/ lies")
    parser.add_argument("--out", type=Path, default=TUNED_FILE, help="the tuned file to write")
    parser.add_argument("--stages", default=",".join(STAGES), help="the sweep's presets, in order")
    args = parser.parse_args(argv)
    chosen = choices(args.results, tuple(args.stages.split(",")))
    if chosen.empty:
        raise SystemExit(f"error: no lr_sweep table under {args.results}/{SWEEP}/: run `make lr_sweep` first")
    chosen.to_csv(args.results / SWEEP / "chosen.csv", index=False)
    print(chosen[["method", "stage", "grid", "losses", "lr", "edge"]].to_markdown(index=False))
    for _, row in chosen.groupby("method", sort=False).tail(1).iterrows():
        if row["edge"]:
            print(f"{row['method']}: the best lr {row['lr']:g} lies on the {row['edge']} edge of its {row['stage']} "
                  f"grid: add {row['add']:g} to its sweep values in experiments/lr_sweep/config.yaml and rerun")
    args.out.write_text(HEADER + yaml.safe_dump(tuned_file(chosen), sort_keys=False))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
