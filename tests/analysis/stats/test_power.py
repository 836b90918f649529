"""Power analysis against statsmodels' solver where that converges, and edge cases."""

from __future__ import annotations

import math

import numpy as np
import pytest
from statsmodels.stats.power import TTestIndPower, TTestPower

from analysis.stats.power import (
    cohens_d,
    min_detectable_difference,
    min_detectable_effect,
    paired_effect,
    paired_sd,
    pooled_sd,
    power_analysis,
    power_at,
    seeds_needed,
)


@pytest.mark.parametrize("effect", [0.3, 0.5, 0.8, 1.2])
@pytest.mark.parametrize("paired", [True, False])
def test_seeds_needed_is_ceil_of_statsmodels(effect: float, paired: bool) -> None:
    # E.g. paired d_z = 0.5: statsmodels solves n = 33.37, so 34 pairs.
    solver = TTestPower() if paired else TTestIndPower()
    exact = solver.solve_power(effect_size=effect, alpha=0.05, power=0.8)
    assert seeds_needed(effect, paired, 0.05, 0.8) == math.ceil(exact)
    assert seeds_needed(-effect, paired, 0.05, 0.8) == math.ceil(exact)


@pytest.mark.parametrize("n", [2, 3, 5, 10])
@pytest.mark.parametrize("paired", [True, False])
def test_min_detectable_effect_matches_statsmodels(n: int, paired: bool) -> None:
    if paired:
        expected = TTestPower().solve_power(effect_size=None, nobs=n, alpha=0.05, power=0.8)
    else:
        expected = TTestIndPower().solve_power(effect_size=None, nobs1=n, alpha=0.05, power=0.8)
    assert min_detectable_effect(n, paired, 0.05, 0.8) == pytest.approx(expected, abs=2e-4)


def test_power_fallback_where_scipy_noncentral_t_fails() -> None:
    # statsmodels returns NaN for d_z = 6.47 at n = 2 (scipy's nct tail); the integral gives
    # a finite power, and 3 pairs are the first to exceed 0.8 (power 0.998).
    assert 0.0 < power_at(6.47, 2, 0.05, True) < 0.8
    assert seeds_needed(6.47, True, 0.05, 0.8) == 3


def test_huge_effect_needs_two_seeds_and_no_effect_is_nan() -> None:
    assert seeds_needed(1e9, True, 0.05, 0.8) == 2
    assert math.isnan(seeds_needed(0.0, True, 0.05, 0.8))
    assert math.isnan(seeds_needed(float("nan"), False, 0.05, 0.8))


def test_power_analysis_paired() -> None:
    # Differences (0.1, 0.2, 0.3): mean 0.2, SD 0.1 -> d_z = 2.
    x, y = np.array([0.6, 0.7, 0.8]), np.array([0.5, 0.5, 0.5])
    assert paired_effect(x, y) == pytest.approx(2.0)
    result = power_analysis(x, y, paired=True, alpha=0.05, power=0.8)
    assert result.effect == pytest.approx(2.0) and result.n == 3
    assert result.seeds_needed == math.ceil(TTestPower().solve_power(2.0, alpha=0.05, power=0.8))
    assert result.note == "paired d_z"


def test_power_analysis_single_seed_notes() -> None:
    result = power_analysis(np.array([0.5]), np.array([0.4]), paired=True, alpha=0.05, power=0.8)
    assert math.isnan(result.effect) and math.isnan(result.min_detectable_effect)
    assert "at least 2 seeds" in result.note


@pytest.mark.parametrize(("n", "sd"), [(2, 0.05), (3, 0.02), (5, 0.1), (12, 0.03)])
@pytest.mark.parametrize("paired", [True, False])
def test_min_detectable_difference_is_statsmodels_effect_times_sd(
    n: int, sd: float, paired: bool
) -> None:
    # statsmodels solves the standardised effect at 80% power; in score units it is that many
    # SDs, e.g. paired n = 3: d_z = 3.26, so 3.26 * 0.02 = 0.065 of a pass rate.
    if paired:
        effect = TTestPower().solve_power(effect_size=None, nobs=n, alpha=0.05, power=0.8)
    else:
        effect = TTestIndPower().solve_power(effect_size=None, nobs1=n, alpha=0.05, power=0.8)
    got = min_detectable_difference(n, sd, paired, 0.05, 0.8)
    assert got == pytest.approx(effect * sd, abs=2e-4 * sd)


def test_min_detectable_difference_undefined_without_an_sd() -> None:
    assert math.isnan(min_detectable_difference(3, math.nan, True, 0.05, 0.8))
    assert math.isnan(min_detectable_difference(1, 0.1, True, 0.05, 0.8))  # n < 2
    assert min_detectable_difference(3, 0.0, True, 0.05, 0.8) == 0.0


def test_spreads_are_the_scales_of_the_effects() -> None:
    x, y = np.array([0.6, 0.7, 0.9]), np.array([0.5, 0.5, 0.6])
    # Differences (0.1, 0.2, 0.3): SD 0.1. Pooled: variances 0.0233 and 0.0033 -> sqrt(0.01333).
    assert paired_sd(x, y) == pytest.approx(0.1)
    assert pooled_sd(x, y) == pytest.approx(math.sqrt((0.07 / 3 + 0.01 / 3) / 2))
    assert cohens_d(x, y) == pytest.approx((0.7333333 - 0.5333333) / pooled_sd(x, y))
    assert math.isnan(paired_sd(x[:1], y[:1])) and math.isnan(pooled_sd(x, y[:1]))


def test_power_analysis_reports_the_detectable_difference_in_score_units() -> None:
    x, y = np.array([0.6, 0.7, 0.8]), np.array([0.5, 0.5, 0.5])  # d_z = 2 at SD 0.1
    result = power_analysis(x, y, paired=True, alpha=0.05, power=0.8)
    assert result.sd == pytest.approx(0.1)
    expected = min_detectable_difference(3, 0.1, True, 0.05, 0.8)
    assert result.min_detectable_difference == pytest.approx(expected, rel=1e-12)
    unpaired = power_analysis(x, y, paired=False, alpha=0.05, power=0.8)
    assert unpaired.sd == pytest.approx(pooled_sd(x, y))
