"""How many seeds an observed effect would need, and what the current seeds can detect.

A t-test power analysis (Cohen 1988) on the standardised effect: the paired (one-sample) t-test
on per-seed differences with d_z = mean(d) / sd(d) when seeds are matched (statsmodels
`TTestPower`), else the two-sample t-test on Cohen's d with pooled SD (`TTestIndPower`).
Both two-sided. Observed effects from a few seeds are noisy and often inflated, so the
seeds-needed figure is a planning guide, not a guarantee (Hoenig & Heisey 2001).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np
from scipy import stats
from statsmodels.stats.power import TTestIndPower, TTestPower

MIN_SEEDS = 2  # a t-test needs two observations per group to estimate a variance
MAX_SEEDS = 10**6  # beyond this the answer is 'not with seeds'
# Past this many seeds per arm the report calls an effect impractical to resolve with seeds
# (a longer run or a larger eval set, which make the effect bigger or the noise smaller, helps).
MAX_PRACTICAL_SEEDS = 50
_GL_X, _GL_W = np.polynomial.legendre.leggauss(400)
_GL_U, _GL_W = (_GL_X + 1) / 2, _GL_W / 2  # nodes and weights on [0, 1]


@dataclass(frozen=True)
class PowerResult:
    """Observed standardised effect, seeds per arm needed, smallest detectable effect at n.

    `sd` is the SD the effect is standardised by (of the paired differences, or pooled), and
    `min_detectable_difference` the smallest detectable effect in score units at that SD.
    """

    effect: float
    seeds_needed: float
    min_detectable_effect: float
    n: int
    note: str = ""
    sd: float = math.nan
    min_detectable_difference: float = math.nan


def paired_sd(x: np.ndarray, y: np.ndarray) -> float:
    """sd(x_i - y_i) over matched seeds, the scale of d_z (NaN below 2 pairs)."""
    diff = np.asarray(x, dtype=float) - np.asarray(y, dtype=float)
    diff = diff[np.isfinite(diff)]
    return float(diff.std(ddof=1)) if len(diff) >= MIN_SEEDS else math.nan


def pooled_sd(x: np.ndarray, y: np.ndarray) -> float:
    """sqrt(((n - 1) s_x^2 + (m - 1) s_y^2) / (n + m - 2)), the scale of Cohen's d."""
    xs, ys = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    xs, ys = xs[np.isfinite(xs)], ys[np.isfinite(ys)]
    n, m = len(xs), len(ys)
    if min(n, m) < MIN_SEEDS:
        return math.nan
    return math.sqrt(((n - 1) * xs.var(ddof=1) + (m - 1) * ys.var(ddof=1)) / (n + m - 2))


def paired_effect(x: np.ndarray, y: np.ndarray) -> float:
    """d_z = mean(x_i - y_i) / sd(x_i - y_i) over matched seeds (NaN below 2 pairs)."""
    diff = np.asarray(x, dtype=float) - np.asarray(y, dtype=float)
    diff = diff[np.isfinite(diff)]
    if len(diff) < MIN_SEEDS:
        return math.nan
    sd = diff.std(ddof=1)
    if sd == 0:
        return 0.0 if diff.mean() == 0 else math.copysign(math.inf, diff.mean())
    return float(diff.mean() / sd)


def cohens_d(x: np.ndarray, y: np.ndarray) -> float:
    """(mean_x - mean_y) / pooled SD (Cohen 1988), the effect `TTestIndPower` expects."""
    xs, ys = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    xs, ys = xs[np.isfinite(xs)], ys[np.isfinite(ys)]
    sd = pooled_sd(xs, ys)
    if math.isnan(sd):
        return math.nan
    diff = xs.mean() - ys.mean()
    if sd == 0:
        return 0.0 if diff == 0 else math.copysign(math.inf, diff)
    return float(diff / sd)


def _solver(paired: bool) -> TTestPower | TTestIndPower:
    return TTestPower() if paired else TTestIndPower()


def _noncentrality(effect: float, n: int, paired: bool) -> tuple[float, float]:
    """(noncentrality, df) of the t statistic: d_z sqrt(n), n-1 paired; d sqrt(n/2), 2n-2 not."""
    if paired:
        return effect * math.sqrt(n), n - 1.0
    return effect * math.sqrt(n / 2), 2.0 * n - 2


def _power_by_integral(effect: float, n: int, alpha: float, paired: bool) -> float:
    """Two-sided t-test power as E_V[Phi(nc - c sqrt(V/df)) + Phi(-nc - c sqrt(V/df))].

    T' = (Z + nc) / sqrt(V / df) with V ~ chi2(df); integrating over V avoids scipy's
    noncentral-t tail, which returns NaN for large noncentrality. V is written as the chi2
    quantile of u ~ U(0, 1), so one fixed Gauss-Legendre rule on [0, 1] works at any df.
    """
    nc, df = _noncentrality(effect, n, paired)
    crit = stats.t.ppf(1 - alpha / 2, df)
    scale = crit * np.sqrt(stats.chi2.ppf(_GL_U, df) / df)  # (K,)
    integrand = stats.norm.cdf(nc - scale) + stats.norm.cdf(-nc - scale)  # (K,)
    return float(min(1.0, np.dot(_GL_W, integrand)))


def power_at(effect: float, n: int, alpha: float, paired: bool) -> float:
    """Two-sided t-test power via statsmodels, falling back to direct integration on NaN."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        achieved = float(_solver(paired).power(effect, n, alpha, alternative="two-sided"))
    return achieved if math.isfinite(achieved) else _power_by_integral(effect, n, alpha, paired)


def seeds_needed(
    effect: float, paired: bool, alpha: float, power: float, max_n: int = MAX_SEEDS
) -> float:
    """Smallest seeds per arm (pairs when paired) reaching `power` at `alpha`; NaN if none.

    An integer search (doubling, then bisection) on the power function instead of statsmodels'
    root finder, which fails to converge for large effects; power increases with n, so the
    search is exact. NaN for no effect or beyond `max_n`.
    """
    if math.isnan(effect) or effect == 0:
        return math.nan
    size = min(abs(effect), 1e6)

    def enough(n: int) -> bool:
        return power_at(size, n, alpha, paired) >= power

    if not enough(max_n):
        return math.nan
    low, high = MIN_SEEDS - 1, MIN_SEEDS  # invariant: not enough(low) (or low < MIN_SEEDS)
    while not enough(high):
        low, high = high, min(2 * high, max_n)
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if enough(mid) else (mid, high)
    return float(high)


def min_detectable_effect(n: int, paired: bool, alpha: float, power: float) -> float:
    """Smallest |standardised effect| detectable with `power` at `alpha` with n seeds per arm.

    Bisection on the effect (power increases with it) to 1e-4, for the same robustness reason
    as `seeds_needed`.
    """
    if n < MIN_SEEDS:
        return math.nan
    low, high = 0.0, 1.0
    while power_at(high, n, alpha, paired) < power:
        low, high = high, 2 * high
        if high > 1e6:
            return math.nan
    while high - low > 1e-4:
        mid = (low + high) / 2
        low, high = (low, mid) if power_at(mid, n, alpha, paired) >= power else (mid, high)
    return high


def min_detectable_difference(n: int, sd: float, paired: bool, alpha: float, power: float) -> float:
    """Smallest |mean difference| in score units detectable with `power` at `alpha` with n
    seeds per arm, when the seeds' SD is `sd`: the standardised MDE times the SD it was
    standardised by (d_z = mean(d) / sd(d) paired, d = difference / pooled SD unpaired).

    NaN when the SD is unknown (fewer than 2 seeds) or no n can detect anything.
    """
    if not math.isfinite(sd) or sd < 0:
        return math.nan
    return min_detectable_effect(n, paired, alpha, power) * sd


def power_analysis(
    x: np.ndarray, y: np.ndarray, paired: bool, alpha: float, power: float
) -> PowerResult:
    """Observed effect of x over y, seeds it needs, and the detectable effect at the current n.

    `x` and `y` are aligned per seed when `paired`; otherwise independent samples.
    """
    if paired:
        effect, sd = paired_effect(x, y), paired_sd(x, y)
        diff = np.asarray(x, dtype=float) - np.asarray(y, dtype=float)
        n = int(np.isfinite(diff).sum())
    else:
        effect, sd = cohens_d(x, y), pooled_sd(x, y)
        n = int(
            min(np.isfinite(np.asarray(x, float)).sum(), np.isfinite(np.asarray(y, float)).sum())
        )
    kind = "paired d_z" if paired else "Cohen's d"
    note = kind
    if n < MIN_SEEDS:
        note = f"{kind}: power analysis needs at least 2 seeds per arm"
    elif effect == 0:
        note = f"{kind}: no observed difference, seeds needed undefined"
    elif math.isinf(effect):
        note = f"{kind}: zero-variance differences, effect unbounded"
    needed = seeds_needed(effect, paired, alpha, power)
    if math.isnan(needed) and note == kind and not math.isnan(effect):
        note = f"{kind}: needs more than {MAX_SEEDS:,} seeds per arm"
    mde = min_detectable_effect(n, paired, alpha, power)
    mdd = mde * sd if math.isfinite(sd) else math.nan  # = min_detectable_difference, no re-solve
    return PowerResult(effect, needed, mde, n, note, sd, mdd)
