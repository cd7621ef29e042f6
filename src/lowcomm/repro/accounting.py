"""Analytic communication and memory model: bytes each worker puts on the wire, by kind, the collectives it calls,
and the optimizer state it holds, for every method.

Every collective of a method is an Event: `elements` numbers sent by `collective` at steps t >= first with
(t - first) % period == 0 (period 0: once), in `collectives` calls. Bytes per worker follow the Communicator's
model: ring all-reduce
2(M-1)/M x payload, pipelined broadcast (M-1)/M x payload. Per matrix (p x q) with rank r:
  ddp          G every step: sum pq (all parameters)
  lowrank_ddp  Q^T G every step: r max(p, q) per matrix, G of the other parameters, and the matrices' G every T
               steps for the basis refresh (option "full": G of everything every step, the refresh is free)
  K-step       Delta every K steps (all parameters); u every K_u, v every K_v steps (the moments' shape:
               r max(p, q) for a low-rank optimizer, pq otherwise); LoRDO adds the first step's G of the matrices (D1);
               the local Dion methods add their buffers M (pq per matrix) every K_M steps and nothing for Q, which is
               either local or computed by every worker from Delta
  dion         P and W every step: (p + q) r per matrix, or G (pq) when (p + q) r >= pq; G of the other parameters
Setup broadcasts the parameters once (step 0); it is not part of the per-step figures.
Optimizer state per worker (fp32), by the kinds the optimizers report:
  adamw        adamw_moments 2 pq (every parameter)
  low-rank     moments 2 r max(p, q), bases r min(p, q), error_feedback pq (when on); AdamW moments of the rest
  muon         momentum_buffer pq; AdamW moments of the rest
  dion family  momentum pq, Q r min(p, q); AdamW moments of the rest
  K-step sync  anchor (every parameter), outer_momentum (every parameter, Nesterov outer step only)

    python -m lowcomm.repro.accounting [--steps N] [--out CSV]
prints the figures at every paper size with the paper's probable settings (r = d/8).
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

import torch
from torch import nn

from lowcomm.distributed.comm import wire_bytes
from lowcomm.distributed.options import sync_options
from lowcomm.model import Transformer, model_config
from lowcomm.optim.groups import hidden_matrices
from lowcomm.optim.projection import check_rank, projected_shape, projection_side
from lowcomm.repro.wallclock import BANDWIDTHS_GBPS, LATENCY_S, step_time

DION_METHODS = ("dion", "orth_dion")
LOWRANK_METHODS = ("lowrank_ddp", "lordo", "lordo_global_noqh")


@dataclass(frozen=True)
class ParamShapes:
    """Shapes of the low-rank (2-D hidden) matrices and of every other parameter."""

    lowrank: tuple[tuple[int, int], ...]
    other: tuple[tuple[int, ...], ...]


def param_shapes(model: nn.Module, lowrank: Iterable[nn.Parameter] | None = None) -> ParamShapes:
    """ParamShapes of a model's trainable parameters; the low-rank ones are `lowrank` (default: the hidden matrices)."""
    lowrank_ids = {id(p) for p in (lowrank if lowrank is not None else (p for _, p in hidden_matrices(model)))}
    params = [p for p in model.parameters() if p.requires_grad]
    return ParamShapes(
        lowrank=tuple(tuple(p.shape) for p in params if id(p) in lowrank_ids),
        other=tuple(tuple(p.shape) for p in params if id(p) not in lowrank_ids),
    )


@dataclass(frozen=True)
class Event:
    """`elements` numbers of kind `kind` sent by `collective` at steps t >= first with (t - first) % period == 0,
    in `collectives` calls; period 0 means once, at step `first`."""

    kind: str
    collective: str
    elements: int
    first: int
    period: int
    collectives: int = 1

    def happens_at(self, step: int) -> bool:
        if step < self.first:
            return False
        return step == self.first if self.period == 0 else (step - self.first) % self.period == 0

    def count(self, steps: int) -> int:
        """Occurrences in steps 1..steps."""
        if steps < self.first:
            return 0
        return 1 if self.period == 0 else (steps - self.first) // self.period + 1


def _numel(shape: tuple[int, ...]) -> int:
    return math.prod(shape)


def _rank(options: Mapping[str, Any], shape: tuple[int, int]) -> int:
    """The rank of a matrix: `rank`, or for Dion ceil(rank_fraction * min(p, q)), at most min(p, q)."""
    if options.get("rank") is not None:
        check_rank(shape, options["rank"])
        return options["rank"]
    if options.get("rank_fraction") is not None and options.get("name") in DION_METHODS:
        return min(math.ceil(options["rank_fraction"] * min(shape)), min(shape))
    raise ValueError(f"method options of {options.get('name')!r} need 'rank' (an integer; Dion also accepts "
                     "'rank_fraction') to count low-rank messages")


def _moment_elements(options: Mapping[str, Any], shapes: ParamShapes, scope: str, dion: bool = False) -> int:
    """Numbers in one moment (u or v) of the parameters in `scope`: r max(p, q) per matrix when `rank` is given
    (a low-rank optimizer), none for Dion's matrices (their state is M), else pq; the other parameters' AdamW
    moments have their own shape."""
    lowrank = options.get("rank") is not None
    matrices = 0 if dion else sum(
        _numel(projected_shape(s, _rank(options, s), projection_side(s))) if lowrank else _numel(s)
        for s in shapes.lowrank)
    return matrices + (sum(_numel(s) for s in shapes.other) if scope == "all" else 0)


def analytic_events(method_options: Mapping[str, Any], shapes: ParamShapes) -> list[Event]:
    """The collectives of a method, from step 1 on. `method_options`: the sync config (name and keys of
    SyncOptions) plus `rank` for low-rank optimizers; names 'dion' / 'orth_dion' take `rank` or `rank_fraction`."""
    name = method_options.get("name")
    all_elements = sum(_numel(s) for s in shapes.lowrank + shapes.other)
    lowrank_elements = sum(_numel(s) for s in shapes.lowrank)
    other_elements = sum(_numel(s) for s in shapes.other)
    if name in DION_METHODS:
        compressed = [(s, (s[0] + s[1]) * _rank(method_options, s)) for s in shapes.lowrank]
        factors = sum(n for s, n in compressed if n < _numel(s))
        fallback = sum(_numel(s) for s, n in compressed if n >= _numel(s))
        return [e for e in (Event("factor", "all_reduce", factors, 1, 1, collectives=2),  # P, then W
                            Event("gradient", "all_reduce", other_elements + fallback, 1, 1)) if e.elements]
    sync_cfg = {k: v for k, v in method_options.items() if k not in ("rank", "rank_fraction")}
    opts = sync_options(sync_cfg)
    method = opts.method
    if opts.name in LOWRANK_METHODS and method_options.get("rank") is None:
        raise ValueError(f"method options of {opts.name!r} need 'rank': its messages and moments are rank-r")
    events: list[Event] = []
    if method.per_step_gradients and opts.projected_gradients:
        projected = sum(_numel(projected_shape(s, _rank(method_options, s), projection_side(s)))
                        for s in shapes.lowrank)
        events += [Event("projected_gradient", "all_reduce", projected, 1, 1),
                   Event("gradient", "all_reduce", other_elements, 1, 1),
                   Event("gradient", "all_reduce", lowrank_elements, 1, opts.basis_refresh_every)]
    elif method.per_step_gradients:
        events.append(Event("gradient", "all_reduce", all_elements, 1, 1))
    if method.k_step:
        events.append(Event("pseudo_gradient", "all_reduce", all_elements, opts.sync_every, opts.sync_every))
        for every in (opts.state_sync_u, opts.state_sync_v):
            if every:
                moments = _moment_elements(method_options, shapes, opts.state_sync_scope, method.local_dion)
                events.append(Event("optimizer_state", "all_reduce", moments, every, every))
        if opts.state_sync_m:
            events.append(Event("optimizer_state", "all_reduce", lowrank_elements, opts.state_sync_m,
                                opts.state_sync_m))
    if method.global_basis == "pseudo_gradient" and not method.local_dion:
        events.append(Event("gradient", "all_reduce", lowrank_elements, 1, 0))
    return [e for e in events if e.elements]


def _wire(event: Event, world_size: int, bytes_per_element: int) -> float:
    return wire_bytes(event.collective, event.elements * bytes_per_element, world_size)


def setup_bytes(shapes: ParamShapes, world_size: int, bytes_per_element: int = 4) -> dict[str, float]:
    """Bytes per worker of the engine's setup: the parameters broadcast from rank 0 (step 0)."""
    elements = sum(_numel(s) for s in shapes.lowrank + shapes.other)
    return {"parameters": wire_bytes("broadcast", elements * bytes_per_element, world_size)}


def analytic_bytes_at(method_options: Mapping[str, Any], shapes: ParamShapes, world_size: int, step: int,
                      bytes_per_element: int = 4) -> dict[str, float]:
    """Bytes on the wire per worker at step `step` (>= 1), by kind (kinds that send nothing are left out)."""
    totals: dict[str, float] = {}
    for e in analytic_events(method_options, shapes):
        if e.happens_at(step):
            totals[e.kind] = totals.get(e.kind, 0.0) + _wire(e, world_size, bytes_per_element)
    return totals


def analytic_bytes_per_step(method_options: Mapping[str, Any], shapes: ParamShapes, world_size: int,
                            bytes_per_element: int = 4, steps: int | None = None) -> dict[str, float]:
    """Bytes on the wire per worker per step, by kind. steps=None: the steady state (periodic collectives over their
    period, one-offs such as LoRDO's first-step gradient (D1) left out); steps=N: the mean over steps 1..N, one-offs
    included (amortized)."""
    totals: dict[str, float] = {}
    for e in analytic_events(method_options, shapes):
        if steps is None:
            rate = 0.0 if e.period == 0 else 1.0 / e.period
        else:
            rate = e.count(steps) / steps
        totals[e.kind] = totals.get(e.kind, 0.0) + rate * _wire(e, world_size, bytes_per_element)
    return {k: v for k, v in totals.items() if v}


def _rate(event: Event, steps: int | None) -> float:
    """Occurrences per step: 1 / period in the steady state (one-offs left out), or the mean over steps 1..steps."""
    if steps is None:
        return 0.0 if event.period == 0 else 1.0 / event.period
    return event.count(steps) / steps


def analytic_collectives_per_step(method_options: Mapping[str, Any], shapes: ParamShapes,
                                  steps: int | None = None) -> float:
    """Collective calls per worker per step: the steady state (steps=None) or the mean over steps 1..steps."""
    return sum(_rate(e, steps) * e.collectives for e in analytic_events(method_options, shapes))


OPTIMIZER_FAMILIES = ("adamw", "lowrank", "muon", "dion")


def analytic_optimizer_state(family: str, shapes: ParamShapes, method_options: Mapping[str, Any] | None = None,
                             error_feedback: bool = True, bytes_per_element: int = 4) -> dict[str, float]:
    """Optimizer-state bytes per worker by kind (the keys of `sync.optimizer_state_bytes`) for an optimizer family;
    the low-rank and Dion families take their rank from `method_options` as `analytic_events` does."""
    if family not in OPTIMIZER_FAMILIES:
        raise ValueError(f"optimizer family {family!r} is unknown: use one of {OPTIMIZER_FAMILIES}")
    b = bytes_per_element
    matrices = sum(_numel(s) for s in shapes.lowrank)
    others = 2 * b * sum(_numel(s) for s in shapes.other)
    if family == "adamw":
        return {"adamw_moments": 2 * b * matrices + others}
    if family == "muon":
        return {"momentum_buffer": b * matrices, "adamw_moments": others}
    ranks = [_rank(method_options or {}, s) for s in shapes.lowrank]
    bases = b * sum(r * min(s) for s, r in zip(shapes.lowrank, ranks))
    if family == "dion":
        return {"momentum": b * matrices, "Q": bases, "adamw_moments": others}
    return {"moments": 2 * b * sum(r * max(s) for s, r in zip(shapes.lowrank, ranks)), "bases": bases,
            "error_feedback": b * matrices if error_feedback else 0, "adamw_moments": others}


def analytic_sync_state(method_options: Mapping[str, Any], shapes: ParamShapes,
                        bytes_per_element: int = 4) -> dict[str, float]:
    """State bytes per worker the sync engine keeps: for K-step methods the anchor W_anchor and, with the Nesterov
    outer step, its momentum (every parameter each); nothing otherwise."""
    if method_options.get("name") in DION_METHODS:
        return {}
    opts = sync_options({k: v for k, v in method_options.items() if k not in ("rank", "rank_fraction")})
    if not opts.method.k_step:
        return {}
    params = bytes_per_element * sum(_numel(s) for s in shapes.lowrank + shapes.other)
    return {"anchor": params, "outer_momentum": params if opts.outer == "nesterov" else 0}


SEPARATE_STATE = {"error_feedback": "error_feedback_bytes", "compression_error": "error_feedback_bytes",
                  "anchor": "anchor_bytes", "outer_momentum": "anchor_bytes"}


def state_summary(bytes_by_kind: Mapping[str, float]) -> dict[str, float]:
    """Optimizer state as the paper counts it (moments, bases, AdamW moments, Dion's and Muon's buffers), with the
    error-feedback buffer E and the sync anchor (with any outer momentum) apart."""
    out = {"optimizer_state_bytes": 0.0, "error_feedback_bytes": 0.0, "anchor_bytes": 0.0}
    for kind, n in bytes_by_kind.items():
        out[SEPARATE_STATE.get(kind, "optimizer_state_bytes")] += float(n)
    return out


# ---------------------------------------------------------------------------- the paper's settings
PAPER_SIZES = {"lordo-16m": 32, "lordo-125m": 96, "lordo-720m": 256, "gpt2-45m": 64,
               "llama3-320m": 96}  # rank r = d_model / 8 for every low-rank method (matched rank)
PAPER_WORLD_SIZE = 4  # M
PAPER_SYNC_EVERY = 32  # K, also K_u = K_v (D8 default)
LOWRANK_DDP_REFRESH = 200  # T: GaLore's default basis refresh period
PAPER_CLAIMS = {"ddp": 25.0, "lowrank_ddp": 10.0}  # "about 25x less than DDP, 10x less than low-rank DDP"


@dataclass(frozen=True)
class PaperMethod:
    """A method at the paper's settings: its communication options (`analytic_events`) and optimizer family."""

    options: dict[str, Any]
    family: str


def paper_methods(rank: int) -> dict[str, PaperMethod]:
    """Every method preset at the paper's probable settings (spec: M = 4, K = 32, r = d/8); Muon communicates as DDP,
    Ada-Orth-Dion as Dion at its rank cap."""
    k = PAPER_SYNC_EVERY
    return {
        "ddp": PaperMethod({"name": "ddp"}, "adamw"),
        "lowrank_ddp": PaperMethod({"name": "lowrank_ddp", "rank": rank, "basis_refresh_every": LOWRANK_DDP_REFRESH},
                                   "lowrank"),
        "local_adam": PaperMethod({"name": "local_adam", "sync_every": k}, "adamw"),
        "diloco": PaperMethod({"name": "diloco", "sync_every": k}, "adamw"),
        "lordo_local": PaperMethod({"name": "lordo_local", "sync_every": k, "rank": rank}, "lowrank"),
        "lordo_global_noqh": PaperMethod({"name": "lordo_global_noqh", "sync_every": k, "rank": rank}, "lowrank"),
        "lordo": PaperMethod({"name": "lordo", "sync_every": k, "rank": rank}, "lowrank"),
        "muon": PaperMethod({"name": "ddp"}, "muon"),
        "dion": PaperMethod({"name": "dion", "rank": rank}, "dion"),
        "orth_dion": PaperMethod({"name": "orth_dion", "rank": rank}, "dion"),
        "ada_orth_dion": PaperMethod({"name": "dion", "rank": rank}, "dion"),
    }


def model_shapes(size: str, **overrides: Any) -> ParamShapes:
    """ParamShapes of a named model size with any ModelConfig field overridden, built on the meta device."""
    with torch.device("meta"):
        model = Transformer(model_config(size, **overrides))
    return param_shapes(model)


def method_row(method: PaperMethod, shapes: ParamShapes, steps: int, bytes_per_element: int = 4,
               latency_s: float = LATENCY_S) -> dict[str, float]:
    """Steady and amortized MB per worker per step, collectives per step, state MB (optimizer state as the paper
    counts it, E, anchor) and the communication time per step (s) at each bandwidth of BANDWIDTHS_GBPS."""
    opts, m, b = method.options, PAPER_WORLD_SIZE, bytes_per_element
    steady = sum(analytic_bytes_per_step(opts, shapes, m, b).values())
    collectives = analytic_collectives_per_step(opts, shapes)
    state = state_summary({**analytic_optimizer_state(method.family, shapes, opts, bytes_per_element=b),
                           **analytic_sync_state(opts, shapes, b)})
    amortized = sum(analytic_bytes_per_step(opts, shapes, m, b, steps).values())
    row = dict(steady_mb=steady / 1e6, amortized_mb=amortized / 1e6,
               collectives_per_step=collectives, **{k.replace("_bytes", "_mb"): v / 1e6 for k, v in state.items()})
    for bw in BANDWIDTHS_GBPS:
        row[f"comm_s_{bw:g}gbps"] = step_time(0.0, steady, collectives, bw, latency_s)
    return row


def paper_table(steps: int, bytes_per_element: int = 4, latency_s: float = LATENCY_S) -> list[dict[str, Any]]:
    """Rows (size, rank, method, `method_row` figures, ratios of ddp's and low-rank DDP's bytes and of AdamW's
    optimizer state to the method's, and for low-rank methods AdamW's moments of the hidden matrices over the
    method's low-rank moments) at every paper size with the paper's settings."""
    rows = []
    for size, rank in PAPER_SIZES.items():
        shapes = model_shapes(size)
        methods = paper_methods(rank)
        figures = {name: method_row(method, shapes, steps, bytes_per_element, latency_s)
                   for name, method in methods.items()}
        full_rank_moments = 2 * bytes_per_element * sum(_numel(s) for s in shapes.lowrank)
        for name, row in figures.items():
            lowrank = methods[name].family == "lowrank"
            moments = analytic_optimizer_state("lowrank", shapes, methods[name].options)["moments"] if lowrank else 0
            rows.append(dict(size=size, rank=rank, method=name, **row,
                             ddp_over_method=figures["ddp"]["steady_mb"] / row["steady_mb"],
                             lowrank_ddp_over_method=figures["lowrank_ddp"]["steady_mb"] / row["steady_mb"],
                             adamw_state_over_method=figures["ddp"]["optimizer_state_mb"] / row["optimizer_state_mb"],
                             matrix_moments_ratio=full_rank_moments / moments if lowrank else math.nan))
    return rows


def write_rows(rows: list[dict[str, Any]], path: str) -> None:
    """The paper table as CSV, each row stamped with the code's commit and the settings it assumes."""
    import pandas as pd

    from lowcomm.training.run_dir import git_commit

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    settings = dict(world_size=PAPER_WORLD_SIZE, sync_every=PAPER_SYNC_EVERY, lowrank_ddp_refresh=LOWRANK_DDP_REFRESH,
                    bytes_per_element=4, latency_s=LATENCY_S, git_commit=git_commit())
    table = pd.DataFrame([{**row, **settings} for row in rows])
    table.to_csv(path, index=False)
    Path(path).with_suffix(".md").write_text(table.drop(columns=list(settings)).to_markdown(index=False, floatfmt=".4g")
                                             + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10_000, help="steps over which one-offs are amortized")
    parser.add_argument("--out", help="also write the rows to this CSV (with the git commit)")
    args = parser.parse_args(argv)
    print("Bytes on the wire per worker per step, fp32 (4 bytes per number; bf16 halves every figure, ratios "
          f"unchanged),\nM = {PAPER_WORLD_SIZE} workers (ring all-reduce: 2(M-1)/M x payload), "
          f"K = K_u = K_v = {PAPER_SYNC_EVERY}, "
          f"r = d/8, lowrank_ddp refresh T = {LOWRANK_DDP_REFRESH}; amortized over {args.steps} steps.\n")
    rows = paper_table(args.steps)
    if args.out:
        write_rows(rows, args.out)
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


if __name__ == "__main__":
    main()
