"""The paired verdict rule against scipy's t distribution, and the cases that tell it from the old 2-std rule."""

import math

import pytest
from scipy import stats as sp

from lowcomm.repro.stats import (
    EQUIVALENT,
    HIGHER,
    INCONCLUSIVE,
    LOWER,
    TOO_FEW,
    paired_difference,
    sample_std,
)


def t_interval(d: list[float]) -> tuple[float, float]:
    """The 95 % t-interval of the mean of d, from scipy."""
    return sp.t.interval(0.95, len(d) - 1, loc=sum(d) / len(d), scale=sp.sem(d))


def old_rule_is_a_tie(a: list[float], b: list[float]) -> bool:
    """The unpaired rule this one replaced: |mean a - mean b| <= 2 sqrt(s_a^2 / n + s_b^2 / n)."""
    n = len(a)
    return abs(sum(a) / n - sum(b) / n) <= 2 * math.sqrt(sample_std(a) ** 2 / n + sample_std(b) ** 2 / n)


def test_same_sign_in_every_seed_is_higher_where_the_unpaired_rule_saw_a_tie():
    b = [4.861, 4.884, 4.865]  # seed-to-seed spread of about 0.012 nats, shared by both sides
    a = [x + d for x, d in zip(b, (0.010, 0.011, 0.012))]
    assert old_rule_is_a_tie(a, b)
    p = paired_difference(dict(enumerate(a)), dict(enumerate(b)))
    low, high = t_interval([x - y for x, y in zip(a, b)])
    assert (p.n, p.verdict) == (3, HIGHER) and p.low == pytest.approx(low) and p.high == pytest.approx(high)
    assert p.diff == pytest.approx(0.011)


def test_three_seeds_of_one_sign_can_still_be_inconclusive():
    # table3's stored lordo - lordo_local per seed: +0.0097, +0.0097, +0.0191; t_{0.975, 2} = 4.30 widens the interval
    d = [0.0097, 0.0097, 0.0191]
    p = paired_difference({s: 4.0 + x for s, x in enumerate(d)}, {s: 4.0 for s in range(3)})
    assert p.verdict == INCONCLUSIVE and p.low < 0 < p.high


def test_an_interval_inside_the_margin_is_equivalent():
    d = [0.002, -0.001, 0.001, -0.002, 0.0005]
    p = paired_difference({s: 4.0 + x for s, x in enumerate(d)}, {s: 4.0 for s in range(5)})
    low, high = t_interval(d)
    assert p.verdict == EQUIVALENT and (p.low, p.high) == (pytest.approx(low), pytest.approx(high))
    assert -0.01 < low < 0 < high < 0.01


def test_an_interval_holding_zero_and_beyond_the_margin_is_inconclusive():
    d = [0.03, -0.02, 0.01]
    p = paired_difference({s: 4.0 + x for s, x in enumerate(d)}, {s: 4.0 for s in range(3)})
    assert p.verdict == INCONCLUSIVE and p.low < -0.01 and p.high > 0.01
    assert (p.low, p.high) == tuple(pytest.approx(v) for v in t_interval(d))


def test_lower_and_unpaired_seeds_and_too_few():
    a, b = {0: 3.0, 1: 3.1, 2: 3.05, 3: 3.0}, {0: 3.2, 1: 3.3, 2: 3.2, 4: 9.0}
    p = paired_difference(a, b)
    assert (p.n, p.unpaired, p.verdict) == (3, (3, 4), LOWER)
    assert paired_difference({0: 1.0, 1: 2.0}, {0: 1.5, 1: 2.5}).verdict == TOO_FEW
    assert paired_difference({0: 1.0, 1: math.nan, 2: 1.0}, {0: 1.0, 1: 1.0, 2: 1.0}).n == 2  # a NaN drops a pair
