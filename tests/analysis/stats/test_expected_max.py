"""Expected max validation performance (Dodge et al. 2019, 2021), the leader at each tuning
budget, and the hyperparameter sensitivity table, against brute force and hand-worked values."""

from __future__ import annotations

import math
from itertools import combinations, product

import numpy as np
import pandas as pd
import pytest

from analysis.stats import (
    BudgetRanking,
    LeaderChange,
    budget_ranking,
    expected_max,
    expected_max_curve,
    sensitivity_table,
)
from analysis.stats.expected_max import ONE_SEED_NOTE

TOL = {"rel": 1e-12, "abs": 1e-12}
SMALL = [
    [0.5],
    [1.0, 2.0, 3.0],
    [3.0, 1.0, 2.0, 2.0],  # ties
    [-1.5, 0.2, -0.3, 0.2, 4.0],  # negatives and a tie
    [2.0, 2.0, 2.0, 2.0, 2.0, 2.0],  # all tied
    [0.1, -7.0, 3.3, 3.3, 0.0, 1e3, -2.5],  # N = 7, wide range
    list(np.random.default_rng(7).normal(size=6)),
]


def moments(maxes: list[float]) -> tuple[float, float]:
    """Mean and population variance of the enumerated maxima."""
    arr = np.array(maxes)
    return math.fsum(arr) / len(arr), float(np.var(arr))


@pytest.mark.parametrize("scores", SMALL, ids=lambda s: f"N={len(s)}")
def test_unbiased_equals_mean_over_all_subsets(scores: list[float]) -> None:
    curve = expected_max_curve(scores)
    assert curve.estimator == "unbiased" and curve.n_configurations == len(scores)
    assert list(curve.budgets) == list(range(1, len(scores) + 1))
    for n in range(1, len(scores) + 1):
        mean, var = moments([max(c) for c in combinations(scores, n)])
        assert expected_max(scores, n) == pytest.approx(mean, **TOL)
        assert curve.mean[n - 1] == pytest.approx(mean, **TOL)
        assert curve.variance[n - 1] == pytest.approx(var, **TOL)
        assert curve.std[n - 1] == pytest.approx(math.sqrt(var), **TOL)


@pytest.mark.parametrize("scores", SMALL[:5], ids=lambda s: f"N={len(s)}")
def test_empirical_equals_mean_over_all_draws_with_replacement(scores: list[float]) -> None:
    curve = expected_max_curve(scores, estimator="empirical")
    for n in range(1, len(scores) + 1):
        mean, var = moments([max(t) for t in product(scores, repeat=n)])
        assert expected_max(scores, n, estimator="empirical") == pytest.approx(mean, **TOL)
        assert curve.mean[n - 1] == pytest.approx(mean, **TOL)
        assert curve.variance[n - 1] == pytest.approx(var, **TOL)
    # beyond N as well: the empirical estimator is defined for every n
    n = len(scores) + 1
    mean, _ = moments([max(t) for t in product(scores, repeat=n)])
    assert expected_max(scores, n, estimator="empirical") == pytest.approx(mean, **TOL)


def test_hand_worked_one_two_three() -> None:
    # unbiased, n = 2: subsets {1,2}, {1,3}, {2,3} have maxima 2, 3, 3.
    assert expected_max([1, 2, 3], 2) == pytest.approx(8 / 3, **TOL)
    assert expected_max_curve([1, 2, 3]).variance[1] == pytest.approx(22 / 3 - 64 / 9, **TOL)
    # empirical, n = 2: P(max = i) = (i/3)^2 - ((i-1)/3)^2 = 1/9, 3/9, 5/9.
    assert expected_max([1, 2, 3], 2, estimator="empirical") == pytest.approx(22 / 9, **TOL)
    empirical = expected_max_curve([3, 1, 2], estimator="empirical")
    assert empirical.variance[1] == pytest.approx(58 / 9 - (22 / 9) ** 2, **TOL)  # 38/81


def test_one_configuration() -> None:
    for estimator in ("unbiased", "empirical"):
        curve = expected_max_curve([0.7], estimator=estimator)
        assert curve.mean.tolist() == [0.7] and curve.variance.tolist() == [0.0]
    assert expected_max([0.7], 5, estimator="empirical") == 0.7


def test_all_tied_scores_give_the_value_exactly() -> None:
    for estimator in ("unbiased", "empirical"):
        curve = expected_max_curve([0.3] * 9, estimator=estimator)
        assert (curve.mean == 0.3).all() and (curve.variance == 0.0).all()


@pytest.mark.parametrize("estimator", ["unbiased", "empirical"])
def test_curve_ends(estimator: str) -> None:
    scores = np.random.default_rng(3).uniform(size=25)
    curve = expected_max_curve(scores, estimator=estimator)
    assert curve.mean[0] == pytest.approx(scores.mean(), **TOL)  # n = 1: the sample mean
    assert curve.variance[0] == pytest.approx(scores.var(), **TOL)
    assert (np.diff(curve.mean) >= -1e-15).all()  # non-decreasing (up to rounding)
    assert (curve.variance >= 0).all()
    if estimator == "unbiased":
        assert curve.mean[-1] == scores.max() and curve.variance[-1] == 0.0
    else:  # with replacement, N draws may miss the best: below the max, tending to it
        assert curve.mean[-1] < scores.max()
        assert expected_max(scores, 100_000, estimator="empirical") == pytest.approx(scores.max())


def test_curve_is_read_only() -> None:
    curve = expected_max_curve([1.0, 2.0])
    with pytest.raises(ValueError, match="read-only"):
        curve.mean[0] = 5.0


@pytest.mark.parametrize(
    ("scores", "n", "kwargs", "message"),
    [
        ([1.0, 2.0, 3.0], 4, {}, r"n=4 .*N=3"),
        ([1.0, 2.0], 0, {}, "n must be >= 1"),
        ([1.0, 2.0], 0, {"estimator": "empirical"}, "n must be >= 1"),
        ([1.0, 2.0], 1.5, {}, "must be an integer"),
        ([], 1, {}, "empty"),
        ([1.0, math.nan], 1, {}, "NaN/inf"),
        ([1.0, math.inf], 1, {"estimator": "empirical"}, "NaN/inf"),
        ([[1.0, 2.0]], 1, {}, "1-D"),
        ([1.0, 2.0], 1, {"estimator": "max"}, "estimator must be one of"),
    ],
)
def test_rejects_bad_input(scores: list, n: float, kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        expected_max(scores, n, **kwargs)


@pytest.mark.parametrize("scores", [[], [0.1, math.nan]])
def test_curve_rejects_bad_scores(scores: list[float]) -> None:
    with pytest.raises(ValueError, match=r"empty|NaN"):
        expected_max_curve(scores)


def test_large_n_is_finite_and_matches_a_direct_computation() -> None:
    # N = 300: C(300, 150) is about 1e89. Direct: exact integer binomials, one float division
    # each (Python rounds int / int correctly), and the with-replacement weights as written.
    scores = np.random.default_rng(11).normal(size=300)
    ordered = np.sort(scores)
    big = 300
    unbiased = expected_max_curve(scores)
    empirical = expected_max_curve(scores, estimator="empirical")
    for curve in (unbiased, empirical):
        assert np.isfinite(curve.mean).all() and np.isfinite(curve.variance).all()
    for n in (1, 2, 10, 150, 299, 300):
        total = math.comb(big, n)
        w = np.array([math.comb(i - 1, n - 1) / total for i in range(1, big + 1)])
        mean = math.fsum(w * ordered)
        assert unbiased.mean[n - 1] == pytest.approx(mean, **TOL)
        assert unbiased.variance[n - 1] == pytest.approx(
            math.fsum(w * ordered**2) - mean**2, rel=1e-9, abs=1e-12
        )
        i = np.arange(1, big + 1)
        w_emp = (i / big) ** n - ((i - 1) / big) ** n
        assert empirical.mean[n - 1] == pytest.approx(math.fsum(w_emp * ordered), **TOL)
    assert unbiased.mean[-1] == ordered[-1]


def test_leader_change_reported_at_the_exact_budget() -> None:
    # A: always 0.6 (higher mean). B: mean 0.3 but max 1.0. Unbiased, N = 5 for B:
    # n = 2: (3 * 0.5 + 4 * 1.0) / 10 = 0.55 < 0.6; n = 3: (3 * 0.5 + 6 * 1.0) / 10 = 0.75.
    curves = {
        "A": expected_max_curve([0.6] * 6),
        "B": expected_max_curve([0.0, 0.0, 0.0, 0.5, 1.0]),
    }
    assert curves["B"].mean[1] == pytest.approx(0.55) and curves["B"].mean[2] == pytest.approx(0.75)
    ranking = budget_ranking(curves)
    assert isinstance(ranking, BudgetRanking)
    assert ranking.budgets == (1, 2, 3, 4, 5)  # stops at the smaller N
    assert ranking.leaders == (("A",), ("A",), ("B",), ("B",), ("B",))
    assert ranking.changes == (LeaderChange(3, "A", "B"),)
    assert ranking.changes[0] == (3, "A", "B")  # a plain (budget, previous, new) tuple too
    assert ranking.ties == () and ranking.winner_changes
    assert "B from 3" in ranking.note()


def test_ties_are_not_leader_changes() -> None:
    # [1, 3] and [2, 2] have the same mean (n = 1); at n = 2 [1, 3] leads alone.
    ranking = budget_ranking(
        {"x": expected_max_curve([1.0, 3.0]), "y": expected_max_curve([2.0, 2.0])}
    )
    assert ranking.leaders == (("x", "y"), ("x",))
    assert ranking.ties == ((1, ("x", "y")),) and ranking.changes == ()
    assert not ranking.winner_changes and ranking.note() == ""
    # A leads at 1, A and B tie exactly at 2 (0.4 = w_5 * 1.0 = 2/5), B leads from 3: the change
    # is A -> B at 3, the tie at 2 stays a tie.
    curves = {"A": expected_max_curve([0.4] * 5), "B": expected_max_curve([0, 0, 0, 0, 1.0])}
    ranking = budget_ranking(curves)
    assert ranking.leaders == (("A",), ("A", "B"), ("B",), ("B",), ("B",))
    assert ranking.ties == ((2, ("A", "B")),)
    assert ranking.changes == (LeaderChange(3, "A", "B"),)
    # within atol counts as a tie: at n = 1, 0.2 vs 0.4
    assert budget_ranking(curves, atol=0.25).ties[0] == (1, ("A", "B"))


def test_budget_ranking_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="at least one"):
        budget_ranking({})
    mixed = {
        "A": expected_max_curve([1.0, 2.0]),
        "B": expected_max_curve([1.0, 2.0], estimator="empirical"),
    }
    with pytest.raises(ValueError, match="mix estimators"):
        budget_ranking(mixed)


def tuning_frame() -> pd.DataFrame:
    """2 arms x (lr, clip) full grid x 3 seeds; arm b's seed 2 repeats (1e-5, 0.2) once."""
    rows = []
    offsets = {0: 0.0, 1: 0.03, 2: -0.03}
    for seed, (lr, clip) in product(range(3), product([1e-6, 1e-5], [0.1, 0.2])):
        # arm a: 0.5 + 0.1 at lr 1e-5 + 0.02 at clip 0.2 + the seed's offset
        score = 0.5 + 0.1 * (lr == 1e-5) + 0.02 * (clip == 0.2) + offsets[seed]
        rows.append(("a", lr, clip, seed, score))
    b_scores = {0: [0.2, 0.4, 0.6, 0.8], 1: [0.3, 0.5, 0.7, 0.9], 2: [0.1, 0.3, 0.5, 0.7]}
    for seed, scores in b_scores.items():
        for (lr, clip), score in zip(product([1e-6, 1e-5], [0.1, 0.2]), scores, strict=True):
            rows.append(("b", lr, clip, seed, score))
    rows.append(("b", 1e-5, 0.2, 2, 1.0))
    return pd.DataFrame(rows, columns=["arm", "lr", "clip", "seed", "score"])


def test_sensitivity_means_worked_by_hand() -> None:
    table = sensitivity_table(tuning_frame(), param_cols=["lr", "clip"], n_resamples=2000)
    assert list(table.columns) == [
        "arm",
        "param",
        "value",
        "mean",
        "low",
        "high",
        "n_seeds",
        "note",
    ]
    assert len(table) == 8 and (table["n_seeds"] == 3).all() and (table["note"] == "").all()
    got = {(r.arm, r.param, r.value): r.mean for r in table.itertuples()}
    expected = {
        ("a", "lr", 1e-6): 0.51,  # 0.5 + half of clip's 0.02, seed offsets average to 0
        ("a", "lr", 1e-5): 0.61,
        ("a", "clip", 0.1): 0.55,
        ("a", "clip", 0.2): 0.57,
        # b, lr 1e-6: seed means 0.3, 0.4, 0.2
        ("b", "lr", 1e-6): 0.3,
        # b, lr 1e-5: seed means 0.7, 0.8, (0.5 + 0.7 + 1.0) / 3: each seed counts once (the
        # pooled mean of the 7 trials, 5.2 / 7 = 0.7429, would overweight seed 2)
        ("b", "lr", 1e-5): (0.7 + 0.8 + 2.2 / 3) / 3,
        ("b", "clip", 0.1): 0.4,  # 0.4, 0.5, 0.3
        ("b", "clip", 0.2): (0.6 + 0.7 + 2.0 / 3) / 3,  # 0.6, 0.7, (0.3 + 0.7 + 1.0) / 3
    }
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, **TOL), key


def test_sensitivity_interval_is_a_seeded_percentile_bootstrap_over_seeds() -> None:
    frame = tuning_frame()
    table = sensitivity_table(frame, param_cols=["lr"], seed=5, confidence=0.9, n_resamples=500)
    row = table[(table["arm"] == "b") & (table["value"] == 1e-6)].iloc[0]
    # Independently: per-seed means, one default_rng(5), integers(0, 3, (500, 3)), 5th/95th pct.
    seed_means = np.array([0.3, 0.4, 0.2])
    draws = seed_means[np.random.default_rng(5).integers(0, 3, size=(500, 3))].mean(axis=1)
    assert row["low"] == pytest.approx(np.percentile(draws, 5), **TOL)
    assert row["high"] == pytest.approx(np.percentile(draws, 95), **TOL)
    assert 0.2 - 1e-12 <= row["low"] <= row["mean"] <= row["high"] <= 0.4 + 1e-12
    again = sensitivity_table(frame, param_cols=["lr"], seed=5, confidence=0.9, n_resamples=500)
    pd.testing.assert_frame_equal(table, again)
    other = sensitivity_table(frame, param_cols=["lr"], seed=6, confidence=0.9, n_resamples=500)
    # 3 seeds give only 10 distinct resample means, so many bounds coincide; seed 6 moves some
    assert not other[["low", "high"]].equals(table[["low", "high"]])


def test_sensitivity_single_seed_collapses_the_interval() -> None:
    frame = tuning_frame()
    table = sensitivity_table(frame[frame["seed"] == 0], param_cols=["lr", "clip"])
    assert (table["n_seeds"] == 1).all() and (table["note"] == ONE_SEED_NOTE).all()
    assert (table["low"] == table["mean"]).all() and (table["high"] == table["mean"]).all()
    b_lr = table[(table["arm"] == "b") & (table["param"] == "lr")]
    assert b_lr["mean"].tolist() == pytest.approx([0.3, 0.7])


def test_sensitivity_skips_a_hyperparameter_an_arm_lacks() -> None:
    frame = tuning_frame()
    frame.loc[frame["arm"] == "b", "clip"] = np.nan  # arm b has no clip
    table = sensitivity_table(frame, param_cols=["lr", "clip"], n_resamples=200)
    assert set(table.loc[table["arm"] == "b", "param"]) == {"lr"}
    assert len(table) == 6


@pytest.mark.parametrize(
    ("change", "kwargs", "message"),
    [
        ("drop_score", {}, r"lacks column\(s\) \['score'\]"),
        ("nan_score", {}, "NaN or inf"),
        ("empty", {}, "no tuning trials"),
        ("none", {"param_cols": []}, "param_cols is empty"),
    ],
)
def test_sensitivity_rejects_bad_input(change: str, kwargs: dict, message: str) -> None:
    frame = tuning_frame()
    if change == "drop_score":
        frame = frame.drop(columns="score")
    elif change == "nan_score":
        frame.loc[0, "score"] = math.nan
    elif change == "empty":
        frame = frame.iloc[:0]
    with pytest.raises(ValueError, match=message):
        sensitivity_table(frame, **{"param_cols": ["lr"], **kwargs})
