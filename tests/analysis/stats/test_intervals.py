"""IQM, bootstrap intervals and probability of improvement against reference computations."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from analysis.stats import (
    MIN_SEEDS_NOTE,
    BootstrapSpec,
    aggregate_interval,
    iqm,
    paired_mean_difference,
    poi_interval,
    probability_of_improvement,
    stratified_interval,
)

scores = st.lists(st.floats(0, 1, allow_nan=False), min_size=1, max_size=30)
FAST = BootstrapSpec(n_resamples=1000, confidence=0.95, seed=0)


@settings(deadline=None)  # wall-clock deadlines flake on a loaded CI machine
@given(scores)
def test_iqm_equals_scipy_trim_mean(x: list[float]) -> None:
    assert iqm(np.array(x)) == pytest.approx(stats.trim_mean(x, 0.25), rel=1e-12, abs=1e-12)


def test_iqm_hand_worked() -> None:
    # 8 values, trim int(0.25 * 8) = 2 from each end: mean(3, 4, 5, 6) = 4.5; the outlier 100
    # is trimmed away.
    assert iqm(np.array([1, 2, 3, 4, 5, 6, 7, 100.0])) == pytest.approx(4.5)


def test_interval_coverage_of_true_mean() -> None:
    """About 95% of 95% intervals cover the true mean (and, by symmetry, the true IQM).

    200 normal samples of n = 30, 1000 resamples each. The percentile bootstrap slightly
    undercovers at small n (about 0.94 at n = 30, Efron & Tibshirani 1993, ch. 13); with 200
    draws the binomial SD of the coverage is sqrt(0.95 * 0.05 / 200) = 0.015, so [0.90, 0.98]
    is about +-2.7 SD around the expected value. Seeds are fixed: the test is deterministic.
    """
    rng = np.random.default_rng(123)
    hits = {"mean": 0, "iqm": 0}
    for draw in range(200):
        x = rng.normal(0.5, 0.1, 30)
        for aggregate in hits:
            interval = aggregate_interval(x, aggregate, BootstrapSpec(1000, 0.95, draw))
            hits[aggregate] += interval.low <= 0.5 <= interval.high
    assert 0.90 <= hits["mean"] / 200 <= 0.98
    assert 0.90 <= hits["iqm"] / 200 <= 0.99


def test_interval_is_reproducible_and_contains_estimate() -> None:
    x = np.array([0.2, 0.4, 0.5, 0.55, 0.9])
    a, b = aggregate_interval(x, "iqm", FAST), aggregate_interval(x, "iqm", FAST)
    assert (a.low, a.high) == (b.low, b.high)
    assert a.low <= a.value <= a.high
    assert a.n == 5 and a.note == ""


def test_single_seed_has_no_interval() -> None:
    interval = aggregate_interval([0.7], "mean", FAST)
    assert interval.value == 0.7 and interval.n == 1
    assert math.isnan(interval.low) and math.isnan(interval.high)
    assert interval.note == MIN_SEEDS_NOTE


def test_nan_scores_are_dropped() -> None:
    interval = aggregate_interval([0.1, np.nan, 0.3], "mean", FAST)
    assert interval.value == pytest.approx(0.2) and interval.n == 2


def test_stratified_one_stratum_equals_plain_bootstrap() -> None:
    x = np.array([0.1, 0.3, 0.35, 0.6, 0.8])
    assert stratified_interval([x], "mean", FAST) == aggregate_interval(x, "mean", FAST)


def test_stratified_keeps_stratum_sizes() -> None:
    # Two strata at 0 and 1 with no spread inside: every stratified resample keeps 3 zeros and
    # 3 ones, so the pooled mean is exactly 0.5 in every resample and the interval has zero
    # width. A plain bootstrap over the 6 pooled values would vary.
    interval = stratified_interval([np.zeros(3), np.ones(3)], "mean", FAST)
    assert interval.value == 0.5
    assert interval.low == pytest.approx(0.5) and interval.high == pytest.approx(0.5)
    pooled = aggregate_interval(np.r_[np.zeros(3), np.ones(3)], "mean", FAST)
    assert pooled.high - pooled.low > 0.3


@settings(deadline=None)
@given(scores, scores)
def test_poi_equals_mann_whitney_u_over_nm(x: list[float], y: list[float]) -> None:
    u = stats.mannwhitneyu(x, y, alternative="two-sided", method="asymptotic").statistic
    poi = probability_of_improvement(np.array(x), np.array(y))
    assert poi == pytest.approx(u / (len(x) * len(y)), abs=1e-12)


def test_poi_hand_worked_with_tie() -> None:
    # Pairs (x, y): (1,0) win, (1,1) tie, (2,0) win, (2,1) win -> (3 + 0.5) / 4 = 0.875.
    assert probability_of_improvement(np.array([1.0, 2.0]), np.array([0.0, 1.0])) == 0.875


@settings(max_examples=20, deadline=None)
@given(st.integers(1, 5), st.integers(1, 5), st.integers(1, 4), st.integers(0, 10**6))
def test_poi_vectorised_matches_loop(n: int, m: int, batch: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    x, y = (
        rng.integers(0, 3, (batch, n)).astype(float),
        rng.integers(0, 3, (batch, m)).astype(float),
    )
    loop = [
        np.mean([1.0 if a > b else 0.5 if a == b else 0.0 for a in x[k] for b in y[k]])
        for k in range(batch)
    ]
    assert probability_of_improvement(x, y) == pytest.approx(loop)


def test_poi_interval_separated_arms() -> None:
    interval = poi_interval([0.8, 0.9, 0.85], [0.1, 0.2, 0.15], FAST)
    assert interval.value == 1.0 and interval.low == 1.0 and interval.high == 1.0
    assert poi_interval([0.8], [0.1, 0.2], FAST).note == MIN_SEEDS_NOTE


def test_paired_mean_difference() -> None:
    # Differences 0.1, 0.2, 0.3 -> mean 0.2; the interval stays within [0.1, 0.3].
    interval = paired_mean_difference([0.6, 0.7, 0.8], [0.5, 0.5, 0.5], FAST)
    assert interval.value == pytest.approx(0.2)
    assert 0.1 - 1e-12 <= interval.low <= interval.high <= 0.3 + 1e-12
    assert interval.n == 3
