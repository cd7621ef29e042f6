"""The cost models (lowcomm.cost) at the papers' sizes: bytes on the wire, collectives and state of every method.

    python -m lowcomm.repro.accounting --settings experiments/communication/paper_settings.yaml [--steps N]
        [--out CSV] [--flops-per-s F]
prints the figures at every paper size with the settings the file states (the methods, M, K, r = d/8, the
baselines), and the modeled link rate below which its subject method reaches a common target before each of its
crossover baselines when it needs rho times their steps, each worker computing 6 N T / F seconds per step
(`paper_crossover`). --out writes them as CSV, with the state by kind (state.csv, the cpu size beside the paper sizes)
and the crossover rates (crossover.csv) beside it.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

from omegaconf import OmegaConf

from lowcomm.config import ConfigError, load_yaml
from lowcomm.cost.bytes import analytic_bytes_per_step, analytic_collectives_per_step
from lowcomm.cost.method import AccountedMethod, accounted_method
from lowcomm.cost.shapes import ParamShapes, model_shapes
from lowcomm.cost.state import (
    STATE_KINDS,
    analytic_optimizer_state,
    analytic_sync_state,
    matrix_moments_ratio,
    state_summary,
)
from lowcomm.cost.wallclock import BANDWIDTHS_GBPS, LATENCY_S, compute_seconds, crossover_rate_mbit, step_time

ACCOUNTING_FIX = "rebuild it: make accounting OUT=results"  # what writes results/communication/analytic.csv


@dataclass(frozen=True)
class PaperMethod:
    """A method at the paper's settings: what it sends and keeps (lowcomm.cost.method.AccountedMethod) and its
    optimizer family."""

    options: AccountedMethod
    family: str


@dataclass(frozen=True)
class MethodSetting:
    """A method as the settings file states it: its optimizer family, its sync section, and whether it takes the
    size's rank r (`ranked`) and syncs every K steps (`k_step`)."""

    family: str
    sync: Mapping[str, Any]
    ranked: bool = False
    k_step: bool = False


@dataclass(frozen=True)
class PaperSettings:
    """The papers' settings the analytic tables assume (the format is experiments/communication/paper_settings.yaml):
    M, K, T and F, the sizes and their ranks, the methods, and which rows the ratios and the crossover compare."""

    world_size: int
    sync_every: int
    tokens_per_worker_step: int
    flops_per_s: float
    sizes: Mapping[str, int]
    cpu_rank: int
    methods: Mapping[str, MethodSetting]
    bytes_baselines: tuple[str, ...]
    optimizer_state_baselines: Mapping[str, str]
    state_baselines: Mapping[str, str]
    subject: str
    paper_factors: Mapping[str, float]
    crossover_against: tuple[str, ...]
    steps_ratios: tuple[float, ...]

    def paper_methods(self, rank: int) -> dict[str, PaperMethod]:
        """Every method at these settings, the ranked ones at rank `rank`."""
        return {name: PaperMethod(accounted_method({**m.sync, **({"rank": rank} if m.ranked else {}),
                                                    **({"sync_every": self.sync_every} if m.k_step else {})}),
                                  m.family) for name, m in self.methods.items()}

    @property
    def refresh_periods(self) -> dict[str, int]:
        """<method>_refresh: the basis refresh period T of each method that has one."""
        return {f"{name}_refresh": m.sync["basis_refresh_every"] for name, m in self.methods.items()
                if "basis_refresh_every" in m.sync}

    def columns(self) -> dict[str, Any]:
        """The settings every written row is stamped with."""
        return dict(world_size=self.world_size, sync_every=self.sync_every, **self.refresh_periods)


def load_settings(path: Path) -> PaperSettings:
    """The settings file at `path`; a ConfigError names the file and what is wrong."""
    tree = OmegaConf.to_container(load_yaml(path))
    fields = set(PaperSettings.__dataclass_fields__)
    unknown, missing = sorted(set(tree) - fields), sorted(fields - set(tree))
    if unknown or missing:
        raise ConfigError(f"{path}: unknown key(s) {unknown} or missing {missing}; keys: {sorted(fields)}")
    try:
        methods = {name: MethodSetting(**m) for name, m in tree["methods"].items()}
    except TypeError as err:
        raise ConfigError(f"{path}: methods: {err}") from None
    named = {*tree["bytes_baselines"], *tree["optimizer_state_baselines"].values(), *tree["state_baselines"].values(),
             tree["subject"], *tree["paper_factors"], *tree["crossover_against"]}
    if named - set(methods):
        raise ConfigError(f"{path}: {sorted(named - set(methods))} are not among its methods {sorted(methods)}")
    return PaperSettings(int(tree["world_size"]), int(tree["sync_every"]), int(tree["tokens_per_worker_step"]),
                         float(tree["flops_per_s"]), MappingProxyType(tree["sizes"]), int(tree["cpu_rank"]),
                         MappingProxyType(methods), tuple(tree["bytes_baselines"]),
                         MappingProxyType(tree["optimizer_state_baselines"]),
                         MappingProxyType(tree["state_baselines"]), tree["subject"],
                         MappingProxyType(tree["paper_factors"]), tuple(tree["crossover_against"]),
                         tuple(float(r) for r in tree["steps_ratios"]))


def method_row(method: PaperMethod, shapes: ParamShapes, steps: int, world_size: int, bytes_per_element: int = 4,
               latency_s: float = LATENCY_S) -> dict[str, float]:
    """Steady and amortized MB per worker per step, collectives per step, state MB (optimizer state as the paper
    counts it, E, anchor; each kind of STATE_KINDS as `state_mb/<kind>`, and all of it as `whole_state_mb`) and
    the communication time per step (s) at each bandwidth of BANDWIDTHS_GBPS."""
    opts, m, b = method.options, world_size, bytes_per_element
    steady = sum(analytic_bytes_per_step(opts, shapes, m, b).values())
    collectives = analytic_collectives_per_step(opts, shapes)
    by_kind = {**analytic_optimizer_state(method.family, shapes, opts, bytes_per_element=b),
               **analytic_sync_state(opts, shapes, b)}
    state = state_summary(by_kind)
    amortized = sum(analytic_bytes_per_step(opts, shapes, m, b, steps).values())
    row = dict(steady_mb=steady / 1e6, amortized_mb=amortized / 1e6,
               collectives_per_step=collectives, **{k.replace("_bytes", "_mb"): v / 1e6 for k, v in state.items()},
               **{f"state_mb/{kind}": by_kind.get(kind, 0.0) / 1e6 for kind in STATE_KINDS},
               whole_state_mb=sum(by_kind.values()) / 1e6)
    for bw in BANDWIDTHS_GBPS:
        row[f"comm_s_{bw:g}gbps"] = step_time(0.0, steady, collectives, bw, latency_s)
    return row


def paper_matrix_moments_ratio(method: PaperMethod, shapes: ParamShapes, adamw: Mapping[str, float],
                               bytes_per_element: int = 4) -> float:
    """`matrix_moments_ratio` of a low-rank method against AdamW's state `adamw`; NaN for the other families."""
    if method.family != "lowrank":
        return math.nan
    state = analytic_optimizer_state("lowrank", shapes, method.options, bytes_per_element=bytes_per_element)
    return matrix_moments_ratio(adamw["adamw_moments"], state["adamw_moments"], state["moments"])


def paper_table(settings: PaperSettings, steps: int, bytes_per_element: int = 4, latency_s: float = LATENCY_S,
                sizes: Mapping[str, int] | None = None) -> list[dict[str, Any]]:
    """Rows (size, rank, method, `method_row` figures, the ratios of each bytes baseline's steady bytes, of each
    optimizer-state baseline's optimizer state and of each state baseline's whole state to the method's, and for
    low-rank methods AdamW's moments of the hidden matrices over the method's low-rank moments) at every size of
    `sizes` (size -> rank; the settings' by default)."""
    rows = []
    for size, rank in (settings.sizes if sizes is None else sizes).items():
        shapes = model_shapes(size)
        methods = settings.paper_methods(rank)
        figures = {name: method_row(method, shapes, steps, settings.world_size, bytes_per_element, latency_s)
                   for name, method in methods.items()}
        adamw = analytic_optimizer_state("adamw", shapes, bytes_per_element=bytes_per_element)
        for name, row in figures.items():
            ratios = {**{f"{b}_over_method": figures[b]["steady_mb"] / row["steady_mb"] for b in settings.bytes_baselines},
                      **{f"{k}_state_over_method": figures[b]["optimizer_state_mb"] / row["optimizer_state_mb"]
                         for k, b in settings.optimizer_state_baselines.items()},
                      **{f"{k}_whole_over_method": figures[b]["whole_state_mb"] / row["whole_state_mb"]
                         for k, b in settings.state_baselines.items()}}
            rows.append(dict(size=size, rank=rank, method=name, **row, **ratios,
                             matrix_moments_ratio=paper_matrix_moments_ratio(methods[name], shapes, adamw,
                                                                             bytes_per_element)))
    return rows


def paper_crossover(settings: PaperSettings, rows: list[dict[str, Any]], flops_per_s: float | None = None,
                    ratios: tuple[float, ...] | None = None, latency_s: float = LATENCY_S) -> list[dict[str, Any]]:
    """Per paper size, pair (a, b) = (the subject, each crossover baseline) and steps ratio rho = S_a / S_b: the link
    rate (Mbit/s) below which a reaches a common target before b (lowcomm.cost.wallclock.crossover_rate_mbit on
    `paper_table`'s steady bytes and collectives), each worker computing c = 6 N T / F per step whatever its optimizer
    (the optimizer's own work is left out; F the settings' unless given). No step counts are measured at these sizes,
    so rho is a parameter (the settings' unless given): the paper's near-parity claim is rho close to 1."""
    out = []
    for size in settings.sizes:
        params = model_shapes(size).elements
        compute = compute_seconds(params, settings.tokens_per_worker_step, flops_per_s or settings.flops_per_s)
        by_method = {r["method"]: r for r in rows if r["size"] == size}
        for a, b in ((settings.subject, b) for b in settings.crossover_against):
            ra, rb = by_method[a], by_method[b]
            for rho in ratios or settings.steps_ratios:
                rate = crossover_rate_mbit(rho, compute, ra["steady_mb"] * 1e6, ra["collectives_per_step"],
                                           1.0, compute, rb["steady_mb"] * 1e6, rb["collectives_per_step"], latency_s)
                out.append(dict(size=size, params=params, compute_s=compute, a=a, b=b, steps_ratio=rho,
                                crossover_mbit=rate))
    return out


def state_rows(settings: PaperSettings, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The state table by kind of `paper_table`'s rows: size, rank, method, MB of each kind of STATE_KINDS that some
    method keeps, the whole state, the ratios of each state baseline's whole state to it, and the moments-only ratio
    (AdamW's moments of the hidden matrices over the method's low-rank moments)."""
    kept = [k for k in STATE_KINDS if any(r[f"state_mb/{k}"] for r in rows)]
    wholes = [f"{k}_whole_over_method" for k in settings.state_baselines]
    return [{"size": r["size"], "rank": r["rank"], "method": r["method"], **{k: r[f"state_mb/{k}"] for k in kept},
             "whole_state_mb": r["whole_state_mb"], **{c: r[c] for c in wholes},
             "matrix_moments_ratio": r["matrix_moments_ratio"]} for r in rows]


def write_rows(rows: list[dict[str, Any]], path: str, paper: PaperSettings, **settings: Any) -> None:
    """Rows as CSV (and a markdown table beside it), each stamped with the code's commit and the paper's settings
    they assume (plus `settings`)."""
    import pandas as pd

    from lowcomm.training.run_dir import git_commit

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    settings = dict(**paper.columns(), bytes_per_element=4, latency_s=LATENCY_S, **settings, git_commit=git_commit())
    table = pd.DataFrame([{**row, **settings} for row in rows])
    table.to_csv(path, index=False)
    Path(path).with_suffix(".md").write_text(table.drop(columns=list(settings)).to_markdown(index=False, floatfmt=".4g")
                                             + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m lowcomm.repro.accounting", description=__doc__.splitlines()[0])
    parser.add_argument("--settings", type=Path, required=True,
                        help="the papers' settings file (the Makefile's `accounting` target names it)")
    parser.add_argument("--steps", type=int, default=10_000, help="steps over which one-offs are amortized")
    parser.add_argument("--out", help="also write the rows to this CSV (with the git commit), and the crossover rates "
                                      "at the paper sizes to crossover.csv beside it")
    parser.add_argument("--flops-per-s", type=float,
                        help="sustained FLOP/s of one worker, for the compute time 6 N T / F of the crossover "
                             "(default: the settings')")
    args = parser.parse_args(argv)
    if args.flops_per_s is not None and args.flops_per_s <= 0:
        parser.error(f"--flops-per-s must be positive, got {args.flops_per_s:g}")
    try:
        paper = load_settings(args.settings)
    except ConfigError as err:
        sys.exit(f"error: {err}")
    flops = args.flops_per_s or paper.flops_per_s
    refresh = "".join(f", {name.removesuffix('_refresh')} refresh T = {t}" for name, t in paper.refresh_periods.items())
    print("Bytes on the wire per worker per step, fp32 (4 bytes per number; bf16 halves every figure, ratios "
          f"unchanged),\nM = {paper.world_size} workers (ring all-reduce: 2(M-1)/M x payload), "
          f"K = K_u = K_v = {paper.sync_every}, r = d/8{refresh}; amortized over {args.steps} steps.\n")
    rows = paper_table(paper, args.steps)
    crossover = paper_crossover(paper, rows, flops_per_s=flops)
    if args.out:
        write_rows(rows, args.out, paper)
        write_rows(state_rows(paper, paper_table(paper, args.steps, sizes={"cpu": paper.cpu_rank, **paper.sizes})),
                   str(Path(args.out).with_name("state.csv")), paper)
        write_rows(crossover, str(Path(args.out).with_name("crossover.csv")), paper,
                   tokens_per_worker_step=paper.tokens_per_worker_step, flops_per_s=flops)
    base, (state_name, _) = paper.bytes_baselines[0], next(iter(paper.optimizer_state_baselines.items()))
    print(f"{'size':<11} {'r':>4} {'method':<18} {'steady MB':>11} {'amortized MB':>13} {base + ' / method':>13} "
          f"{'state MB':>10} {state_name + ' / method':>15}")
    for row in rows:
        print(f"{row['size']:<11} {row['rank']:>4} {row['method']:<18} {row['steady_mb']:>11.3f} "
              f"{row['amortized_mb']:>13.3f} {row[f'{base}_over_method']:>12.1f}x {row['optimizer_state_mb']:>10.1f} "
              f"{row[f'{state_name}_state_over_method']:>14.2f}x")
    print()
    subject = paper.subject
    for size in paper.sizes:
        steady = {r["method"]: r["steady_mb"] for r in rows if r["size"] == size}
        for base, factor in paper.paper_factors.items():
            print(f"{size}: {base} / {subject} = {steady[base] / steady[subject]:.1f}x "
                  f"({subject} / {base} = {steady[subject] / steady[base]:.4f}); paper: about {factor:.0f}x")
    print(f"\nLink rate (Mbit/s) below which a reaches a common target before b, compute 6 N T / F per step "
          f"(T = {paper.tokens_per_worker_step:,} tokens per worker, F = {flops:.3g} FLOP/s), "
          "rho = a's steps to the target over b's:")
    for row in crossover:
        print(f"{row['size']:<11} {row['a']} vs {row['b']:<12} rho {row['steps_ratio']:<5g} "
              f"{row['crossover_mbit']:>12,.0f}")


if __name__ == "__main__":
    main()
