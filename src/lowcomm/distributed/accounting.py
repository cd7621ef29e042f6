"""Analytic communication model: bytes each worker puts on the wire, by kind, for every method.

Every collective of a method is an Event: `elements` numbers sent by `collective` at steps t >= first with
(t - first) % period == 0 (period 0: once). Bytes per worker follow the Communicator's model: ring all-reduce
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

    python -m lowcomm.distributed.accounting [--steps N]
prints the figures at lordo-125m and lordo-720m with the paper's probable settings.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

import torch
from torch import nn

from ..model import Transformer, model_config
from ..optim.groups import hidden_matrices
from ..optim.projection import check_rank, projected_shape, projection_side
from .comm import wire_bytes
from .options import sync_options

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
    """`elements` numbers of kind `kind` sent by `collective` at steps t >= first with (t - first) % period == 0;
    period 0 means once, at step `first`."""

    kind: str
    collective: str
    elements: int
    first: int
    period: int

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
        return [Event("factor", "all_reduce", factors, 1, 1),
                Event("gradient", "all_reduce", other_elements + fallback, 1, 1)]
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


# ---------------------------------------------------------------------------- the paper's settings
PAPER_SIZES = {"lordo-125m": 96, "lordo-720m": 256}  # rank r = d_model / 8
PAPER_WORLD_SIZE = 4  # M
PAPER_SYNC_EVERY = 32  # K, also K_u = K_v (D8 default)
LOWRANK_DDP_REFRESH = 200  # T: GaLore's default basis refresh period
PAPER_CLAIMS = {"ddp": 25.0, "lowrank_ddp": 10.0}  # "about 25x less than DDP, 10x less than low-rank DDP"


def paper_methods(rank: int) -> dict[str, dict[str, Any]]:
    """Method options at the paper's probable settings (spec: M = 4, K = 32, r = d/8)."""
    k = PAPER_SYNC_EVERY
    return {
        "ddp": {"name": "ddp"},
        "lowrank_ddp": {"name": "lowrank_ddp", "rank": rank, "basis_refresh_every": LOWRANK_DDP_REFRESH},
        "local_adam": {"name": "local_adam", "sync_every": k},
        "diloco": {"name": "diloco", "sync_every": k},
        "lordo_local": {"name": "lordo_local", "sync_every": k, "rank": rank},
        "lordo_global_noqh": {"name": "lordo_global_noqh", "sync_every": k, "rank": rank},
        "lordo": {"name": "lordo", "sync_every": k, "rank": rank},
        "dion / orth_dion": {"name": "dion", "rank": rank},
    }


def model_shapes(size: str) -> ParamShapes:
    """ParamShapes of a named model size, built on the meta device (no memory)."""
    with torch.device("meta"):
        model = Transformer(model_config(size))
    return param_shapes(model)


def paper_table(steps: int, bytes_per_element: int = 4) -> list[dict[str, Any]]:
    """Rows (size, method, steady-state and amortized MB per worker per step, ratio to ddp) at the paper's settings."""
    rows = []
    for size, rank in PAPER_SIZES.items():
        shapes = model_shapes(size)
        figures = {name: (sum(analytic_bytes_per_step(opts, shapes, PAPER_WORLD_SIZE, bytes_per_element).values()),
                          sum(analytic_bytes_per_step(opts, shapes, PAPER_WORLD_SIZE, bytes_per_element,
                                                      steps).values()))
                   for name, opts in paper_methods(rank).items()}
        ddp_steady = figures["ddp"][0]
        for name, (steady, amortized) in figures.items():
            rows.append(dict(size=size, rank=rank, method=name, steady_mb=steady / 1e6, amortized_mb=amortized / 1e6,
                             ddp_over_method=ddp_steady / steady))
    return rows


def write_rows(rows: list[dict[str, Any]], path: str) -> None:
    """The paper table as CSV, each row stamped with the code's commit and the settings it assumes."""
    import pandas as pd

    from ..results import git_commit

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    settings = dict(world_size=PAPER_WORLD_SIZE, sync_every=PAPER_SYNC_EVERY, lowrank_ddp_refresh=LOWRANK_DDP_REFRESH,
                    bytes_per_element=4, git_commit=git_commit())
    pd.DataFrame([{**row, **settings} for row in rows]).to_csv(path, index=False)


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
    print(f"{'size':<11} {'r':>4} {'method':<18} {'steady MB':>11} {'amortized MB':>13} {'ddp / method':>13}")
    for row in rows:
        print(f"{row['size']:<11} {row['rank']:>4} {row['method']:<18} {row['steady_mb']:>11.3f} "
              f"{row['amortized_mb']:>13.3f} {row['ddp_over_method']:>12.1f}x")
    print()
    for size in PAPER_SIZES:
        steady = {r["method"]: r["steady_mb"] for r in rows if r["size"] == size}
        for base, claim in PAPER_CLAIMS.items():
            print(f"{size}: {base} / lordo = {steady[base] / steady['lordo']:.1f}x "
                  f"(lordo / {base} = {steady['lordo'] / steady[base]:.4f}); paper: about {claim:.0f}x")


if __name__ == "__main__":
    main()
