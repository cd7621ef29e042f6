"""Modeled wall-clock: a model, not a measurement.

Per worker and per step, with no overlap of computation and communication:
    t_step = t_compute + bytes_per_step / bandwidth + latency x collectives_per_step
bytes_per_step and collectives_per_step are averages over the steps, so a K-step sync is amortized over K.
t_compute is a measured step time; bandwidth is in Gbit/s (1 Gbit = 1e9 bits). Time to a target loss =
steps to reach it (validation points, linearly interpolated) x t_step.
"""

from __future__ import annotations

import math
from typing import Sequence

BANDWIDTHS_GBPS = (1.0, 10.0, 100.0)
LATENCY_S = 50e-6  # one collective inside a data center (10e-3 is typical across regions)


def step_time(compute_s: float, bytes_per_step: float, collectives_per_step: float, bandwidth_gbps: float,
              latency_s: float = LATENCY_S) -> float:
    """t_compute + bytes / bandwidth + latency x collectives, in seconds."""
    return compute_s + bytes_per_step * 8 / (bandwidth_gbps * 1e9) + latency_s * collectives_per_step


def steps_to_reach(steps: Sequence[float], losses: Sequence[float], target: float) -> float:
    """The first step at which the loss curve (points in step order) reaches `target`, linearly interpolated
    between the last point above it and the first at or below it; NaN when it never does."""
    previous = None
    for step, loss in zip(steps, losses):
        if not math.isfinite(loss):
            continue
        if loss <= target:
            if previous is None:
                return float(step)
            s0, l0 = previous
            return s0 + (l0 - target) / (l0 - loss) * (step - s0)
        previous = (step, loss)
    return math.nan


def crossover_rate_mbit(steps_a: float, compute_a: float, bytes_a: float, collectives_a: float,
                        steps_b: float, compute_b: float, bytes_b: float, collectives_b: float,
                        latency_s: float = LATENCY_S) -> float:
    """The link rate R (Mbit/s) below which a reaches the target before b:
    S_a (c_a + 8 B_a / R + L n_a) = S_b (c_b + 8 B_b / R + L n_b) solved for R. inf where a is first at every rate,
    0 where it is first at none, NaN where a is first only above R (it sends more bytes to the target)."""
    fixed = steps_a * (compute_a + latency_s * collectives_a) - steps_b * (compute_b + latency_s * collectives_b)
    wire = 8 * (steps_b * bytes_b - steps_a * bytes_a)
    if wire > 0:
        return wire / fixed / 1e6 if fixed > 0 else math.inf
    return 0.0 if fixed >= 0 else math.nan


def compute_seconds(params: float, tokens: float, flops_per_s: float) -> float:
    """Seconds of one worker's step from the usual count of 6 N T FLOPs (forward and backward) for N parameters and
    T tokens, at a sustained `flops_per_s`."""
    return 6 * params * tokens / flops_per_s
