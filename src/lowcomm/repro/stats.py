"""Spread over seeds and the paired verdict rule every table and the claims report use.

Seed s fixes the initialization and the data order, the same for every method, so two rows a and b are compared
by their per-seed differences d_s = a_s - b_s over the seeds both have: the mean d and the 95 % t-interval
d +- t_{0.975, n-1} s_d / sqrt(n) on n - 1 degrees of freedom. Verdict for a against b: 'lower' / 'higher' when the
interval excludes 0, 'equivalent' when it lies inside +-EQUIVALENCE_MARGIN, else 'inconclusive'; with fewer than
MIN_SEEDS pairs there is no verdict ('too few seeds'). Seeds only one side has are named ('unpaired').
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from scipy.stats import t as student_t

TIE_STDS = 2.0  # the newcomer's check of one run against a stored mean +- std (within_reference)
CONFIDENCE = 0.95
EQUIVALENCE_MARGIN = 0.01  # nats of validation loss (in the compared metric's unit for other metrics)
MIN_SEEDS = 3

LOWER, HIGHER, EQUIVALENT, INCONCLUSIVE, TOO_FEW = "lower", "higher", "equivalent", "inconclusive", "too few seeds"


def sample_std(values: Iterable[float]) -> float:
    """Sample standard deviation (ddof = 1) of the finite values; NaN for fewer than two."""
    xs = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    if len(xs) < 2:
        return math.nan
    mean = sum(xs) / len(xs)
    return math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1))


@dataclass(frozen=True)
class Paired:
    """a - b over the seeds both sides have: n pairs, the mean difference, its 95 % t-interval [low, high], the
    seeds only one side has, and the verdict for a against b."""

    n: int
    diff: float
    low: float
    high: float
    unpaired: tuple[int, ...]
    verdict: str


def _finite(values: Mapping[int, float]) -> dict[int, float]:
    return {s: float(v) for s, v in values.items() if v is not None and math.isfinite(float(v))}


def paired_difference(a: Mapping[int, float], b: Mapping[int, float],
                      margin: float = EQUIVALENCE_MARGIN) -> Paired:
    """The paired comparison of per-seed values {seed: value} of a and b (module docstring)."""
    a, b = _finite(a), _finite(b)
    seeds = sorted(set(a) & set(b))
    unpaired = tuple(sorted(set(a) ^ set(b)))
    d = [a[s] - b[s] for s in seeds]
    n = len(d)
    mean = sum(d) / n if n else math.nan
    if n < MIN_SEEDS:
        return Paired(n, mean, math.nan, math.nan, unpaired, TOO_FEW)
    half = student_t.ppf(0.5 + CONFIDENCE / 2, n - 1) * sample_std(d) / math.sqrt(n)
    low, high = mean - half, mean + half
    if low > 0:
        verdict = HIGHER
    elif high < 0:
        verdict = LOWER
    elif -margin <= low and high <= margin:
        verdict = EQUIVALENT
    else:
        verdict = INCONCLUSIVE
    return Paired(n, mean, low, high, unpaired, verdict)


def mean_or_inf(values: Mapping[int, float]) -> float:
    """The mean over seeds of {seed: value}; +inf when any value is not finite (a diverged run)."""
    xs = [math.inf if v is None else float(v) for v in values.values()]
    return math.inf if not all(math.isfinite(x) for x in xs) else sum(xs) / len(xs)


def against_best(points: Mapping[Any, Mapping[int, float]]) -> tuple[Any, dict[Any, dict]]:
    """The protocol's ranking of grid points {point: {seed: final loss}}: the winner (best mean_or_inf; the first in
    order on a tie) and per point its seeds, mean, spread, and the paired difference to the winner (interval and
    verdict; 0 and no verdict on the winner's own row)."""
    means = {p: mean_or_inf(v) for p, v in points.items()}
    best = min(points, key=lambda p: means[p])
    rows = {}
    for p, values in points.items():
        d = paired_difference(values, points[best])
        rows[p] = {"seeds": len(values), "mean": means[p], "std": sample_std(values.values()),
                   "diff_to_winner": 0.0 if p == best else d.diff, "ci_low": d.low, "ci_high": d.high,
                   "verdict_to_winner": "" if p == best else d.verdict, "chosen": p == best}
    return best, rows


def within_reference(value: float, ref_mean: float, ref_std: float) -> bool | None:
    """Whether `value` lies within two standard deviations of a stored mean over seeds; None without a spread
    (a reference of one seed, or a missing value)."""
    if not all(math.isfinite(x) for x in (value, ref_mean, ref_std)):
        return None
    return abs(value - ref_mean) <= TIE_STDS * ref_std
