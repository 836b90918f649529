"""Aggregates across eval sets (analysis.stats on a runs x eval-sets matrix): hand-worked values,
and the stratified bootstrap against a plain resampling loop on a fixed matrix with the same
random draws."""

from __future__ import annotations

import math

import numpy as np
import pytest

from analysis.stats import (
    MIN_SEEDS_NOTE,
    BootstrapSpec,
    columns,
    performance_profile,
    profile_values,
    stratified_aggregate,
)
from analysis.stats import iqm as agg_iqm
from analysis.stats import mean as agg_mean
from analysis.stats import median as agg_median
from analysis.stats import optimality_gap as agg_optimality_gap
from analysis.stats import poi_interval as poi_interval_tasks
from analysis.stats import probability_of_improvement as poi_across_tasks

# 4 seeds (rows) x 3 eval sets (columns).
MATRIX = np.array(
    [
        [0.2, 0.0, 0.9],
        [0.4, 0.2, 0.9],
        [0.6, 0.3, 1.0],
        [0.8, 1.0, 1.0],
    ]
)
TASKS = columns(MATRIX)


def test_aggregates_by_hand() -> None:
    # pooled, sorted: 0.0 .2 .2 .3 .4 .6 | .8 .9 .9 1 1 1 ; N = 12, 3 cut from each end:
    # IQM = (0.3 + 0.4 + 0.6 + 0.8 + 0.9 + 0.9) / 6 = 3.9 / 6 = 0.65
    assert agg_iqm(TASKS) == pytest.approx(0.65, abs=1e-12)
    # per-set means: 2.0/4 = 0.5, 1.5/4 = 0.375, 3.8/4 = 0.95
    assert agg_mean(TASKS) == pytest.approx((0.5 + 0.375 + 0.95) / 3, abs=1e-12)  # 0.608333
    assert agg_median(TASKS) == pytest.approx(0.5, abs=1e-12)
    # optimality gap: 1 - mean(min(x, 1)) = 1 - 7.3 / 12 = 0.391667
    assert agg_optimality_gap(TASKS) == pytest.approx(1 - 7.3 / 12, abs=1e-12)


def test_optimality_gap_ignores_overshoot() -> None:
    # 1.2 counts as 1: gap = 1 - (1 + 0.5) / 2 = 0.25 (the mean would be 0.85, gap 0.15)
    assert agg_optimality_gap([np.array([1.2, 0.5])]) == pytest.approx(0.25, abs=1e-12)


def test_performance_profile_by_hand() -> None:
    taus = np.array([0.0, 0.5, 1.0])
    # tau 0: set A 4/4, B 3/4 (0.0 is not > 0), C 4/4 -> (1 + 0.75 + 1) / 3
    # tau 0.5: A {0.6, 0.8} 2/4, B {1.0} 1/4, C 4/4 -> (0.5 + 0.25 + 1) / 3
    # tau 1: nothing is > 1 -> 0
    expected = [(1 + 0.75 + 1) / 3, (0.5 + 0.25 + 1) / 3, 0.0]
    np.testing.assert_allclose(profile_values(TASKS, taus), expected, rtol=0, atol=1e-12)
    # each set weighs the same even with unequal seeds: A = [0.9] (1/1), B = [0.1, 0.9] (1/2)
    uneven = profile_values([np.array([0.9]), np.array([0.1, 0.9])], np.array([0.5]))
    np.testing.assert_allclose(uneven, [(1.0 + 0.5) / 2], atol=1e-12)


def test_poi_across_tasks_by_hand() -> None:
    x = [np.array([0.2, 0.4]), np.array([0.5, 0.5])]
    y = [np.array([0.3]), np.array([0.5, 0.1])]
    # set 1: (0.2 > 0.3) = 0, (0.4 > 0.3) = 1 -> 1/2
    # set 2: 0.5 vs 0.5 tie = 0.5, 0.5 vs 0.1 = 1, twice -> (0.5 + 1 + 0.5 + 1) / 4 = 0.75
    assert float(poi_across_tasks(x, y)) == pytest.approx((0.5 + 0.75) / 2, abs=1e-12)
    one_seed = poi_interval_tasks(x, y, BootstrapSpec(200, 0.95, 0))
    assert one_seed.value == pytest.approx(0.625) and math.isnan(one_seed.low)
    assert one_seed.note == MIN_SEEDS_NOTE


def _iqm_by_hand(values: list[float]) -> float:
    ordered = sorted(values)
    cut = len(ordered) // 4  # trim_mean(0.25) cuts int(0.25 N) from each end
    middle = ordered[cut : len(ordered) - cut]
    return sum(middle) / len(middle)


def _percentile(samples: list[float], confidence: float) -> tuple[float, float]:
    tail = (1 - confidence) / 2 * 100
    return float(np.percentile(samples, tail)), float(np.percentile(samples, 100 - tail))


@pytest.mark.parametrize("name", ["iqm", "mean", "median", "optimality_gap"])
def test_stratified_bootstrap_matches_a_plain_loop(name: str) -> None:
    spec = BootstrapSpec(n_resamples=300, confidence=0.9, seed=7)
    got = stratified_aggregate(TASKS, name, spec)
    # The same draws: one (resamples, seeds) index block per eval set, sets in order.
    rng = np.random.default_rng(7)
    blocks = [rng.integers(0, len(t), size=(300, len(t))) for t in TASKS]
    stats = []
    for b in range(300):
        resampled = [
            [float(t[i]) for i in block[b]] for t, block in zip(TASKS, blocks, strict=True)
        ]
        means = [sum(r) / len(r) for r in resampled]
        pooled = [v for r in resampled for v in r]
        stats.append(
            {
                "iqm": _iqm_by_hand(pooled),
                "mean": sum(means) / len(means),
                "median": sorted(means)[1],  # 3 sets: the middle one
                "optimality_gap": 1 - sum(min(v, 1.0) for v in pooled) / len(pooled),
            }[name]
        )
    low, high = _percentile(stats, 0.9)
    assert got.low == pytest.approx(low, abs=1e-12) and got.high == pytest.approx(high, abs=1e-12)
    assert got.n == 4 and got.low <= got.value <= got.high


def test_stratification_keeps_each_set_apart() -> None:
    # Two sets with disjoint ranges: a resample never moves a score into the other set, so every
    # resampled per-set mean stays within its set's range and the mean's interval is bounded by
    # (min A + min B) / 2 and (max A + max B) / 2 = (0 + 10) / 2 .. (1 + 11) / 2.
    tasks = [np.array([0.0, 1.0, 0.5]), np.array([10.0, 11.0, 10.5])]
    got = stratified_aggregate(tasks, "mean", BootstrapSpec(500, 0.95, 1))
    assert 5.0 <= got.low <= got.value <= got.high <= 6.0


def test_profile_band_and_poi_interval_match_a_loop() -> None:
    spec = BootstrapSpec(n_resamples=200, confidence=0.95, seed=3)
    taus = np.array([0.25, 0.5, 0.75])
    band = performance_profile(TASKS, taus, spec)
    rng = np.random.default_rng(3)
    blocks = [rng.integers(0, len(t), size=(200, len(t))) for t in TASKS]
    per_tau = [[] for _ in taus]
    for b in range(200):
        for i, tau in enumerate(taus):
            fractions = [np.mean(t[block[b]] > tau) for t, block in zip(TASKS, blocks, strict=True)]
            per_tau[i].append(sum(fractions) / len(fractions))
    for interval, samples in zip(band, per_tau, strict=True):
        low, high = _percentile(samples, 0.95)
        assert interval.low == pytest.approx(low, abs=1e-12)
        assert interval.high == pytest.approx(high, abs=1e-12)

    x = [MATRIX[:, 0], MATRIX[:, 1]]
    y = [MATRIX[:, 1], MATRIX[:3, 2]]
    got = poi_interval_tasks(x, y, spec)
    rng = np.random.default_rng(3)
    bx = [rng.integers(0, len(t), size=(200, len(t))) for t in x]  # every set of X first,
    by = [rng.integers(0, len(t), size=(200, len(t))) for t in y]  # then every set of Y
    samples = []
    for b in range(200):
        per_set = []
        for xs, ys, ix, iy in zip(x, y, bx, by, strict=True):
            wins = [1.0 if u > v else 0.5 if u == v else 0.0 for u in xs[ix[b]] for v in ys[iy[b]]]
            per_set.append(sum(wins) / len(wins))
        samples.append(sum(per_set) / len(per_set))
    low, high = _percentile(samples, 0.95)
    assert got.low == pytest.approx(low, abs=1e-12) and got.high == pytest.approx(high, abs=1e-12)
    assert got.n == 4 + 4


def test_missing_scores_and_single_seed() -> None:
    empty = stratified_aggregate([np.array([]), np.array([np.nan])], "iqm", BootstrapSpec(200))
    assert math.isnan(empty.value) and empty.note == "no scores"
    single = stratified_aggregate(
        [np.array([0.5]), np.array([0.7, 0.9])], "mean", BootstrapSpec(200)
    )
    # (0.5 + 0.8) / 2 = 0.65; one set has a single seed, so no interval
    assert single.value == pytest.approx(0.65) and math.isnan(single.low)
    assert single.note == MIN_SEEDS_NOTE and single.n == 2
