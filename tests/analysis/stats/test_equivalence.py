"""Non-inferiority and equivalence (TOST) tests: the numbers are statsmodels' `ttost_paired` on
the same data, and the cases no t-test can decide are refused, not guessed."""

from __future__ import annotations

import math

import numpy as np
import pytest
from statsmodels.stats.weightstats import ttost_paired

from analysis.stats.equivalence import noninferiority_paired, tost_paired

# (x, y, margin): small samples as a staleness study has them, effects inside, at and outside
# the margin, both signs.
CASES = [
    (np.array([0.81, 0.79, 0.84, 0.80, 0.83]), np.array([0.80, 0.80, 0.82, 0.81, 0.82]), 0.02),
    (np.array([0.61, 0.58, 0.66, 0.60, 0.63]), np.array([0.70, 0.69, 0.72, 0.71, 0.70]), 0.02),
    (np.array([0.51, 0.49, 0.55]), np.array([0.50, 0.52, 0.50]), 0.05),
    (
        np.array([0.90, 0.85, 0.88, 0.91, 0.86, 0.87]),
        np.array([0.86, 0.84, 0.85, 0.9, 0.8, 0.8]),
        0.01,
    ),
]


@pytest.mark.parametrize("x, y, margin", CASES)
def test_the_p_values_are_statsmodels_ttost_paired(x, y, margin) -> None:
    overall, (_, lower, _), _ = ttost_paired(x, y, -margin, margin)
    worse = noninferiority_paired(x, y, margin)
    same = tost_paired(x, y, margin)
    assert worse.p_value == pytest.approx(float(lower), rel=1e-12, abs=1e-15)
    assert same.p_value == pytest.approx(float(overall), rel=1e-12, abs=1e-15)
    assert worse.n == same.n == len(x) and worse.note == same.note == ""


def test_direction_a_loss_beyond_the_margin_is_not_non_inferior() -> None:
    x, y, _ = CASES[1]  # x about 0.09 below y
    assert noninferiority_paired(x, y, 0.02).p_value > 0.5
    assert noninferiority_paired(y, x, 0.02).p_value < 1e-3  # y is not worse than x
    assert tost_paired(x, y, 0.02).p_value > 0.5  # and the two are not within 0.02


def test_pairs_with_a_missing_score_are_dropped() -> None:
    x = np.array([0.8, np.nan, 0.82, 0.79, 0.81])
    y = np.array([0.8, 0.7, 0.81, np.nan, 0.80])
    keep = [0, 2, 4]
    assert noninferiority_paired(x, y, 0.02).p_value == pytest.approx(
        noninferiority_paired(x[keep], y[keep], 0.02).p_value
    )
    assert tost_paired(x, y, 0.02).n == 3


def test_one_pair_is_refused_and_equal_differences_take_the_tests_limit() -> None:
    one = noninferiority_paired(np.array([0.8]), np.array([0.7]), 0.02)
    assert math.isnan(one.p_value) and "at least 2 matched seeds" in one.note
    # Bitwise-equal trials (two regimes that coincide on every seed): every difference is 0, the
    # t statistic is infinite and p its limit, as statsmodels has it: equivalent, not worse.
    x = np.array([0.8, 0.7, 0.9])
    with np.errstate(divide="ignore", invalid="ignore"):
        overall, (_, lower, _), _ = ttost_paired(x, x, -0.02, 0.02)
        beyond, (_, lower_beyond, _), _ = ttost_paired(x - 0.05, x, -0.02, 0.02)
    same, worse = tost_paired(x, x, 0.02), noninferiority_paired(x, x, 0.02)
    assert same.p_value == overall == 0.0 and worse.p_value == lower == 0.0
    assert "every matched difference is equal" in same.note
    # Equal differences beyond the margin: neither claim holds.
    assert tost_paired(x - 0.05, x, 0.02).p_value == beyond == 1.0
    assert noninferiority_paired(x - 0.05, x, 0.02).p_value == lower_beyond == 1.0
    with pytest.raises(ValueError, match="margin must be > 0"):
        tost_paired(np.array([0.8, 0.7]), np.array([0.8, 0.6]), 0.0)
