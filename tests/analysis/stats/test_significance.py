"""Tests, Holm correction and effect sizes against hand-worked values and reference libraries."""

from __future__ import annotations

import gc
import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats
from statsmodels.stats.multitest import multipletests

from analysis.stats import BootstrapSpec, paired_mean_difference, probability_of_improvement
from analysis.stats.significance import (
    MW_EXACT_MAX_WORK,
    cliffs_delta,
    exact_mann_whitney,
    fisher,
    hedges_g,
    holm,
    mann_whitney,
    min_p_fisher,
    min_p_mann_whitney,
    min_p_wilcoxon,
    paired_t,
    rank_sum_counts,
    welch,
    wilcoxon_paired,
)


def test_holm_hand_worked() -> None:
    # Sorted p: 0.01, 0.03, 0.04 times (3, 2, 1) = 0.03, 0.06, 0.04; step-down keeps the
    # running max, so 0.04 -> 0.06. Back in input order (0.01, 0.04, 0.03): 0.03, 0.06, 0.06.
    assert holm(np.array([0.01, 0.04, 0.03])) == pytest.approx([0.03, 0.06, 0.06])


@settings(max_examples=25, deadline=None)
@given(st.lists(st.floats(0, 1), min_size=1, max_size=20))
def test_holm_matches_statsmodels(p: list[float]) -> None:
    gc.freeze()  # multipletests' Holm branch runs a full gc.collect(); keep the test fast
    try:
        expected = multipletests(p, method="holm")[1]
    finally:
        gc.unfreeze()
    assert holm(np.array(p)) == pytest.approx(expected, abs=1e-12)


def test_holm_leaves_nan_outside_the_family() -> None:
    out = holm(np.array([0.01, np.nan, 0.04]))
    assert math.isnan(out[1])
    assert out[[0, 2]] == pytest.approx(multipletests([0.01, 0.04], method="holm")[1])


@pytest.mark.parametrize("n", range(1, 9))
def test_min_p_wilcoxon_equals_scipy_exact_extreme(n: int) -> None:
    # All differences positive is the most extreme outcome; scipy's exact p is 2 / 2^n.
    extreme = stats.wilcoxon(np.arange(1.0, n + 1), method="exact").pvalue
    assert min_p_wilcoxon(n) == pytest.approx(min(1.0, extreme))
    assert min_p_wilcoxon(n) == pytest.approx(min(1.0, 2 / 2**n))


@pytest.mark.parametrize(("n", "m"), [(1, 1), (2, 3), (3, 3), (4, 4), (5, 3)])
def test_min_p_mann_whitney_equals_scipy_exact_extreme(n: int, m: int) -> None:
    extreme = stats.mannwhitneyu(range(n), range(n, n + m), method="exact").pvalue
    assert min_p_mann_whitney(n, m) == pytest.approx(extreme)


def test_mann_whitney_three_vs_three_cannot_reach_significance() -> None:
    # C(6, 3) = 20 rank assignments; complete separation: p = 2 / 20 = 0.1 > 0.05.
    result = mann_whitney(np.array([1.0, 2, 3]), np.array([4.0, 5, 6]))
    assert result.p_value == pytest.approx(0.1)
    assert result.min_attainable_p == pytest.approx(0.1)
    assert "cannot reach significance" in result.note


def test_mann_whitney_all_ties_is_exact_hand_worked() -> None:
    # Pooled 0.5 x 3, 0.6 x 3: x takes k of the three 0.6s in C(3, k) C(3, 3 - k) = 1, 9, 9, 1
    # of the C(6, 3) = 20 splits, U = 3k. Observed k = 0 (U = 0): P(U <= 0) = 1/20, two-sided
    # p = 2/20 = 0.1 = the 3 vs 3 floor (scipy's default tie-corrected normal gives 0.047).
    result = mann_whitney(np.array([0.5] * 3), np.array([0.6] * 3))
    assert result.p_value == pytest.approx(0.1, abs=1e-12)
    assert result.min_attainable_p == pytest.approx(0.1, abs=1e-12)
    assert "with ties" in result.note and "cannot reach significance" in result.note


def test_mann_whitney_partial_ties_hand_worked() -> None:
    """x = (0.4, 0.5, 0.5), y = (0.5, 0.6, 0.7): midranks 0.4 -> 1, 0.5 -> 3, 0.6 -> 5, 0.7 -> 6.

    The 20 splits, by x's members (count, rank sum R, U = R - 6):
      0.4 + two 0.5s (3, 7, 1); 0.4 + 0.5 + 0.6 (3, 9, 3); 0.4 + 0.5 + 0.7 (3, 10, 4);
      0.4 + 0.6 + 0.7 (1, 12, 6); three 0.5s (1, 9, 3); two 0.5s + 0.6 (3, 11, 5);
      two 0.5s + 0.7 (3, 12, 6); 0.5 + 0.6 + 0.7 (3, 14, 8).
    Observed U = 1 (0.4 loses to all of y; each 0.5 ties y's 0.5 once: 2 x 0.5): P(U <= 1) = 3/20,
    p = 2 x 3/20 = 0.3. The extremes U = 1 and U = 8 both have 3/20, so the floor is also 0.3.
    """
    result = mann_whitney(np.array([0.4, 0.5, 0.5]), np.array([0.5, 0.6, 0.7]))
    assert result.p_value == pytest.approx(0.3, abs=1e-12)
    assert result.min_attainable_p == pytest.approx(0.3, abs=1e-12)
    counts = rank_sum_counts(np.array([2, 6, 6, 6, 10, 12]), 3)  # doubled midranks
    assert {int(s): int(c) for s, c in enumerate(counts) if c} == {
        14: 3,
        18: 4,
        20: 3,
        22: 3,
        24: 4,
        28: 3,  # doubled R = 7, 9, 10, 11, 12, 14
    }


def _brute_force_p(x: list[float], y: list[float]) -> float:
    """Two-sided permutation p over every split of the pooled scores, U counted pair by pair."""
    pooled, n = np.array(x + y, dtype=float), len(x)

    def u_stat(idx: tuple[int, ...]) -> float:
        inside = np.zeros(len(pooled), dtype=bool)
        inside[list(idx)] = True
        a, b = pooled[inside], pooled[~inside]
        return float((a[:, None] > b).sum() + 0.5 * (a[:, None] == b).sum())

    null = np.array([u_stat(idx) for idx in itertools.combinations(range(len(pooled)), n)])
    u_obs = u_stat(tuple(range(n)))
    return min(1.0, 2 * min(np.mean(null <= u_obs + 1e-9), np.mean(null >= u_obs - 1e-9)))


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.integers(0, 4), min_size=1, max_size=6),
    st.lists(st.integers(0, 4), min_size=1, max_size=6),
)
def test_exact_mann_whitney_matches_enumeration_of_splits(x: list[int], y: list[int]) -> None:
    # Pass rates k/4 tie often; the recurrence must equal a loop over all C(n + m, n) splits.
    xs, ys = [v / 4 for v in x], [v / 4 for v in y]
    p, _ = exact_mann_whitney(np.array(xs), np.array(ys))
    assert p == pytest.approx(_brute_force_p(xs, ys), abs=1e-12)


def test_mann_whitney_matches_scipy_permutation_and_exact() -> None:
    rng = np.random.default_rng(3)
    x, y = rng.integers(0, 5, 7) / 4, rng.integers(1, 6, 6) / 4  # tied pass rates
    exhaustive = stats.PermutationMethod(n_resamples=np.inf)
    reference = stats.mannwhitneyu(x, y, method=exhaustive).pvalue
    assert mann_whitney(x, y).p_value == pytest.approx(reference, abs=1e-12)
    x, y = rng.normal(size=6), rng.normal(size=8)  # no ties: scipy's exact distribution
    assert mann_whitney(x, y).p_value == pytest.approx(
        stats.mannwhitneyu(x, y, method="exact").pvalue, abs=1e-12
    )


def test_mann_whitney_identical_scores_and_large_samples() -> None:
    same = mann_whitney(np.full(4, 0.5), np.full(3, 0.5))
    assert same.p_value == 1.0 and same.min_attainable_p == 1.0  # every split is the same
    x, y = np.arange(60.0), np.arange(60.0) + 30  # past the work bound: normal approximation
    assert MW_EXACT_MAX_WORK < 61 * 120 * 121 * 120
    expected = stats.mannwhitneyu(x, y, method="asymptotic").pvalue
    assert mann_whitney(x, y).p_value == pytest.approx(expected, rel=1e-12)


def test_wilcoxon_ties_are_exact() -> None:
    # d = (0.1, 0.1, 0.2, -0.1): |d| midranks 2, 2, 2, 4; T- = 2. Of the 2^4 = 16 sign
    # patterns, T- <= 2 for T- in {0, 2, 2, 2} (no negatives or one of the three 0.1s): 4/16;
    # two-sided p = 2 x 4/16 = 0.5.
    result = wilcoxon_paired(np.array([0.6, 0.6, 0.7, 0.4]), np.full(4, 0.5))
    assert result.p_value == pytest.approx(0.5, abs=1e-12)


def test_wilcoxon_five_pairs_note() -> None:
    # n = 5: p_min = 2 / 32 = 0.0625 > 0.05, flagged; n = 6: 2 / 64 = 0.03125, not flagged.
    five = wilcoxon_paired(np.arange(5.0) + 1, np.zeros(5))
    assert five.p_value == pytest.approx(0.0625) and "0.0625" in five.note
    six = wilcoxon_paired(np.arange(6.0) + 1, np.zeros(6))
    assert six.p_value == pytest.approx(0.03125) and six.note == ""


def test_wilcoxon_all_zero_differences() -> None:
    result = wilcoxon_paired(np.ones(4), np.ones(4))
    assert result.p_value == 1.0 and "zero" in result.note


def test_paired_design_detects_what_unpaired_misses() -> None:
    """A small, consistent per-seed gain hidden under large between-seed variance.

    8 seeds with seed offsets of SD 0.1; arm X = arm Y + 0.02 (+ tiny noise). Every difference
    is positive, so Wilcoxon gives its floor 2 / 2^8 = 0.0078; Welch compares means 0.02 apart
    with SD 0.1 per arm (t about 0.4) and cannot tell them apart.
    """
    rng = np.random.default_rng(7)
    y = 0.5 + rng.normal(0, 0.1, 8)
    x = y + 0.02 + rng.normal(0, 0.002, 8)
    assert wilcoxon_paired(x, y).p_value == pytest.approx(2 / 2**8)
    assert welch(x, y).p_value > 0.5
    diff = paired_mean_difference(x, y, BootstrapSpec(2000, 0.95, 0))
    assert diff.low > 0


def test_welch_matches_scipy_and_needs_two_seeds() -> None:
    x, y = np.array([0.1, 0.4, 0.5]), np.array([0.6, 0.9, 0.7, 0.8])
    assert welch(x, y).p_value == pytest.approx(stats.ttest_ind(x, y, equal_var=False).pvalue)
    assert math.isnan(welch(x[:1], y).p_value)


def test_fisher_hand_worked() -> None:
    # 3/3 vs 0/3 diverged: the table [[3, 0], [0, 3]] has hypergeometric probability
    # 1 / C(6, 3) = 0.05 per tail, two-sided p = 0.1 = the floor at 3 vs 3.
    result = fisher(3, 3, 0, 3)
    assert result.p_value == pytest.approx(0.1)
    assert min_p_fisher(3, 3) == pytest.approx(0.1)
    assert "cannot reach significance" in result.note
    assert fisher(0, 5, 0, 5).p_value == 1.0


def test_hedges_g_hand_worked() -> None:
    # x = (1, 2, 3), y = (3, 4, 5): means differ by -2; both variances 1, pooled SD 1;
    # d = -2; J = 1 - 3 / (4 * 6 - 9) = 0.8; g = -1.6.
    assert hedges_g(np.array([1.0, 2, 3]), np.array([3.0, 4, 5])) == pytest.approx(-1.6)


@settings(deadline=None)
@given(
    st.lists(st.integers(0, 4), min_size=1, max_size=8),
    st.lists(st.integers(0, 4), min_size=1, max_size=8),
)
def test_cliffs_delta_is_two_poi_minus_one(x: list[int], y: list[int]) -> None:
    xs, ys = np.array(x, float), np.array(y, float)
    assert cliffs_delta(xs, ys) == pytest.approx(2 * probability_of_improvement(xs, ys) - 1)


def test_paired_t_hand_worked() -> None:
    # Differences (0.1, 0.2, 0.3): mean 0.2, SD 0.1, t = 0.2 / (0.1 / sqrt 3) = 3.464 on 2 df,
    # two-sided p = 2 * (1 - T_2(3.464)) = 0.0742.
    result = paired_t(np.array([0.6, 0.7, 0.8]), np.array([0.5, 0.5, 0.5]))
    assert result.p_value == pytest.approx(2 * stats.t.sf(2 * math.sqrt(3), 2), rel=1e-12)
    assert result.p_value == pytest.approx(0.0742, abs=1e-4)
    assert (result.n, result.min_attainable_p, result.note) == (3, 0.0, "")


def test_paired_t_needs_two_pairs_and_varying_differences() -> None:
    one = paired_t(np.array([0.6, np.nan]), np.array([0.5, 0.5]))
    assert math.isnan(one.p_value) and one.n == 1 and "at least 2 matched seeds" in one.note
    same = paired_t(np.array([0.6, 0.7]), np.array([0.5, 0.6]))  # both differences 0.1
    assert math.isnan(same.p_value) and "every matched difference is equal" in same.note
