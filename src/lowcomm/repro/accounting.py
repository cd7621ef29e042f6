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
  self-sync    (optimizer_sync: the Dion family) P and W every step: (p + q) r per matrix, or G (pq) when
               (p + q) r >= pq; G of the other parameters
Setup broadcasts the parameters once (step 0); it is not part of the per-step figures.
Optimizer state per worker (fp32), by the kinds the optimizers report:
  adamw        adamw_moments 2 pq (every parameter)
  low-rank     moments 2 r max(p, q), bases r min(p, q), error_feedback pq (when on); AdamW moments of the rest
  muon         momentum_buffer pq; AdamW moments of the rest
  dion family  momentum pq, Q r min(p, q); AdamW moments of the rest
  K-step sync  anchor (every parameter), outer_momentum (every parameter, Nesterov outer step only)

    python -m lowcomm.repro.accounting [--steps N] [--out CSV] [--flops-per-s F]
prints the figures at every paper size with the paper's probable settings (r = d/8), and the modeled link rate below
which LoRDO reaches a common target before DDP (and low-rank DDP) when it needs rho times their steps, each worker
computing 6 N T / F seconds per step (`paper_crossover`).

A method is an AccountedMethod: its sync options (what the sync kind runs, lowcomm.distributed.options.SyncKind) and
the optimizer's rank r (a low-rank optimizer's) or rank fraction (a Dion-family optimizer's); the functions also take
it as a mapping, the sync config keys plus `rank` or `rank_fraction`.
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
from lowcomm.distributed.options import SyncOptions, sync_options
from lowcomm.model import Transformer, model_config
from lowcomm.optim.dion import fixed_rank
from lowcomm.optim.groups import hidden_matrices
from lowcomm.optim.projection import check_rank, projected_shape, projection_side
from lowcomm.repro.wallclock import BANDWIDTHS_GBPS, LATENCY_S, compute_seconds, crossover_rate_mbit, step_time

@dataclass(frozen=True)
class ParamShapes:
    """Shapes of the low-rank (2-D hidden) matrices and of every other parameter."""

    lowrank: tuple[tuple[int, int], ...]
    other: tuple[tuple[int, ...], ...]

    @property
    def matrix_elements(self) -> int:
        """Numbers in the low-rank matrices: sum pq."""
        return sum(_numel(s) for s in self.lowrank)

    @property
    def other_elements(self) -> int:
        """Numbers in every other parameter."""
        return sum(_numel(s) for s in self.other)

    @property
    def elements(self) -> int:
        """Numbers in every parameter."""
        return self.matrix_elements + self.other_elements


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


RANK_KEYS = ("rank", "rank_fraction")


@dataclass(frozen=True)
class AccountedMethod:
    """What a run sends and keeps: its sync options, and its optimizer's rank r of every matrix (a low-rank
    optimizer's `rank`; None: full-rank moments) or rank fraction (a Dion-family optimizer's `rank_fraction`). Under
    a sync kind whose optimizer synchronizes itself (SyncKind.optimizer_synchronizes) the optimizer is the Dion family,
    all-reducing its factors P and W every step."""

    sync: SyncOptions
    rank: int | None = None
    rank_fraction: float | None = None

    def __post_init__(self) -> None:
        if self.sync.kind.optimizer_basis is not None and self.rank is None:
            raise ValueError(f"method options of {self.sync.name!r} need 'rank': its messages and moments are rank-r")


MethodOptions = AccountedMethod | Mapping[str, Any]  # the functions' input: an AccountedMethod or its mapping form


def accounted_method(method: MethodOptions) -> AccountedMethod:
    """`method` itself, or the AccountedMethod of a mapping: a sync config section plus `rank` or `rank_fraction`."""
    if isinstance(method, AccountedMethod):
        return method
    sync = sync_options({k: v for k, v in method.items() if k not in RANK_KEYS})
    return AccountedMethod(sync, method.get("rank"), method.get("rank_fraction"))


def matrix_rank(method: AccountedMethod, shape: tuple[int, int]) -> int:
    """The rank of a matrix: the optimizer's `rank`, or for the Dion family r = ceil(rank_fraction * min(p, q)), at
    most min(p, q) (lowcomm.optim.dion.fixed_rank)."""
    if method.rank is not None:
        check_rank(shape, method.rank)
        return method.rank
    if method.rank_fraction is not None:
        return fixed_rank(method.rank_fraction, *shape)
    raise ValueError(f"method options of {method.sync.name!r} need 'rank' (an integer; a Dion-family optimizer also "
                     "accepts 'rank_fraction') to count low-rank messages")


def projected_elements(method: AccountedMethod, shapes: ParamShapes) -> int:
    """Numbers in one rank-r projection (or low-rank moment) of every matrix: sum r max(p, q)."""
    return sum(_numel(projected_shape(s, matrix_rank(method, s), projection_side(s))) for s in shapes.lowrank)


def moment_elements(method: AccountedMethod, shapes: ParamShapes) -> int:
    """Numbers in one moment (u or v) of the parameters in the sync's state scope: r max(p, q) per matrix for a
    low-rank optimizer, none for the local Dion family's matrices (their state is M), else pq; plus the other
    parameters' AdamW moments when the scope is "all"."""
    if method.sync.kind.local_dion:
        matrices = 0
    elif method.rank is not None:
        matrices = projected_elements(method, shapes)
    else:
        matrices = shapes.matrix_elements
    return matrices + (shapes.other_elements if method.sync.state_sync_scope == "all" else 0)


def factor_events(method: AccountedMethod, shapes: ParamShapes) -> list[Event]:
    """The Dion family's all-reduces every step: P, then W, (p + q) r numbers per matrix, or G (pq) of the matrices
    where (p + q) r >= pq; and G of the other parameters."""
    compressed = [(s, (s[0] + s[1]) * matrix_rank(method, s)) for s in shapes.lowrank]
    factors = sum(n for s, n in compressed if n < _numel(s))
    fallback = sum(_numel(s) for s, n in compressed if n >= _numel(s))
    return [Event("factor", "all_reduce", factors, 1, 1, collectives=2),
            Event("gradient", "all_reduce", shapes.other_elements + fallback, 1, 1)]


def gradient_events(method: AccountedMethod, shapes: ParamShapes) -> list[Event]:
    """Per-step gradient all-reduces: every G, or with projected gradients Q^T G of the matrices, G of the rest and
    the matrices' G every T steps (the basis refresh)."""
    opts = method.sync
    if not opts.kind.per_step_gradients:
        return []
    if not opts.projected_gradients:
        return [Event("gradient", "all_reduce", shapes.elements, 1, 1)]
    return [Event("projected_gradient", "all_reduce", projected_elements(method, shapes), 1, 1),
            Event("gradient", "all_reduce", shapes.other_elements, 1, 1),
            Event("gradient", "all_reduce", shapes.matrix_elements, 1, opts.basis_refresh_every)]


def k_step_events(method: AccountedMethod, shapes: ParamShapes) -> list[Event]:
    """The K-step sync's all-reduces: Delta every K steps, u every K_u, v every K_v, Dion's buffers M every K_M."""
    opts = method.sync
    if not opts.kind.k_step:
        return []
    events = [Event("pseudo_gradient", "all_reduce", shapes.elements, opts.sync_every, opts.sync_every)]
    events += [Event("optimizer_state", "all_reduce", moment_elements(method, shapes), every, every)
               for every in (opts.state_sync_u, opts.state_sync_v) if every]
    if opts.state_sync_m:
        events.append(Event("optimizer_state", "all_reduce", shapes.matrix_elements, opts.state_sync_m,
                            opts.state_sync_m))
    return events


def first_step_events(method: AccountedMethod, shapes: ParamShapes) -> list[Event]:
    """LoRDO's one-off all-reduce of the matrices' first-step G (D1), where the basis comes from the pseudo-gradient
    and no seeded Dion factor stands in for it."""
    opts = method.sync
    if opts.kind.global_basis == "pseudo_gradient" and not opts.kind.local_dion:
        return [Event("gradient", "all_reduce", shapes.matrix_elements, 1, 0)]
    return []


def analytic_events(method: MethodOptions, shapes: ParamShapes) -> list[Event]:
    """The collectives of a method (an AccountedMethod, or its mapping form), from step 1 on; those that send
    nothing are left out."""
    method = accounted_method(method)
    if method.sync.kind.optimizer_synchronizes:
        events = factor_events(method, shapes)
    else:
        events = gradient_events(method, shapes) + k_step_events(method, shapes) + first_step_events(method, shapes)
    return [e for e in events if e.elements]


def _wire(event: Event, world_size: int, bytes_per_element: int) -> float:
    return wire_bytes(event.collective, event.elements * bytes_per_element, world_size)


def setup_bytes(shapes: ParamShapes, world_size: int, bytes_per_element: int = 4) -> dict[str, float]:
    """Bytes per worker of the engine's setup: the parameters broadcast from rank 0 (step 0)."""
    return {"parameters": wire_bytes("broadcast", shapes.elements * bytes_per_element, world_size)}


def _rate(event: Event, steps: int | None) -> float:
    """Occurrences per step: 1 / period in the steady state (one-offs left out), or the mean over steps 1..steps."""
    if steps is None:
        return 0.0 if event.period == 0 else 1.0 / event.period
    return event.count(steps) / steps


def analytic_bytes_at(method_options: MethodOptions, shapes: ParamShapes, world_size: int, step: int,
                      bytes_per_element: int = 4) -> dict[str, float]:
    """Bytes on the wire per worker at step `step` (>= 1), by kind (kinds that send nothing are left out)."""
    totals: dict[str, float] = {}
    for e in analytic_events(method_options, shapes):
        if e.happens_at(step):
            totals[e.kind] = totals.get(e.kind, 0.0) + _wire(e, world_size, bytes_per_element)
    return totals


def analytic_bytes_per_step(method_options: MethodOptions, shapes: ParamShapes, world_size: int,
                            bytes_per_element: int = 4, steps: int | None = None) -> dict[str, float]:
    """Bytes on the wire per worker per step, by kind. steps=None: the steady state (periodic collectives over their
    period, one-offs such as LoRDO's first-step gradient (D1) left out); steps=N: the mean over steps 1..N, one-offs
    included (amortized)."""
    totals: dict[str, float] = {}
    for e in analytic_events(method_options, shapes):
        totals[e.kind] = totals.get(e.kind, 0.0) + _rate(e, steps) * _wire(e, world_size, bytes_per_element)
    return {k: v for k, v in totals.items() if v}


def analytic_collectives_per_step(method_options: MethodOptions, shapes: ParamShapes,
                                  steps: int | None = None) -> float:
    """Collective calls per worker per step: the steady state (steps=None) or the mean over steps 1..steps."""
    return sum(_rate(e, steps) * e.collectives for e in analytic_events(method_options, shapes))


OPTIMIZER_FAMILIES = ("adamw", "lowrank", "muon", "dion")


def analytic_optimizer_state(family: str, shapes: ParamShapes, method_options: MethodOptions | None = None,
                             error_feedback: bool = True, bytes_per_element: int = 4) -> dict[str, float]:
    """Optimizer-state bytes per worker by kind (the keys of `sync.optimizer_state_bytes`) for an optimizer family;
    the low-rank and Dion families take their rank from `method_options` (`matrix_rank`)."""
    if family not in OPTIMIZER_FAMILIES:
        raise ValueError(f"optimizer family {family!r} is unknown: use one of {OPTIMIZER_FAMILIES}")
    b = bytes_per_element
    matrices = shapes.matrix_elements
    others = 2 * b * shapes.other_elements
    if family == "adamw":
        return {"adamw_moments": 2 * b * matrices + others}
    if family == "muon":
        return {"momentum_buffer": b * matrices, "adamw_moments": others}
    method = accounted_method(method_options)
    bases = b * sum(matrix_rank(method, s) * min(s) for s in shapes.lowrank)
    if family == "dion":
        return {"momentum": b * matrices, "Q": bases, "adamw_moments": others}
    return {"moments": 2 * b * projected_elements(method, shapes), "bases": bases,
            "error_feedback": b * matrices if error_feedback else 0, "adamw_moments": others}


def analytic_sync_state(method_options: MethodOptions, shapes: ParamShapes,
                        bytes_per_element: int = 4) -> dict[str, float]:
    """State bytes per worker the sync engine keeps: for K-step methods the anchor W_anchor and, with the Nesterov
    outer step, its momentum (every parameter each); nothing otherwise."""
    opts = accounted_method(method_options).sync
    if not opts.kind.k_step:
        return {}
    params = bytes_per_element * shapes.elements
    return {"anchor": params, "outer_momentum": params if opts.outer == "nesterov" else 0}


def matrix_moments_ratio(adamw_moments_of_adamw: Any, adamw_moments_of_method: Any, lowrank_moments: Any) -> Any:
    """AdamW's moments of the hidden matrices over a low-rank optimizer's: (A_adamw - A_method) / moments, A the AdamW
    moments each keeps (of every parameter under AdamW, of the other parameters under the low-rank optimizer);
    numbers or table columns alike."""
    return (adamw_moments_of_adamw - adamw_moments_of_method) / lowrank_moments


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
CPU_RANK = 16  # r = d/8 of the cpu model (d 128): the state table's measured size beside the paper sizes
PAPER_WORLD_SIZE = 4  # M
PAPER_SYNC_EVERY = 32  # K, also K_u = K_v (D8 default)
LOWRANK_DDP_REFRESH = 200  # T: GaLore's default basis refresh period
PAPER_CLAIMS = {"ddp": 25.0, "lowrank_ddp": 10.0}  # "about 25x less than DDP, 10x less than low-rank DDP"
PAPER_TOKENS_PER_WORKER_STEP = 32 * 2048  # T: 32 sequences of 2,048 tokens per worker (the paper preset's batch)
PAPER_FLOPS_PER_S = 4e14  # F, sustained per worker: 40 % of an H100's dense bf16 peak (989 TFLOP/s); a decision
STEPS_RATIOS = (1.0, 1.1, 1.25, 1.5, 2.0)  # rho = S_a / S_b: a's steps to the common target over b's
CROSSOVER_PAIRS = (("lordo", "ddp"), ("lordo", "lowrank_ddp"))


@dataclass(frozen=True)
class PaperMethod:
    """A method at the paper's settings: what it sends and keeps (`analytic_events`) and its optimizer family."""

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


def meta_model(size: str, **overrides: Any) -> Transformer:
    """The model of a named size with any ModelConfig field overridden, on the meta device (shapes, no memory)."""
    with torch.device("meta"):
        return Transformer(model_config(size, **overrides))


def model_shapes(size: str, **overrides: Any) -> ParamShapes:
    """ParamShapes of a named model size with any ModelConfig field overridden."""
    return param_shapes(meta_model(size, **overrides))


STATE_KINDS = ("moments", "bases", "error_feedback", "anchor", "outer_momentum", "adamw_moments", "momentum_buffer",
               "momentum", "Q")  # every kind of state a worker keeps, in the order the state tables show them


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
    which a reaches a common target before b (lowcomm.repro.wallclock.crossover_rate_mbit on `paper_table`'s steady
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
