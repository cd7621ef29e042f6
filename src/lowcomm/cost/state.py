"""Optimizer and sync state bytes per worker of a method (lowcomm.cost.method), by the kinds the optimizers report
(fp32 unless told). Per matrix (p x q) with rank r:
  adamw        adamw_moments 2 pq (every parameter)
  low-rank     moments 2 r max(p, q), bases r min(p, q), error_feedback pq (when on); AdamW moments of the rest
  muon         momentum_buffer pq; AdamW moments of the rest
  dion family  momentum pq, Q r min(p, q); AdamW moments of the rest
  K-step sync  anchor (every parameter), outer_momentum (every parameter, Nesterov outer step only)
"""

from __future__ import annotations

from typing import Any, Mapping

from lowcomm.cost.method import MethodOptions, accounted_method, matrix_rank, projected_elements
from lowcomm.cost.shapes import ParamShapes


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


STATE_KINDS = ("moments", "bases", "error_feedback", "anchor", "outer_momentum", "adamw_moments", "momentum_buffer",
               "momentum", "Q")  # every kind of state a worker keeps, in the order the state tables show them
