"""The cost models (lowcomm.cost) at the paper's sizes: bytes on the wire, collectives and state of every method.

    python -m lowcomm.repro.accounting [--steps N] [--out CSV] [--flops-per-s F]
prints the figures at every paper size with the paper's probable settings (M = 4, K = 32, r = d/8), and the modeled
link rate below which LoRDO reaches a common target before DDP (and low-rank DDP) when it needs rho times their steps,
each worker computing 6 N T / F seconds per step (`paper_crossover`). --out writes them as CSV, with the state by kind
(state.csv, the cpu size beside the paper sizes) and the crossover rates (crossover.csv) beside it.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

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

PAPER_SIZES = {"lordo-16m": 32, "lordo-125m": 96, "lordo-720m": 256, "gpt2-45m": 64,
               "llama3-320m": 96}  # rank r = d_model / 8 for every low-rank method (matched rank)
CPU_RANK = 16  # r = d/8 of the cpu model (d 128): the state table's measured size beside the paper sizes
PAPER_WORLD_SIZE = 4  # M
PAPER_SYNC_EVERY = 32  # K, also K_u = K_v (D8 default)
LOWRANK_DDP_REFRESH = 200  # T: GaLore's default basis refresh period
ACCOUNTING_FIX = "rebuild it: make accounting OUT=results"  # what writes results/communication/analytic.csv
PAPER_CLAIMS = {"ddp": 25.0, "lowrank_ddp": 10.0}  # "about 25x less than DDP, 10x less than low-rank DDP"
PAPER_TOKENS_PER_WORKER_STEP = 32 * 2048  # T: 32 sequences of 2,048 tokens per worker (the paper preset's batch)
PAPER_FLOPS_PER_S = 4e14  # F, sustained per worker: 40 % of an H100's dense bf16 peak (989 TFLOP/s); a decision
STEPS_RATIOS = (1.0, 1.1, 1.25, 1.5, 2.0)  # rho = S_a / S_b: a's steps to the common target over b's
CROSSOVER_PAIRS = (("lordo", "ddp"), ("lordo", "lowrank_ddp"))


@dataclass(frozen=True)
class PaperMethod:
    """A method at the paper's settings: what it sends and keeps (lowcomm.cost.method.AccountedMethod) and its
    optimizer family."""

    options: AccountedMethod
    family: str


def paper_method(family: str, **options: Any) -> PaperMethod:
    """A PaperMethod of an optimizer family from its mapping form (the sync config keys plus `rank`)."""
    return PaperMethod(accounted_method(options), family)


def paper_methods(rank: int) -> dict[str, PaperMethod]:
    """Every method preset at the paper's probable settings (spec: M = 4, K = 32, r = d/8); Muon communicates as DDP,
    Ada-Orth-Dion as Dion at its rank cap."""
    k = PAPER_SYNC_EVERY
    return {
        "ddp": paper_method("adamw", name="ddp"),
        "lowrank_ddp": paper_method("lowrank", name="lowrank_ddp", rank=rank, basis_refresh_every=LOWRANK_DDP_REFRESH),
        "local_adam": paper_method("adamw", name="local_adam", sync_every=k),
        "diloco": paper_method("adamw", name="diloco", sync_every=k),
        "lordo_local": paper_method("lowrank", name="lordo_local", sync_every=k, rank=rank),
        "lordo_global_noqh": paper_method("lowrank", name="lordo_global_noqh", sync_every=k, rank=rank),
        "lordo": paper_method("lowrank", name="lordo", sync_every=k, rank=rank),
        "muon": paper_method("muon", name="ddp"),
        "dion": paper_method("dion", name="optimizer_sync", rank=rank),
        "orth_dion": paper_method("dion", name="optimizer_sync", rank=rank),
        "ada_orth_dion": paper_method("dion", name="optimizer_sync", rank=rank),
    }


def method_row(method: PaperMethod, shapes: ParamShapes, steps: int, bytes_per_element: int = 4,
               latency_s: float = LATENCY_S) -> dict[str, float]:
    """Steady and amortized MB per worker per step, collectives per step, state MB (optimizer state as the paper
    counts it, E, anchor; each kind of STATE_KINDS as `state_mb/<kind>`, and all of it as `whole_state_mb`) and
    the communication time per step (s) at each bandwidth of BANDWIDTHS_GBPS."""
    opts, m, b = method.options, PAPER_WORLD_SIZE, bytes_per_element
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


def paper_table(steps: int, bytes_per_element: int = 4, latency_s: float = LATENCY_S,
                sizes: Mapping[str, int] = PAPER_SIZES) -> list[dict[str, Any]]:
    """Rows (size, rank, method, `method_row` figures, ratios of ddp's and low-rank DDP's bytes and of AdamW's
    optimizer state to the method's, of the whole state AdamW DDP and local_adam keep to the method's, and for
    low-rank methods AdamW's moments of the hidden matrices over the
    method's low-rank moments) at every size of `sizes` (size -> rank) with the paper's settings."""
    rows = []
    for size, rank in sizes.items():
        shapes = model_shapes(size)
        methods = paper_methods(rank)
        figures = {name: method_row(method, shapes, steps, bytes_per_element, latency_s)
                   for name, method in methods.items()}
        adamw = analytic_optimizer_state("adamw", shapes, bytes_per_element=bytes_per_element)
        for name, row in figures.items():
            rows.append(dict(size=size, rank=rank, method=name, **row,
                             ddp_over_method=figures["ddp"]["steady_mb"] / row["steady_mb"],
                             lowrank_ddp_over_method=figures["lowrank_ddp"]["steady_mb"] / row["steady_mb"],
                             adamw_state_over_method=figures["ddp"]["optimizer_state_mb"] / row["optimizer_state_mb"],
                             adamw_whole_over_method=figures["ddp"]["whole_state_mb"] / row["whole_state_mb"],
                             local_adam_whole_over_method=figures["local_adam"]["whole_state_mb"]
                             / row["whole_state_mb"],
                             matrix_moments_ratio=paper_matrix_moments_ratio(methods[name], shapes, adamw,
                                                                             bytes_per_element)))
    return rows


def paper_crossover(rows: list[dict[str, Any]], tokens: int = PAPER_TOKENS_PER_WORKER_STEP,
                    flops_per_s: float = PAPER_FLOPS_PER_S, ratios: Iterable[float] = STEPS_RATIOS,
                    latency_s: float = LATENCY_S) -> list[dict[str, Any]]:
    """Per paper size, pair (a, b) of CROSSOVER_PAIRS and steps ratio rho = S_a / S_b: the link rate (Mbit/s) below
    which a reaches a common target before b (lowcomm.cost.wallclock.crossover_rate_mbit on `paper_table`'s steady
    bytes and collectives), each worker computing c = 6 N T / F per step whatever its optimizer (the optimizer's own
    work is left out). No step counts are measured at these sizes, so rho is a parameter: the paper's near-parity
    claim is rho close to 1."""
    out = []
    for size in PAPER_SIZES:
        params = model_shapes(size).elements
        compute = compute_seconds(params, tokens, flops_per_s)
        by_method = {r["method"]: r for r in rows if r["size"] == size}
        for a, b in CROSSOVER_PAIRS:
            ra, rb = by_method[a], by_method[b]
            for rho in ratios:
                rate = crossover_rate_mbit(rho, compute, ra["steady_mb"] * 1e6, ra["collectives_per_step"],
                                           1.0, compute, rb["steady_mb"] * 1e6, rb["collectives_per_step"], latency_s)
                out.append(dict(size=size, params=params, compute_s=compute, a=a, b=b, steps_ratio=rho,
                                crossover_mbit=rate))
    return out


def state_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The state table by kind of `paper_table`'s rows: size, rank, method, MB of each kind of STATE_KINDS that some
    method keeps, the whole state, the ratios of AdamW DDP's and local_adam's whole state to it, and the moments-only
    ratio (AdamW's moments of the hidden matrices over the method's low-rank moments)."""
    kept = [k for k in STATE_KINDS if any(r[f"state_mb/{k}"] for r in rows)]
    return [{"size": r["size"], "rank": r["rank"], "method": r["method"], **{k: r[f"state_mb/{k}"] for k in kept},
             "whole_state_mb": r["whole_state_mb"], "adamw_whole_over_method": r["adamw_whole_over_method"],
             "local_adam_whole_over_method": r["local_adam_whole_over_method"],
             "matrix_moments_ratio": r["matrix_moments_ratio"]} for r in rows]


def write_rows(rows: list[dict[str, Any]], path: str, **settings: Any) -> None:
    """Rows as CSV (and a markdown table beside it), each stamped with the code's commit and the paper's settings
    they assume (plus `settings`)."""
    import pandas as pd

    from lowcomm.training.run_dir import git_commit

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    settings = dict(world_size=PAPER_WORLD_SIZE, sync_every=PAPER_SYNC_EVERY, lowrank_ddp_refresh=LOWRANK_DDP_REFRESH,
                    bytes_per_element=4, latency_s=LATENCY_S, **settings, git_commit=git_commit())
    table = pd.DataFrame([{**row, **settings} for row in rows])
    table.to_csv(path, index=False)
    Path(path).with_suffix(".md").write_text(table.drop(columns=list(settings)).to_markdown(index=False, floatfmt=".4g")
                                             + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m lowcomm.repro.accounting", description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10_000, help="steps over which one-offs are amortized")
    parser.add_argument("--out", help="also write the rows to this CSV (with the git commit), and the crossover rates "
                                      "at the paper sizes to crossover.csv beside it")
    parser.add_argument("--flops-per-s", type=float, default=PAPER_FLOPS_PER_S,
                        help="sustained FLOP/s of one worker, for the compute time 6 N T / F of the crossover")
    args = parser.parse_args(argv)
    if args.flops_per_s <= 0:
        parser.error(f"--flops-per-s must be positive, got {args.flops_per_s:g}")
    print("Bytes on the wire per worker per step, fp32 (4 bytes per number; bf16 halves every figure, ratios "
          f"unchanged),\nM = {PAPER_WORLD_SIZE} workers (ring all-reduce: 2(M-1)/M x payload), "
          f"K = K_u = K_v = {PAPER_SYNC_EVERY}, "
          f"r = d/8, lowrank_ddp refresh T = {LOWRANK_DDP_REFRESH}; amortized over {args.steps} steps.\n")
    rows = paper_table(args.steps)
    crossover = paper_crossover(rows, flops_per_s=args.flops_per_s)
    if args.out:
        write_rows(rows, args.out)
        write_rows(state_rows(paper_table(args.steps, sizes={"cpu": CPU_RANK, **PAPER_SIZES})),
                   str(Path(args.out).with_name("state.csv")))
        write_rows(crossover, str(Path(args.out).with_name("crossover.csv")),
                   tokens_per_worker_step=PAPER_TOKENS_PER_WORKER_STEP, flops_per_s=args.flops_per_s)
    print(f"{'size':<11} {'r':>4} {'method':<18} {'steady MB':>11} {'amortized MB':>13} {'ddp / method':>13} "
          f"{'state MB':>10} {'AdamW / method':>15}")
    for row in rows:
        print(f"{row['size']:<11} {row['rank']:>4} {row['method']:<18} {row['steady_mb']:>11.3f} "
              f"{row['amortized_mb']:>13.3f} {row['ddp_over_method']:>12.1f}x {row['optimizer_state_mb']:>10.1f} "
              f"{row['adamw_state_over_method']:>14.2f}x")
    print()
    for size in PAPER_SIZES:
        steady = {r["method"]: r["steady_mb"] for r in rows if r["size"] == size}
        for base, claim in PAPER_CLAIMS.items():
            print(f"{size}: {base} / lordo = {steady[base] / steady['lordo']:.1f}x "
                  f"(lordo / {base} = {steady['lordo'] / steady[base]:.4f}); paper: about {claim:.0f}x")
    print(f"\nLink rate (Mbit/s) below which a reaches a common target before b, compute 6 N T / F per step "
          f"(T = {PAPER_TOKENS_PER_WORKER_STEP:,} tokens per worker, F = {args.flops_per_s:.3g} FLOP/s), "
          "rho = a's steps to the target over b's:")
    for row in crossover:
        print(f"{row['size']:<11} {row['a']} vs {row['b']:<12} rho {row['steps_ratio']:<5g} "
              f"{row['crossover_mbit']:>12,.0f}")


if __name__ == "__main__":
    main()
