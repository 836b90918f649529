"""Point estimates with stratified-bootstrap intervals: the shapes the report asks for.

Each function cleans its scores (non-finite dropped, empty groups left out), computes a metric
of `analysis.stats.metrics` and, when every group has at least 2 runs, its interval from the one
engine `analysis.stats.bootstrap.stratified_bootstrap`. Below 2 runs the interval is NaN with
`MIN_SEEDS_NOTE`, as everywhere in the report.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import numpy as np

from analysis.stats.bootstrap import MIN_RUNS, BootstrapSpec, Interval, stratified_bootstrap
from analysis.stats.metrics import (
    METRICS,
    Groups,
    Metric,
    Scores,
    groups_of,
    iqm,
    iqm_is_mean,
    pooled_mean,
    probability_of_improvement,
    profile_values,
)

Aggregate = Literal["iqm", "mean"]
AggregateName = Literal["iqm", "mean", "median", "optimality_gap"]
AGGREGATE_NAMES: tuple[AggregateName, ...] = ("iqm", "mean", "median", "optimality_gap")
MIN_SEEDS_NOTE = "interval needs at least 2 seeds"
IQM_IS_MEAN_NOTE = "IQM = mean: fewer than 4 values, the 25% trim removes none"


def finite_groups(scores: Scores) -> Groups:
    """The finite scores of each group, groups left without any dropped."""
    groups = [g[np.isfinite(g)] for g in groups_of(scores)]
    return [g for g in groups if len(g)]


def _nan(n: int, note: str) -> Interval:
    return Interval(math.nan, math.nan, math.nan, n, note)


def _with_note(interval: Interval, note: str) -> Interval:
    joined = "; ".join(part for part in (interval.note, note) if part)
    return Interval(interval.value, interval.low, interval.high, interval.n, joined)


def estimate(groups: Groups, metric: Metric, spec: BootstrapSpec, n: int) -> Interval:
    """`metric` of non-empty finite `groups` with its interval; `n` is what the row counts."""
    value = float(metric(groups))
    if min(len(g) for g in groups) < MIN_RUNS:
        return Interval(value, math.nan, math.nan, n, MIN_SEEDS_NOTE)
    low, high = stratified_bootstrap(groups, metric, spec)
    return Interval(value, float(low), float(high), n)


def _iqm_note(interval: Interval, groups: Groups, metric: Metric) -> Interval:
    """Say so when an IQM trimmed nothing (fewer than 4 values) and is just the mean."""
    if metric is iqm and iqm_is_mean(sum(len(g) for g in groups)):
        return _with_note(interval, IQM_IS_MEAN_NOTE)
    return interval


def stratified_interval(strata: Scores, aggregate: Aggregate, spec: BootstrapSpec) -> Interval:
    """IQM or mean of the pooled scores, resampling seeds within each stratum independently.

    Stratification keeps each stratum's (lag's) share of runs fixed in every resample, as in
    Agarwal et al. 2021 (Appendix A.1); with one stratum it is the ordinary bootstrap. The mean
    counts every run once (`pooled_mean`); `n` counts all runs.
    """
    groups = finite_groups(strata)
    if not groups:
        return _nan(0, "no scores")
    metric = iqm if aggregate == "iqm" else pooled_mean
    interval = estimate(groups, metric, spec, sum(len(g) for g in groups))
    return _iqm_note(interval, groups, metric)


def aggregate_interval(x: Scores, aggregate: Aggregate, spec: BootstrapSpec) -> Interval:
    """IQM or mean across seeds of one condition with its percentile bootstrap interval."""
    return stratified_interval([np.asarray(x, dtype=float)], aggregate, spec)


def stratified_aggregate(tasks: Sequence[np.ndarray], name: str, spec: BootstrapSpec) -> Interval:
    """Aggregate `name` (METRICS) of one condition's runs x groups matrix with its interval.

    `n` is the number of runs (seeds): the largest group.
    """
    groups = finite_groups(list(tasks))
    if not groups:
        return _nan(0, "no scores")
    metric = METRICS[name]
    interval = estimate(groups, metric, spec, max(len(g) for g in groups))
    return _iqm_note(interval, groups, metric)


def poi_interval(x: Scores, y: Scores, spec: BootstrapSpec) -> Interval:
    """Probability of improvement of X over Y, averaged over groups, with its interval.

    X and Y are resampled apart, group by group (every group of X, then every group of Y). A
    group missing from either side is left out of both (PoI compares like with like). `n` is
    the seeds of both arms.
    """
    xs, ys = groups_of(x), groups_of(y)
    pairs = [(a[np.isfinite(a)], b[np.isfinite(b)]) for a, b in zip(xs, ys, strict=True)]
    kept = [(a, b) for a, b in pairs if len(a) and len(b)]
    if not kept:
        return _nan(sum(len(a) + len(b) for a, b in pairs), "no scores")
    gx, gy = [a for a, _ in kept], [b for _, b in kept]
    k = len(gx)

    def metric(groups: Groups) -> np.ndarray:
        return probability_of_improvement(groups[:k], groups[k:])

    return estimate([*gx, *gy], metric, spec, max(map(len, gx)) + max(map(len, gy)))


def paired_mean_difference(x: Scores, y: Scores, spec: BootstrapSpec) -> Interval:
    """Mean of x_i - y_i over matched seeds, with a bootstrap over seeds (pairs kept together).

    Resampling pairs rather than each arm removes the between-seed variance the arms share
    (same initial weights, prompts and sampling noise per seed; design sec. 1).
    """
    xs, ys = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    keep = np.isfinite(xs) & np.isfinite(ys)
    diff = xs[keep] - ys[keep]
    if len(diff) == 0:
        return _nan(0, "no matched seeds")
    if len(diff) < MIN_RUNS:
        value = float(pooled_mean(diff))
        return Interval(value, math.nan, math.nan, 1, "interval needs at least 2 matched seeds")
    return estimate([diff], pooled_mean, spec, len(diff))


def performance_profile(
    tasks: Sequence[np.ndarray], taus: np.ndarray, spec: BootstrapSpec
) -> list[Interval]:
    """Profile value at each tau with a stratified-bootstrap band (one draw shared by all taus)."""
    groups = finite_groups(list(tasks))
    if not groups:
        return [_nan(0, "no scores") for _ in taus]
    runs = max(len(g) for g in groups)
    values = profile_values(groups, taus)
    if min(len(g) for g in groups) < MIN_RUNS:
        return [Interval(float(v), math.nan, math.nan, runs, MIN_SEEDS_NOTE) for v in values]
    low, high = stratified_bootstrap(groups, lambda r: profile_values(r, taus), spec)  # (T,)
    return [
        Interval(float(v), float(lo), float(hi), runs)
        for v, lo, hi in zip(values, low, high, strict=True)
    ]
