"""Hypothesis tests, multiplicity correction and effect sizes for arm comparisons.

Matched arms share the seed (initial weights, prompts, sampling noise; design sec. 1), so the
primary tests are paired over seeds: Wilcoxon signed-rank (Wilcoxon 1945) and Student's paired
t-test (Student 1908; the test the power analysis plans for). Unpaired tests are Welch's t-test
(Welch 1947) and Mann-Whitney U (Mann & Whitney 1947). p-values are adjusted with Holm's
step-down method (Holm 1979). Every test also reports the smallest p-value its sample
size can produce at all, because with few seeds an exact rank test cannot reach 0.05 however
large the effect (e.g. Mann-Whitney 3 vs 3: p >= 2 / C(6, 3) = 0.1).

Rank tests stay exact when scores tie, which pass rates k/n often do: Mann-Whitney uses the
exact permutation distribution of the midrank sum (computed here, up to about 50 vs 50 seeds);
Wilcoxon uses scipy's exact distribution, or with tied or zero differences its exhaustive
sign-flip permutations, up to 13 pairs. Beyond those sizes both use a normal approximation,
whose floor is far below any alpha.
"""

from __future__ import annotations

import contextlib
import gc
import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
from scipy import stats
from statsmodels.stats.multitest import multipletests


@dataclass(frozen=True)
class TestResult:
    """A two-sided p-value, the smallest one attainable at this n, and a note for the reader.

    For Mann-Whitney with tied scores the floor is the one attainable given those ties (ties
    merge rank assignments, so it can exceed the tie-free 2 / C(n + m, n)).
    """

    __test__ = False  # not a pytest class despite the name

    p_value: float
    min_attainable_p: float
    n: int
    note: str = ""


def _finite_pairs(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    keep = np.isfinite(x) & np.isfinite(y)
    return x[keep], y[keep]


def _finite(x: np.ndarray) -> np.ndarray:
    arr = np.asarray(x, dtype=float)
    return arr[np.isfinite(arr)]


def reach_note(min_p: float, alpha: float, what: str) -> str:
    """A note when even the most extreme outcome at this n could not give p < alpha."""
    if math.isnan(min_p) or min_p < alpha:
        return ""
    return (
        f"{what}: smallest attainable p = {min_p:.3g} >= alpha {alpha:g}; cannot reach significance"
    )


def min_p_wilcoxon(n_nonzero: int) -> float:
    """Smallest exact two-sided Wilcoxon signed-rank p with n non-zero differences.

    Under H0 each of the 2^n sign patterns is equally likely; the most extreme statistic (all
    differences one sign) has probability 1/2^n per tail, so p_min = 2 / 2^n (capped at 1).
    """
    if n_nonzero < 1:
        return 1.0
    return min(1.0, 2.0 / 2.0**n_nonzero)


def min_p_mann_whitney(n: int, m: int) -> float:
    """Smallest exact two-sided Mann-Whitney p for samples of n and m without ties.

    Under H0 all C(n+m, n) rank assignments are equally likely; complete separation is one of
    them per tail, so p_min = 2 / C(n+m, n) (capped at 1).
    """
    if n < 1 or m < 1:
        return 1.0
    return min(1.0, 2.0 / math.comb(n + m, n))


def min_p_fisher(n1: int, n2: int) -> float:
    """Smallest two-sided Fisher exact p for groups of n1 and n2: the fully separated table."""
    if n1 < 1 or n2 < 1:
        return 1.0
    return float(stats.fisher_exact([[n1, 0], [0, n2]]).pvalue)


def wilcoxon_paired(x: np.ndarray, y: np.ndarray, alpha: float = 0.05) -> TestResult:
    """Wilcoxon signed-rank test of x_i - y_i over matched seeds (zero differences dropped)."""
    xs, ys = _finite_pairs(x, y)
    diff = xs - ys
    nonzero = int(np.count_nonzero(diff))
    min_p = min_p_wilcoxon(nonzero)
    if nonzero == 0:
        note = "no matched seeds" if len(diff) == 0 else "all matched differences are zero"
        return TestResult(math.nan if len(diff) == 0 else 1.0, min_p, len(diff), note)
    p = float(stats.wilcoxon(diff, zero_method="wilcox", alternative="two-sided").pvalue)
    return TestResult(p, min_p, len(diff), reach_note(min_p, alpha, f"Wilcoxon n={nonzero}"))


def paired_t(x: np.ndarray, y: np.ndarray) -> TestResult:
    """Student's paired t-test of x_i - y_i over matched seeds (Student 1908), two-sided.

    The test the power analysis plans for (`power`: d_z with statsmodels `TTestPower`), so its
    p-value, the seeds needed and the smallest detectable difference describe one test.
    """
    xs, ys = _finite_pairs(x, y)
    diff = xs - ys
    if len(diff) < 2:
        return TestResult(math.nan, math.nan, len(diff), "paired t needs at least 2 matched seeds")
    if np.all(diff == diff[0]):
        note = "paired t undefined: every matched difference is equal"
        return TestResult(math.nan, 0.0, len(diff), note)
    p = float(stats.ttest_rel(xs, ys).pvalue)
    return TestResult(p, 0.0, len(diff))


def welch(x: np.ndarray, y: np.ndarray, alpha: float = 0.05) -> TestResult:
    """Welch's unequal-variance t-test; needs 2 finite scores per arm to estimate variances."""
    xs, ys = _finite(x), _finite(y)
    n = len(xs) + len(ys)
    if min(len(xs), len(ys)) < 2:
        return TestResult(math.nan, math.nan, n, "Welch needs at least 2 seeds per arm")
    if np.var(xs) == 0 and np.var(ys) == 0:
        return TestResult(math.nan, 0.0, n, "Welch undefined: both arms have zero variance")
    p = float(stats.ttest_ind(xs, ys, equal_var=False).pvalue)
    return TestResult(p, 0.0, n)


# Work bound (array cells x pooled size) of the exact Mann-Whitney distribution: 3 vs 3 is
# 4 x 43 x 6 cells, 50 vs 50 about 5e7 (a fraction of a second); beyond, the normal approximation.
MW_EXACT_MAX_WORK = 100_000_000


def rank_sum_counts(doubled_ranks: np.ndarray, n: int) -> np.ndarray:
    """counts[s] = how many n-subsets of the pooled sample have doubled rank sum s.

    Under H0 every split of the pooled scores into n and m is equally likely (Mann & Whitney
    1947), with or without ties; ties only merge ranks into midranks. Doubling makes midranks
    integers, so the distribution is an exact count by the subset-sum recurrence: each element
    is either in the subset (count + 1, sum + its doubled rank) or not.
    """
    ranks = np.asarray(doubled_ranks, dtype=np.int64)
    counts = np.zeros((n + 1, int(ranks.sum()) + 1))  # (subset size, doubled rank sum)
    counts[0, 0] = 1.0
    for d in ranks:
        # The right side is evaluated from the old counts before assignment: take d or not.
        counts[1:, d:] = counts[1:, d:] + counts[:-1, : counts.shape[1] - d]
    return counts[n]


def exact_mann_whitney(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """(two-sided exact permutation p, smallest p attainable with these pooled scores).

    p = min(1, 2 min(P(R <= r), P(R >= r))) for the midrank sum R of x, the convention of
    `scipy.stats.permutation_test`; the rank sum and U = R - n(n+1)/2 order splits alike.
    """
    doubled = np.rint(2 * stats.rankdata(np.concatenate([x, y]))).astype(np.int64)
    counts = rank_sum_counts(doubled, len(x))
    total = counts.sum()  # C(n + m, n)
    lower, upper = np.cumsum(counts), np.cumsum(counts[::-1])[::-1]  # P(R <= s), P(R >= s)
    p_at = np.minimum(1.0, 2 * np.minimum(lower, upper) / total)
    observed = int(doubled[: len(x)].sum())
    return float(p_at[observed]), float(p_at[counts > 0].min())


def mann_whitney(x: np.ndarray, y: np.ndarray, alpha: float = 0.05) -> TestResult:
    """Two-sided Mann-Whitney U test, exact (ties included) whenever the work bound allows.

    scipy's `method="auto"` falls back to a normal approximation as soon as two scores tie,
    e.g. 0.047 for [0.5] * 3 vs [0.6] * 3, below the 0.1 floor of any exact test at 3 vs 3.
    """
    xs, ys = _finite(x), _finite(y)
    n = len(xs) + len(ys)
    if min(len(xs), len(ys)) < 1:
        return TestResult(math.nan, 1.0, n, "no scores")
    what = f"Mann-Whitney {len(xs)} vs {len(ys)}"
    if (len(xs) + 1) * n * (n + 1) * n <= MW_EXACT_MAX_WORK:
        p, min_p = exact_mann_whitney(xs, ys)
        if len(np.unique(np.concatenate([xs, ys]))) < n:
            what += " with ties"
    else:
        p = float(stats.mannwhitneyu(xs, ys, alternative="two-sided", method="asymptotic").pvalue)
        min_p = min_p_mann_whitney(len(xs), len(ys))
    return TestResult(p, min_p, n, reach_note(min_p, alpha, what))


def fisher(k1: int, n1: int, k2: int, n2: int, alpha: float = 0.05) -> TestResult:
    """Fisher's exact test of k1/n1 vs k2/n2 events (Fisher 1922); exact at any n."""
    if n1 < 1 or n2 < 1:
        return TestResult(math.nan, 1.0, n1 + n2, "an arm has no trials")
    table = [[k1, n1 - k1], [k2, n2 - k2]]
    p = float(stats.fisher_exact(table, alternative="two-sided").pvalue)
    min_p = min_p_fisher(n1, n2)
    return TestResult(p, min_p, n1 + n2, reach_note(min_p, alpha, f"Fisher {n1} vs {n2}"))


def holm(p_values: np.ndarray) -> np.ndarray:
    """Holm-adjusted p-values (Holm 1979) via statsmodels; NaNs stay NaN, outside the family."""
    p = np.asarray(p_values, dtype=float)
    out = np.full_like(p, np.nan)
    ok = np.isfinite(p)
    if ok.any():
        with _frozen_gc():
            out[ok] = multipletests(p[ok], method="holm")[1]
    return out


@contextlib.contextmanager
def _frozen_gc() -> Iterator[None]:
    """Make statsmodels' `gc.collect()` inside the Holm branch of `multipletests` cheap.

    That full collection walks every live object (0.1-0.6 s with MLflow and matplotlib loaded,
    per call); frozen objects are skipped, and unfreezing restores them for the next collection.
    """
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def hedges_g(x: np.ndarray, y: np.ndarray) -> float:
    """Standardised mean difference with Hedges' small-sample correction (Hedges 1981).

    g = J * (mean_x - mean_y) / s_pooled, J = 1 - 3 / (4 (n + m) - 9); Cohen's d alone is
    biased upwards by about 1/J at the handful of seeds RL papers use.
    """
    xs, ys = _finite(x), _finite(y)
    n, m = len(xs), len(ys)
    if n < 2 or m < 2:
        return math.nan
    pooled = ((n - 1) * xs.var(ddof=1) + (m - 1) * ys.var(ddof=1)) / (n + m - 2)
    diff = xs.mean() - ys.mean()
    if pooled == 0:
        return 0.0 if diff == 0 else math.copysign(math.inf, diff)
    return float((1 - 3 / (4 * (n + m) - 9)) * diff / math.sqrt(pooled))


def cliffs_delta(x: np.ndarray, y: np.ndarray) -> float:
    """Cliff's delta = P(X > Y) - P(X < Y) over all pairs (Cliff 1993); in [-1, 1]."""
    xs, ys = _finite(x), _finite(y)
    if len(xs) == 0 or len(ys) == 0:
        return math.nan
    greater = (xs[:, None] > ys[None, :]).mean()  # (n, m) comparisons
    less = (xs[:, None] < ys[None, :]).mean()
    return float(greater - less)
