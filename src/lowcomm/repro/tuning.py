"""`python -m lowcomm.repro.tuning`: the learning-rate protocol's choice, from the lr_sweep results, into one file.

Protocol v2 (experiments/lr_sweep/README.md): per method and horizon (the run's lr schedule length,
train.schedule_steps or train.steps), a grid of peak lr spaced by a factor of 2 over the tuning seeds; the best mean
final validation loss wins (a diverged run counts as +inf). Each grid point carries its mean, its spread over seeds
and its paired interval to the winner (lowcomm.repro.stats); the choice is a tie where a neighbouring point's interval
contains 0. A winner on an edge of its grid is not chosen: the command names the point to add, and the sweep
resumes with it. A later stage replaces an earlier one's choice; a horizon stage's choice (`horizon_stages`) replaces
nothing and serves only the runs whose lr schedule has its length. The Muon and Dion rows train their non-matrix
parameters (embeddings, norms) at `adamw_lr`, ddp's tuned lr.

Writes experiments/tuned_lr.yaml (read by the experiment runner through `tuned: [lr, adamw_lr]`; each lr with the
horizon it was chosen at, and `lr_at_horizon`: the horizon stages' lrs keyed by steps) and results/lr_sweep/chosen.csv
(one row per method, stage and grid point).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import yaml

from lowcomm.config import ConfigError, method_preset
from lowcomm.optim import OPTIMIZERS
from lowcomm.paths import TUNED_FILE
from lowcomm.repro.spec import ExperimentSpec, tuning_sweep
from lowcomm.repro.stats import against_best
from lowcomm.repro.store import RESULTS, ResultsStore, StoredPreset
from lowcomm.stored import StoredFileError, counting_skipped

TUNED_KEYS = ("lr", "adamw_lr")


def versioned(version: str) -> Path:
    """experiments/tuned_lr_<version>.yaml: the tuned file of an earlier protocol."""
    return TUNED_FILE.with_name(f"{TUNED_FILE.stem}_{version}{TUNED_FILE.suffix}")


def tuned_path(version: str | None = None) -> Path:
    """experiments/tuned_lr.yaml, or an earlier protocol's choice, experiments/tuned_lr_<version>.yaml (a preset's
    `tuned_from`: a ConfigError where that file does not exist)."""
    if version is None:
        return TUNED_FILE
    path = versioned(version)
    if not path.exists():
        raise ConfigError(f"tuned_from: {version}: {path} does not exist: name the version of a tuned file in "
                          f"{path.parent}, or leave tuned_from out")
    return path


def load_tuned(path: Path | None = None) -> dict:
    """The tuned file ({} before the first choice)."""
    path = path or TUNED_FILE
    return (yaml.safe_load(path.read_text()) or {}) if path.exists() else {}


def has_nonmatrix_lr(method: str) -> bool:
    """Whether the method's optimizer trains its non-matrix parameters at an lr of their own (`adamw_lr`)."""
    name = method_preset(method).optim.name
    return any(f.name == "adamw_lr" for f in dataclasses.fields(OPTIMIZERS[name].options))


def lrs_at_horizons(tuned: dict, method: str) -> dict[int, float]:
    """{steps: lr}: the lrs a horizon stage tuned for `method` (the file's `lr_at_horizon`)."""
    return {int(steps): lrs[method] for steps, lrs in tuned.get("lr_at_horizon", {}).items() if method in lrs}


def tuned_lr(tuned: dict, method: str, horizon: Callable[[], int | None]) -> tuple[float, int | None] | None:
    """(lr, the horizon it was tuned at) for a run of `method` whose lr schedule is `horizon()` steps long: the lr
    tuned at that horizon (`lr_at_horizon`, whatever the order of the stages) where the file has one, else the
    method's `lr`; None where it has neither. `horizon` is called only where the file holds an lr at some horizon for
    the method."""
    at = lrs_at_horizons(tuned, method)
    if at and (steps := horizon()) in at:
        return at[steps], steps
    if method not in tuned.get("lr", {}):
        return None
    return tuned["lr"][method], tuned.get("horizon", {}).get(method)


def tuned_overrides(method: str | None, keys: list[str], path: Path | None = None,
                    horizon: Callable[[], int] | None = None) -> list[str]:
    """`optim.lr=<tuned lr of method>` (at the run's horizon where the file has one: tuned_lr) and
    `optim.adamw_lr=<tuned non-matrix lr>` (where the method's optimizer has that option), for the requested `keys`;
    a ConfigError names what is missing and how to make it."""
    unknown = sorted(set(keys) - set(TUNED_KEYS))
    if unknown:
        raise ConfigError(f"tuned: {unknown} are not tuned values: use a subset of {list(TUNED_KEYS)}")
    if not keys:
        return []
    if method is None:
        raise ConfigError("a preset with `tuned` needs every run to name its method (method=<preset>)")
    path = path or TUNED_FILE
    tuned = load_tuned(path)
    fix = "run the lr sweep and `make tune`, or name optim.lr in the experiment config"
    out = []
    if "lr" in keys:
        found = tuned_lr(tuned, method, horizon or (lambda: None))
        if found is None:
            at = sorted(lrs_at_horizons(tuned, method))
            only = f" (only at {at} steps, not at this run's {horizon()})" if at and horizon else ""
            raise ConfigError(f"{path.name} has no tuned lr for method {method}{only}: {fix}")
        out.append(f"optim.lr={found[0]}")
    if "adamw_lr" in keys and has_nonmatrix_lr(method):
        if "adamw_lr" not in tuned:
            raise ConfigError(f"{path.name} has no adamw_lr (the lr of the non-matrix parameters): {fix}")
        out.append(f"optim.adamw_lr={tuned['adamw_lr']}")
    return out


def horizon_of(cfg) -> int:
    """The length of a run's lr schedule in steps: train.schedule_steps, else train.steps."""
    return int(cfg.train.get("schedule_steps") or cfg.train.steps)


def stage_points(stage: StoredPreset) -> pd.DataFrame:
    """One row per run of a stage: method, lr, seed, horizon, final validation loss (+inf when it diverged), status,
    run, commit."""
    rows = []
    for run in stage.runs():
        record = run.record
        status = record.get("status", "complete")
        loss = record.get("final_val_loss")
        rows.append({"method": run.method, "lr": float(run.sweep_value), "seed": run.seed,
                     "horizon": horizon_of(run.config), "status": status,
                     "final_val_loss": math.inf if status == "diverged" or loss is None else float(loss),
                     "run": run.name, "commit": record.get("git_commit", "unknown")})
    return pd.DataFrame(rows)


def choose(points: pd.DataFrame) -> pd.DataFrame:
    """The protocol's choice for one method's grid at one horizon, one row per grid point (in lr order): seeds, mean
    and spread of the final loss, the paired difference to the winner with its interval and verdict
    (stats.against_best), and on every row the choice: `chosen` marks the winner (best mean), `edge` whether it lies
    on an edge of the grid (`add`: the point to add beyond it), `tie` the neighbouring lrs whose interval to the
    winner contains 0."""
    by_lr = {lr: dict(zip(group["seed"], group["final_val_loss"])) for lr, group in points.groupby("lr")}
    lrs = sorted(by_lr)
    best, ranked = against_best({lr: by_lr[lr] for lr in lrs})
    edge = "low" if best == lrs[0] and len(lrs) > 1 else "high" if best == lrs[-1] and len(lrs) > 1 else ""
    rows = []
    for lr in lrs:
        group = points[points["lr"] == lr]
        rows.append({"lr": lr, **ranked[lr], "runs": " ".join(group["run"]),
                     "commits": " ".join(sorted(set(group["commit"])))})
    table = pd.DataFrame(rows)
    i = lrs.index(best)
    neighbours = table.iloc[[j for j in (i - 1, i + 1) if 0 <= j < len(lrs)]]
    tied = neighbours[(neighbours["ci_low"] <= 0) & (neighbours["ci_high"] >= 0)]
    table["edge"] = edge
    table["add"] = best / 2 if edge == "low" else best * 2 if edge == "high" else math.nan
    table["tie"] = " ".join(f"{lr:g}" for lr in tied["lr"])
    return table


def choices(store: ResultsStore, sweep: ExperimentSpec, stages: tuple[str, ...] | None = None) -> pd.DataFrame:
    """Every grid point of every method at every stage (the sweep's own stages and horizon stages by default) and
    horizon found in the store (choose's rows, with method, stage and horizon first)."""
    frames = []
    for stage in stages or sweep.tuning.every_stage:
        stored = store.preset(sweep.name, stage)
        if not stored.has():
            continue
        for (method, horizon), points in stage_points(stored).groupby(["method", "horizon"], sort=False):
            table = choose(points)
            table.insert(0, "horizon", horizon)
            table.insert(0, "stage", stage)
            table.insert(0, "method", method)
            frames.append(table)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def latest_winners(chosen: pd.DataFrame, horizon_stages: tuple[str, ...] = ()) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The winners that stand (edges included): per method, that of its latest stage; per horizon and method, that of
    its latest horizon stage."""
    winners = chosen[chosen["chosen"]]
    at_horizon = winners["stage"].isin(horizon_stages)
    return (winners[~at_horizon].groupby("method", sort=False).tail(1),
            winners[at_horizon].groupby(["horizon", "method"], sort=False).tail(1))


def tuned_file(chosen: pd.DataFrame, nonmatrix_lr_from: str, horizon_stages: tuple[str, ...] = ()) -> dict:
    """{lr: {method: lr}, horizon: {method: steps}, adamw_lr: the lr of `nonmatrix_lr_from`, lr_at_horizon: {steps:
    {method: lr}}}: the latest winners (latest_winners) that do not lie on an edge; a horizon stage's winner on an
    edge leaves its method at its `lr` for that horizon, as a stage's does."""
    latest, by_horizon = (w[w["edge"] == ""] for w in latest_winners(chosen, horizon_stages))
    out: dict = {"lr": {m: float(lr) for m, lr in zip(latest["method"], latest["lr"])},
                 "horizon": {m: int(h) for m, h in zip(latest["method"], latest["horizon"])}}
    if nonmatrix_lr_from in out["lr"]:
        out["adamw_lr"] = out["lr"][nonmatrix_lr_from]
    for steps, group in by_horizon.groupby("horizon"):
        out.setdefault("lr_at_horizon", {})[int(steps)] = {m: float(lr) for m, lr in zip(group["method"], group["lr"])}
    return out


HEADER = """# Generated from results/{name}/ (stages {stages}; per method: results/{name}/chosen.csv) by
#   python -m lowcomm.repro.tuning{options}
# Do not edit: extend the sweep and run the command again. The protocol: experiments/{name}/README.md.
# lr: each method's peak lr; horizon: the lr schedule's length (steps) it was chosen at; adamw_lr: the lr of the
# non-matrix parameters in the Muon and Dion rows ({nonmatrix}'s lr); lr_at_horizon (where a horizon stage has chosen):
# per schedule length, the lr a run of that length takes instead of its method's lr.
"""
SHOWN = ["method", "stage", "horizon", "lr", "seeds", "mean", "std", "diff_to_winner", "ci_low", "ci_high", "chosen",
         "tie", "edge"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m lowcomm.repro.tuning", description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=RESULTS, help="the results store the sweep lies in")
    parser.add_argument("--out", type=Path, default=TUNED_FILE, help="the tuned file to write")
    parser.add_argument("--stages", help="some of the sweep's stages, in order (default: its config's "
                        "tuning.stages, then its tuning.horizon_stages), for an earlier protocol's file: needs --out "
                        "another file than the tuned one, and leaves results/<sweep>/chosen.csv (every stage) as it is")
    args = parser.parse_args(argv)
    store = ResultsStore(args.results)
    with counting_skipped():
        try:
            sweep = tuning_sweep()
            stages = tuple(args.stages.split(",")) if args.stages else sweep.tuning.every_stage
            unknown = sorted(set(stages) - set(sweep.tuning.every_stage))
            if unknown:
                raise ConfigError(f"--stages {unknown} are not stages of {sweep.name}: use some of "
                                  f"{list(sweep.tuning.every_stage)}")
            if args.stages and args.out.resolve() == TUNED_FILE.resolve():
                raise ConfigError(f"--stages writes an earlier protocol's choice: give --out another file than "
                                  f"{TUNED_FILE} (e.g. {versioned('v1')})")
            chosen = choices(store, sweep, stages)
        except (ConfigError, StoredFileError) as err:
            raise SystemExit(f"error: {err}") from None
    if chosen.empty:
        raise SystemExit(f"error: no {sweep.name} table in {store.experiment_dir(sweep.name)}/: "
                         f"run `make {sweep.report.target}` first")
    if not args.stages:
        chosen.to_csv(store.experiment_dir(sweep.name) / "chosen.csv", index=False)
    print(chosen[SHOWN].to_markdown(index=False, floatfmt=".4g"))
    for _, row in pd.concat(latest_winners(chosen, sweep.tuning.horizon_stages)).iterrows():
        if row["edge"]:
            print(f"{row['method']}: the best lr {row['lr']:g} at {row['horizon']} steps lies on the {row['edge']} "
                  f"edge of its {row['stage']} grid: add {row['add']:g} to its sweep values in {sweep.config} and "
                  "rerun")
    options = "".join([f" --results {args.results}"] * (args.results.resolve() != RESULTS.resolve())
                      + [f" --stages {args.stages}"] * bool(args.stages)
                      + [f" --out {args.out}"] * (args.out.resolve() != TUNED_FILE.resolve()))
    header = HEADER.format(name=sweep.name, nonmatrix=sweep.tuning.nonmatrix_lr_from, options=options,
                           stages=", ".join(dict.fromkeys(chosen["stage"])))
    choice = tuned_file(chosen, sweep.tuning.nonmatrix_lr_from, sweep.tuning.horizon_stages)
    args.out.write_text(header + yaml.safe_dump(choice, sort_keys=False))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
