"""Bytes on the wire and collectives per worker of a method (lowcomm.cost.method), by kind.

Every collective of a method is an Event: `elements` numbers sent by `collective` at steps t >= first with
(t - first) % period == 0 (period 0: once), in `collectives` calls. Bytes per worker follow the Communicator's
model (lowcomm.distributed.comm.wire_bytes): ring all-reduce 2(M-1)/M x payload, pipelined broadcast (M-1)/M x payload.
Per matrix (p x q) with rank r:
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
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from lowcomm.cost.method import AccountedMethod, MethodOptions, accounted_method, matrix_rank, projected_elements
from lowcomm.cost.shapes import ParamShapes
from lowcomm.distributed.comm import wire_bytes


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
    factors = sum(n for s, n in compressed if n < math.prod(s))
    fallback = sum(math.prod(s) for s, n in compressed if n >= math.prod(s))
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
