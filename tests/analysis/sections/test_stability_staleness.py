"""Divergence rates (Wilson, Fisher), Pareto frontier and time-to-threshold rows."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from analysis.sections.stability import collapse_rows, divergence_rows, fisher_rows, threshold_rows
from analysis.sections.staleness import detectably_better, frontier_table, supported_front
from analysis.stats import wilson

Z = 1.959963984540054  # standard normal 97.5% quantile


def test_wilson_hand_computed() -> None:
    # k = 1, n = 5: centre (k + z^2/2) / (n + z^2) = 2.92073 / 8.84146 = 0.330344;
    # half-width z sqrt(k (n - k) / n + z^2 / 4) / (n + z^2) = 0.294121.
    centre = (1 + Z**2 / 2) / (5 + Z**2)
    half = Z * math.sqrt(1 * 4 / 5 + Z**2 / 4) / (5 + Z**2)
    low, high = wilson(1, 5, 0.95)
    assert (low, high) == pytest.approx((centre - half, centre + half), rel=1e-9)
    assert (low, high) == pytest.approx((0.036224, 0.624465), abs=1e-6)
    # k = 0: the interval is [0, z^2 / (n + z^2)] = [0, 0.434480], not the Wald [0, 0].
    assert wilson(0, 5, 0.95) == pytest.approx((0.0, Z**2 / (5 + Z**2)), abs=1e-12)


def _trials(diverged: dict[str, list[bool]]) -> pd.DataFrame:
    rows = [
        {"arm": arm, "lag": 0, "seed": s, "diverged": d}
        for arm, flags in diverged.items()
        for s, d in enumerate(flags)
    ]
    return pd.DataFrame(rows)


def test_divergence_and_fisher_rows() -> None:
    trials = _trials({"a": [True, True, True], "b": [False, False, False]})
    rates = {(r["arm"], r["lag"]): r for r in divergence_rows(trials, 0.95)}
    assert rates[("a", None)]["value"] == 1.0 and rates[("a", None)]["note"] == "3/3"
    assert rates[("b", 0)]["value"] == 0.0 and rates[("b", 0)]["n"] == 3
    tests = {r["statistic"]: r for r in fisher_rows(trials, 0.05)}
    # Fully separated 3 vs 3: p = 2 / C(6, 3) = 0.1, the floor, so it is flagged.
    assert tests["fisher_p"]["value"] == pytest.approx(0.1)
    assert "cannot reach significance" in tests["fisher_p"]["note"]
    assert tests["fisher_p_holm"]["value"] == pytest.approx(0.1)  # a family of one


def test_supported_front_treats_undetected_score_differences_as_ties() -> None:
    speed, scored = np.array([1.0, 2.0, 3.0]), np.ones(3, dtype=bool)
    none = np.zeros((3, 3), dtype=bool)
    # No score difference detected: the slower conditions are dominated by the fastest.
    assert supported_front(speed, scored, none).tolist() == [False, False, True]
    # Each slower condition detectably better than every faster one: a real trade-off.
    better = np.array([[False, True, True], [False, False, True], [False, False, False]])
    assert supported_front(speed, scored, better).tolist() == [True, True, True]
    # Only the slowest is detectably better: the middle one is a tie with the fastest.
    better = np.array([[False, True, True], [False, False, False], [False, False, False]])
    assert supported_front(speed, scored, better).tolist() == [True, False, True]
    # Equally fast and tied: both stay. No throughput or no score: never on the front.
    assert supported_front(np.array([2.0, 2.0]), np.ones(2, bool), none[:2, :2]).all()
    gaps = supported_front(np.array([np.nan, 1.0, 5.0]), np.array([True, True, False]), none)
    assert gaps.tolist() == [False, True, False]


def test_detectably_better_needs_a_holm_significant_paired_difference() -> None:
    seeds = range(6)
    noise = np.array([0.01, -0.02, 0.015, -0.005, 0.0, 0.01])
    high = pd.Series(0.8 + noise, index=seeds)
    low = pd.Series(0.7 + np.roll(noise, 2), index=seeds)  # about 0.1 lower on every seed
    same = pd.Series(0.8 + noise[::-1], index=seeds)  # the same level, other noise
    better = detectably_better([high, low, same], alpha=0.05)
    assert better.tolist() == [
        [False, True, False],
        [False, False, False],
        [False, True, False],
    ]


def test_frontier_table_within_arm_and_overall() -> None:
    seeds = [0, 1, 2, 3, 4]
    jitter = [0.01, -0.01, 0.02, 0.0, -0.02]
    rows = []
    for arm, lag, level, speed in [
        ("a", 0, 0.80, 1.0),
        ("a", 4, 0.70, 3.0),  # a pays 0.1 for its speed: a trade-off
        ("b", 0, 0.50, 1.0),
        ("b", 4, 0.50, 3.0),  # b's score does not move with lag: lag 4 is simply better
    ]:
        for seed, j in zip(seeds, np.roll(jitter, len(arm) + lag), strict=True):
            shift = j if arm == "a" else -j / 2
            rows.append((arm, lag, seed, speed, level + shift))
    done = pd.DataFrame(rows, columns=["arm", "lag", "seed", "steps_per_s", "final_score"])
    table = frontier_table(done, done, alpha=0.05).set_index(["arm", "lag"])
    assert table["pareto_within_arm"].tolist() == [True, True, False, True]
    # Over all arms, a's lag 4 (0.70 at 3 steps/s) is detectably above b's (0.50, as fast).
    assert table["pareto_overall"].tolist() == [True, True, False, False]


def test_threshold_rows_not_reached() -> None:
    done = pd.DataFrame(
        {
            "arm": ["a"] * 4,
            "lag": [0] * 4,
            "time_to_threshold": [40.0, 60.0, 60.0, 60.0],
            "reached_threshold": [1.0, 0.0, 0.0, 0.0],
        }
    )
    median, reached = threshold_rows(done, 0.5, 0.95)
    assert math.isnan(median["value"]) and "not reached" in median["note"]
    assert reached["value"] == 0.25 and reached["note"] == "1/4 reached"


def test_collapse_rows_count_judged_trials_per_arm_and_lag() -> None:
    trials = pd.DataFrame(
        {
            "arm": ["a"] * 4 + ["b"] * 4,
            "lag": [0, 0, 2, 2] * 2,
            "diverged": [False] * 8,
            # b's last trial has no evals (NaN): not judged, so b is 0 of 3.
            "collapsed": [1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, np.nan],
        }
    )
    rows = collapse_rows(trials, 0.95, 0.05)
    rates = {(r["arm"], r["lag"]): r for r in rows if r["section"] == "collapse"}
    assert rates[("a", None)]["note"] == "3/4" and rates[("a", None)]["value"] == 0.75
    assert rates[("a", 2)]["note"] == "1/2"
    assert rates[("b", None)]["note"] == "0/3" and rates[("b", None)]["n"] == 3
    assert (rates[("a", 0)]["ci_low"], rates[("a", 0)]["ci_high"]) == pytest.approx(
        wilson(2, 2, 0.95)
    )
    (test,) = [r for r in rows if r["statistic"] == "fisher_p"]
    # 3/4 vs 0/3: p = C(3,3) C(4,0) / C(7,3) + ... two-sided: the tables as or more extreme.
    assert test["note"].startswith("3/4 vs 0/3") and test["comparison"] == "a vs b"
    assert test["value"] == pytest.approx(0.142857, abs=1e-6)
    # Without the column (an experiment scored before collapse existed): no rows.
    assert collapse_rows(trials.drop(columns="collapsed"), 0.95, 0.05) == []
