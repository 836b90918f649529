"""Tests that can say "no worse than" or "the same within a margin", not only "different".

A difference test that finds nothing says only that the seeds could not tell the arms apart:
asynchrony with a lost 5 points and 3 seeds looks the same as asynchrony that is free. To claim
the second, the claim needs a margin `delta` the reader names (`report.equivalence_margin`) and
a test whose null hypothesis is the cost (Schuirmann 1987; Walker & Nowacki 2011):

- non-inferiority of X to Y: H0 mean(X - Y) <= -delta against H1 mean(X - Y) > -delta, one
  paired one-sided t-test ("X is not worse than Y by more than delta");
- equivalence (TOST): both one-sided tests, H0 |mean(X - Y)| >= delta; p is the larger of the
  two one-sided p-values ("X and Y are within delta of each other").

Both are paired over matched seeds, as the difference tests are, and equal statsmodels'
`ttost_paired` (its lower and its overall p-value) on the same data, including data whose
differences are all equal (bitwise-equal trials: p is the test's limit, 0 or 1).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from scipy import stats

from analysis.stats.significance import TestResult

EQUAL_DIFFERENCES_NOTE = "every matched difference is equal: p is the t-test's limit"


def _paired_differences(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    xs, ys = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    keep = np.isfinite(xs) & np.isfinite(ys)
    return xs[keep] - ys[keep]


def _one_sided(diff: np.ndarray, bound: float, alternative: str) -> float:
    return float(stats.ttest_1samp(diff, bound, alternative=alternative).pvalue)


def _paired_margin_test(
    x: np.ndarray,
    y: np.ndarray,
    margin: float,
    what: str,
    *,
    holds: Callable[[float], bool],
    p_value: Callable[[np.ndarray], float],
) -> TestResult:
    """The course both margin tests share: the paired differences x - y, too few of them to
    test (`what` says which test), the all-equal limit where `holds(difference)` decides the
    side, else `p_value(differences)`."""
    if not margin > 0:
        raise ValueError(f"margin must be > 0, got {margin}")
    diff = _paired_differences(x, y)
    if len(diff) < 2:
        return TestResult(math.nan, math.nan, len(diff), f"{what} needs at least 2 matched seeds")
    if np.all(diff == diff[0]):
        return _limit(holds(diff[0]), len(diff))
    return TestResult(p_value(diff), 0.0, len(diff))


def _limit(holds: bool, n: int) -> TestResult:
    """Every difference equal (bitwise-equal trials, say): the t statistic is +-inf, so the test's
    p is its limit, 0 where the margin hypothesis holds and 1 where it does not (what scipy and
    statsmodels return on such data)."""
    return TestResult(0.0 if holds else 1.0, 0.0, n, EQUAL_DIFFERENCES_NOTE)


def noninferiority_paired(x: np.ndarray, y: np.ndarray, margin: float) -> TestResult:
    """One-sided paired t-test of H0 mean(x - y) <= -margin (x worse than y by margin or more).

    A small p supports "x is not worse than y by more than `margin`".
    """
    return _paired_margin_test(
        x,
        y,
        margin,
        "non-inferiority t",
        holds=lambda d: bool(d > -margin),
        p_value=lambda diff: _one_sided(diff, -margin, "greater"),
    )


def tost_paired(x: np.ndarray, y: np.ndarray, margin: float) -> TestResult:
    """Paired two one-sided tests of H0 |mean(x - y)| >= margin; p = the larger one-sided p.

    A small p supports "x and y are within `margin` of each other".
    """

    def larger_p(diff: np.ndarray) -> float:
        return max(_one_sided(diff, -margin, "greater"), _one_sided(diff, margin, "less"))

    return _paired_margin_test(
        x, y, margin, "TOST", holds=lambda d: bool(abs(d) < margin), p_value=larger_p
    )
