"""Aggregate metrics across eval sets on a runs x tasks score matrix, with stratified intervals.

Method: Agarwal et al. 2021, "Deep RL at the Edge of the Statistical Precipice" (NeurIPS), as
implemented in rliable: the scores of one condition form a matrix with one column per task (here
per eval set) and one row per run (seed). Aggregates are IQM over all runs x tasks, mean and
median of the per-task mean scores, and the optimality gap gamma - mean(min(score, gamma)) with
gamma = 1 (a pass rate cannot exceed 1). Intervals come from a stratified bootstrap: in each
resample the runs of every task are drawn with replacement, each task column independently, so
every task keeps its share of the data. Columns are handled as separate arrays so a task that
lacks some runs (a trial without that eval set) keeps the runs it has.

Random draws (one `np.random.default_rng(spec.seed)` per interval): for each task column j in
order, one `integers(0, n_j, size=(n_resamples, n_j))` call; `poi` draws every column of X, then
every column of Y. The tests replay exactly this order in a plain loop.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Literal

import numpy as np
from scipy import stats

from analysis.stats import MIN_SEEDS_NOTE, BootstrapSpec, Interval, probability_of_improvement

Tasks = list[np.ndarray]  # one array per task, runs on the last axis: (..., n_j)
AggregateName = Literal["iqm", "mean", "median", "optimality_gap"]
AGGREGATE_NAMES: tuple[AggregateName, ...] = ("iqm", "mean", "median", "optimality_gap")
GAMMA = 1.0  # the optimality-gap target: a perfect pass rate


def columns(matrix: np.ndarray) -> Tasks:
    """Split a (runs, tasks) matrix into per-task arrays of its finite scores."""
    arr = np.asarray(matrix, dtype=float)
    return [col[np.isfinite(col)] for col in arr.T]


def _task_means(tasks: Tasks) -> np.ndarray:
    return np.stack([t.mean(axis=-1) for t in tasks], axis=-1)  # (..., tasks)


def agg_iqm(tasks: Tasks) -> np.ndarray:
    """IQM over all runs x tasks (25% trimmed from each end of the pooled scores)."""
    return stats.trim_mean(np.concatenate(tasks, axis=-1), 0.25, axis=-1)


def agg_mean(tasks: Tasks) -> np.ndarray:
    """Mean over tasks of the per-task mean score (rliable's `aggregate_mean`)."""
    return _task_means(tasks).mean(axis=-1)


def agg_median(tasks: Tasks) -> np.ndarray:
    """Median over tasks of the per-task mean score (rliable's `aggregate_median`)."""
    return np.median(_task_means(tasks), axis=-1)


def agg_optimality_gap(tasks: Tasks, gamma: float = GAMMA) -> np.ndarray:
    """gamma - mean(min(score, gamma)) over all runs x tasks: how far below perfect, on average.

    Scores above gamma earn nothing more, so unlike the mean it does not reward overshooting one
    task to hide a failure on another (Agarwal et al. 2021, sec. 4.2). Lower is better.
    """
    pooled = np.concatenate(tasks, axis=-1)
    return gamma - np.minimum(pooled, gamma).mean(axis=-1)


AGGREGATES: dict[str, Callable[[Tasks], np.ndarray]] = {
    "iqm": agg_iqm,
    "mean": agg_mean,
    "median": agg_median,
    "optimality_gap": agg_optimality_gap,
}


def resample(tasks: Tasks, n_resamples: int, rng: np.random.Generator) -> Tasks:
    """One stratified bootstrap draw per resample: runs within each task, task by task."""
    out = []
    for task in tasks:
        idx = rng.integers(0, len(task), size=(n_resamples, len(task)))  # (B, n_j)
        out.append(task[idx])
    return out


def percentile_interval(samples: np.ndarray, confidence: float) -> tuple[np.ndarray, np.ndarray]:
    """Percentile bootstrap interval along axis 0 (Efron & Tibshirani 1993)."""
    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(samples, [tail, 100 - tail], axis=0)
    return low, high


def _usable(tasks: Sequence[np.ndarray]) -> tuple[Tasks, int, str]:
    """(non-empty tasks, runs counted once per run, note) for one condition."""
    clean = [np.asarray(t, dtype=float) for t in tasks]
    clean = [t[np.isfinite(t)] for t in clean]
    clean = [t for t in clean if len(t)]
    if not clean:
        return [], 0, "no scores"
    runs = max(len(t) for t in clean)
    return clean, runs, "" if min(len(t) for t in clean) >= 2 else MIN_SEEDS_NOTE


def stratified_aggregate(tasks: Sequence[np.ndarray], name: str, spec: BootstrapSpec) -> Interval:
    """Aggregate `name` of one condition with its stratified-bootstrap percentile interval.

    `n` is the number of runs (seeds): the largest task column. Below 2 runs in some task the
    interval is undefined (NaN with a note), as everywhere in the report.
    """
    clean, runs, note = _usable(tasks)
    if not clean:
        return Interval(math.nan, math.nan, math.nan, 0, note)
    fn = AGGREGATES[name]
    value = float(fn(clean))
    if note:
        return Interval(value, math.nan, math.nan, runs, note)
    rng = np.random.default_rng(spec.seed)
    low, high = percentile_interval(fn(resample(clean, spec.n_resamples, rng)), spec.confidence)
    return Interval(value, float(low), float(high), runs)


def profile_values(tasks: Tasks, taus: np.ndarray) -> np.ndarray:
    """Performance profile: mean over tasks of the fraction of runs scoring above each tau.

    rliable's run-score distribution: P(score > tau) per task, averaged so every task weighs
    the same. Output (..., len(taus)).
    """
    per_task = [(t[..., None] > taus).mean(axis=-2) for t in tasks]  # each (..., T)
    return np.mean(np.stack(per_task, axis=0), axis=0)


def performance_profile(
    tasks: Sequence[np.ndarray], taus: np.ndarray, spec: BootstrapSpec
) -> list[Interval]:
    """Profile value at each tau with a stratified-bootstrap band (one draw shared by all taus)."""
    clean, runs, note = _usable(tasks)
    if not clean:
        return [Interval(math.nan, math.nan, math.nan, 0, note) for _ in taus]
    values = profile_values(clean, taus)
    if note:
        return [Interval(float(v), math.nan, math.nan, runs, note) for v in values]
    rng = np.random.default_rng(spec.seed)
    boot = profile_values(resample(clean, spec.n_resamples, rng), taus)  # (B, T)
    low, high = percentile_interval(boot, spec.confidence)
    return [
        Interval(float(v), float(lo), float(hi), runs)
        for v, lo, hi in zip(values, low, high, strict=True)
    ]


def poi_across_tasks(x: Tasks, y: Tasks) -> np.ndarray:
    """Mean over tasks m of P(X_m > Y_m) + 0.5 P(X_m = Y_m) (rliable's aggregated PoI)."""
    per_task = [probability_of_improvement(xm, ym) for xm, ym in zip(x, y, strict=True)]
    return np.mean(np.stack(per_task, axis=-1), axis=-1)


def poi_interval_tasks(
    x: Sequence[np.ndarray], y: Sequence[np.ndarray], spec: BootstrapSpec
) -> Interval:
    """Aggregated PoI of X over Y on the same tasks; X and Y resampled apart, task by task.

    A task missing from either side is left out of both (PoI compares like with like).
    """
    pairs = [
        (xs[np.isfinite(xs)], ys[np.isfinite(ys)])
        for xs, ys in (
            (np.asarray(a, float), np.asarray(b, float)) for a, b in zip(x, y, strict=True)
        )
    ]
    pairs = [(a, b) for a, b in pairs if len(a) and len(b)]
    if not pairs:
        return Interval(math.nan, math.nan, math.nan, 0, "no scores")
    xs, ys = [a for a, _ in pairs], [b for _, b in pairs]
    n = max(len(a) for a in xs) + max(len(b) for b in ys)
    value = float(poi_across_tasks(xs, ys))
    if min(len(t) for t in (*xs, *ys)) < 2:
        return Interval(value, math.nan, math.nan, n, MIN_SEEDS_NOTE)
    rng = np.random.default_rng(spec.seed)
    boot_x = resample(xs, spec.n_resamples, rng)
    boot_y = resample(ys, spec.n_resamples, rng)
    low, high = percentile_interval(poi_across_tasks(boot_x, boot_y), spec.confidence)
    return Interval(value, float(low), float(high), n)
