"""Spread over seeds and the two-standard-deviation rule every table and report uses.

Standard deviations are sample standard deviations over seeds (ddof = 1). A difference of two means a - b has
the standard deviation sqrt(s_a^2 / n_a + s_b^2 / n_b); it counts as a difference when |a - b| > 2 of those,
otherwise as a tie within noise. With fewer than two seeds on either side there is no spread and no verdict.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable

TIE_STDS = 2.0

LOWER, HIGHER, TIE, NO_SPREAD = "lower", "higher", "tie", "no spread"


def sample_std(values: Iterable[float]) -> float:
    """Sample standard deviation (ddof = 1) of the finite values; NaN for fewer than two."""
    xs = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    if len(xs) < 2:
        return math.nan
    mean = sum(xs) / len(xs)
    return math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1))


@dataclass(frozen=True)
class Difference:
    """a - b, its standard deviation, and the verdict for a relative to b: 'lower', 'higher', 'tie' or
    'no spread' (fewer than two seeds on a side, or a missing value)."""

    diff: float
    std: float
    verdict: str


def difference(mean_a: float, std_a: float, n_a: int, mean_b: float, std_b: float, n_b: int) -> Difference:
    """a - b with sqrt(s_a^2 / n_a + s_b^2 / n_b); a verdict only when both sides have two or more seeds."""
    diff = mean_a - mean_b
    if n_a < 2 or n_b < 2 or not all(math.isfinite(x) for x in (mean_a, mean_b, std_a, std_b)):
        return Difference(diff, math.nan, NO_SPREAD)
    std = math.sqrt(std_a ** 2 / n_a + std_b ** 2 / n_b)
    if abs(diff) <= TIE_STDS * std:
        return Difference(diff, std, TIE)
    return Difference(diff, std, LOWER if diff < 0 else HIGHER)


def within_reference(value: float, ref_mean: float, ref_std: float) -> bool | None:
    """Whether `value` lies within two standard deviations of a stored mean over seeds; None without a spread
    (a reference of one seed, or a missing value)."""
    if not all(math.isfinite(x) for x in (value, ref_mean, ref_std)):
        return None
    return abs(value - ref_mean) <= TIE_STDS * ref_std
