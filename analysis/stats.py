"""Aggregate scores across seeds with bootstrap confidence intervals.

Method: Agarwal et al. 2021, "Deep Reinforcement Learning at the Edge of the Statistical
Precipice" (NeurIPS): report the interquartile mean (IQM) rather than the mean or median, with
percentile intervals from a *stratified* bootstrap (runs are resampled within each task, here
within each staleness lag), and the probability of improvement P(X > Y) between algorithms.
Resampling uses `scipy.stats.bootstrap` (Efron & Tibshirani 1993, percentile method).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from scipy import stats

Aggregate = Literal["iqm", "mean"]
MIN_SEEDS_NOTE = "interval needs at least 2 seeds"


@dataclass(frozen=True)
class Interval:
    """A point estimate with its bootstrap interval; `note` says why an interval is missing."""

    value: float
    low: float
    high: float
    n: int
    note: str = ""


@dataclass(frozen=True)
class BootstrapSpec:
    """How to resample: count, confidence level, and the seed each interval restarts from."""

    n_resamples: int = 10_000
    confidence: float = 0.95
    seed: int = 0


def iqm(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """Interquartile mean: the mean of the middle 50% (25% trimmed from each end).

    Agarwal et al. 2021, sec. 4: robust to outlier runs like the median, but uses half the
    runs, so its intervals are much tighter than the median's.
    """
    return stats.trim_mean(x, 0.25, axis=axis)


def _mean(x: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.mean(x, axis=axis)


AGGREGATES: dict[str, Callable[..., np.ndarray]] = {"iqm": iqm, "mean": _mean}


def _finite(x: Sequence[float] | np.ndarray) -> np.ndarray:
    arr = np.asarray(x, dtype=float)
    return arr[np.isfinite(arr)]


def _percentile_bootstrap(
    data: tuple[np.ndarray, ...],
    statistic: Callable[..., np.ndarray],
    spec: BootstrapSpec,
    paired: bool = False,
) -> tuple[float, float]:
    result = stats.bootstrap(
        data,
        statistic,
        n_resamples=spec.n_resamples,
        confidence_level=spec.confidence,
        method="percentile",
        vectorized=True,
        paired=paired,
        rng=np.random.default_rng(spec.seed),
    )
    return float(result.confidence_interval.low), float(result.confidence_interval.high)


def stratified_interval(
    strata: Sequence[Sequence[float] | np.ndarray], aggregate: Aggregate, spec: BootstrapSpec
) -> Interval:
    """Aggregate over the pooled scores, resampling seeds within each stratum independently.

    Stratification keeps each stratum's (lag's) share of runs fixed in every resample, as in
    Agarwal et al. 2021 (Appendix A.1); with one stratum it is the ordinary bootstrap.
    Strata with fewer than 2 finite scores make the interval undefined (NaN, with a note).
    """
    clean = [_finite(s) for s in strata]
    clean = [s for s in clean if len(s)]
    fn = AGGREGATES[aggregate]
    n = sum(len(s) for s in clean)
    if n == 0:
        return Interval(math.nan, math.nan, math.nan, 0, "no scores")
    value = float(fn(np.concatenate(clean)))
    if min(len(s) for s in clean) < 2:
        return Interval(value, math.nan, math.nan, n, MIN_SEEDS_NOTE)

    def pooled(*samples: np.ndarray, axis: int = -1) -> np.ndarray:
        return fn(np.concatenate(samples, axis=axis), axis=axis)

    low, high = _percentile_bootstrap(tuple(clean), pooled, spec)
    return Interval(value, low, high, n)


def aggregate_interval(
    x: Sequence[float] | np.ndarray, aggregate: Aggregate, spec: BootstrapSpec
) -> Interval:
    """IQM or mean across seeds of one condition with its percentile bootstrap interval."""
    return stratified_interval([x], aggregate, spec)


def probability_of_improvement(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
    """P(X > Y) + 0.5 P(X = Y) over all (x_i, y_j) pairs (Agarwal et al. 2021, sec. 4.3).

    This is the Mann-Whitney U statistic of x divided by n*m (Mann & Whitney 1947).
    Vectorised over leading axes so the bootstrap can evaluate all resamples at once.
    """
    xs = np.moveaxis(np.asarray(x, dtype=float), axis, -1)[..., :, None]  # (..., n, 1)
    ys = np.moveaxis(np.asarray(y, dtype=float), axis, -1)[..., None, :]  # (..., 1, m)
    wins = (xs > ys).astype(float) + 0.5 * (xs == ys)  # (..., n, m)
    return wins.mean(axis=(-2, -1))


def poi_interval(
    x: Sequence[float] | np.ndarray, y: Sequence[float] | np.ndarray, spec: BootstrapSpec
) -> Interval:
    """Probability of improvement of X over Y with an interval from resampling X and Y apart."""
    xs, ys = _finite(x), _finite(y)
    n = len(xs) + len(ys)
    if len(xs) == 0 or len(ys) == 0:
        return Interval(math.nan, math.nan, math.nan, n, "no scores")
    value = float(probability_of_improvement(xs, ys))
    if min(len(xs), len(ys)) < 2:
        return Interval(value, math.nan, math.nan, n, MIN_SEEDS_NOTE)
    low, high = _percentile_bootstrap((xs, ys), probability_of_improvement, spec)
    return Interval(value, low, high, n)


def paired_mean_difference(
    x: Sequence[float] | np.ndarray, y: Sequence[float] | np.ndarray, spec: BootstrapSpec
) -> Interval:
    """Mean of x_i - y_i over matched seeds, with a bootstrap over seeds (pairs kept together).

    Resampling pairs rather than each arm removes the between-seed variance the arms share
    (same initial weights, prompts and sampling noise per seed; design sec. 1).
    """
    xs, ys = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    keep = np.isfinite(xs) & np.isfinite(ys)
    diff = xs[keep] - ys[keep]
    if len(diff) == 0:
        return Interval(math.nan, math.nan, math.nan, 0, "no matched seeds")
    value = float(diff.mean())
    if len(diff) < 2:
        return Interval(value, math.nan, math.nan, 1, "interval needs at least 2 matched seeds")
    low, high = _percentile_bootstrap((diff,), _mean, spec)
    return Interval(value, low, high, len(diff))
