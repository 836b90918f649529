"""Wilson score interval: exact 0 and 1 at the ends, statsmodels' values elsewhere."""

from __future__ import annotations

import math

import pytest
from statsmodels.stats.proportion import proportion_confint

from analysis.stats import wilson


@pytest.mark.parametrize("n", [1, 3, 7, 50])
def test_ends_are_exact(n: int) -> None:
    # statsmodels gives e.g. 5.55e-17 for 0 of 3, which the report printed as the lower bound.
    low, high = wilson(0, n, 0.95)
    assert low == 0.0 and 0 < high < 1
    low, high = wilson(n, n, 0.95)
    assert high == 1.0 and 0 < low < 1


def test_interior_matches_statsmodels() -> None:
    # 2 of 5 at 95%: centre (2 + 1.96^2 / 2) / (5 + 1.96^2) = 3.92 / 8.84 = 0.443
    low, high = wilson(2, 5, 0.95)
    ref = proportion_confint(2, 5, alpha=0.05, method="wilson")
    assert (low, high) == pytest.approx(ref, abs=1e-15)
    assert (low + high) / 2 == pytest.approx(3.9207 / 8.8415, abs=1e-4)


def test_no_trials_is_undefined() -> None:
    assert all(math.isnan(b) for b in wilson(0, 0, 0.95))
