"""Aggregate metrics as functions of one runs x groups score matrix (rliable's `metrics.py`).

Agarwal et al. 2021, "Deep Reinforcement Learning at the Edge of the Statistical Precipice"
(NeurIPS). A group is a task in rliable's terms: here a staleness lag (strata of one arm's
trials) or an eval set (columns of one condition's seeds). The matrix is held as one array of
runs per group, so a group that lacks some runs (a trial without that eval set) keeps the runs
it has:

    Scores = np.ndarray | Sequence[np.ndarray]

A bare array (or a list of numbers) is ONE group with runs on its last axis; a sequence of
arrays is several groups. Leading
axes are batch axes (the bootstrap's resamples), so every metric evaluates all resamples in one
call and returns an array of the leading shape.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from scipy import stats

Scores = np.ndarray | Sequence[np.ndarray]
Groups = list[np.ndarray]  # one array per group, runs on the last axis: (..., n_j)
Metric = Callable[[Scores], np.ndarray]
GAMMA = 1.0  # the optimality-gap target: a perfect pass rate
IQM_MIN_VALUES = 4  # below this, trim_mean(0.25) cuts int(0.25 n) = 0 values: IQM = mean


def groups_of(scores: Scores) -> Groups:
    """The groups of `scores`: an array or a list of numbers is one group, a sequence of arrays
    (or of lists) one group per item."""
    if isinstance(scores, np.ndarray):
        return [scores.astype(float, copy=False)]
    items = list(scores)
    if all(np.ndim(item) == 0 for item in items):
        return [np.asarray(items, dtype=float)]
    return [np.asarray(g, dtype=float) for g in items]


def columns(matrix: np.ndarray) -> Groups:
    """Split a (runs, groups) matrix into per-group arrays of its finite scores."""
    arr = np.asarray(matrix, dtype=float)
    return [col[np.isfinite(col)] for col in arr.T]


def pooled(scores: Scores) -> np.ndarray:
    """Every runs x groups entry on the last axis: (..., sum_j n_j)."""
    return np.concatenate(groups_of(scores), axis=-1)


def group_means(scores: Scores) -> np.ndarray:
    """Mean score of each group: (..., groups)."""
    return np.stack([g.mean(axis=-1) for g in groups_of(scores)], axis=-1)


def iqm(scores: Scores) -> np.ndarray:
    """Interquartile mean of all entries: 25% trimmed from each end (rliable `aggregate_iqm`).

    Agarwal et al. 2021, sec. 4: robust to outlier runs like the median, but uses half the
    runs, so its intervals are much tighter than the median's. `trim_mean` cuts int(0.25 n)
    values per end, none below 4 values (see `iqm_is_mean`).
    """
    return stats.trim_mean(pooled(scores), 0.25, axis=-1)


def iqm_is_mean(n_values: int) -> bool:
    """True when the IQM of `n_values` scores trims nothing and so equals their mean."""
    return 0 < n_values < IQM_MIN_VALUES


def mean(scores: Scores) -> np.ndarray:
    """Mean over groups of the per-group mean score (rliable `aggregate_mean`)."""
    return group_means(scores).mean(axis=-1)


def pooled_mean(scores: Scores) -> np.ndarray:
    """Mean of all entries, each run counted once (equals `mean` when groups are equal size).

    The report pools an arm's trials over lags this way: a lag with more seeds weighs more.
    """
    return pooled(scores).mean(axis=-1)


def median(scores: Scores) -> np.ndarray:
    """Median over groups of the per-group mean score (rliable `aggregate_median`)."""
    return np.median(group_means(scores), axis=-1)


def optimality_gap(scores: Scores, gamma: float = GAMMA) -> np.ndarray:
    """gamma - mean(min(score, gamma)) over all entries: how far below perfect, on average.

    Scores above gamma earn nothing more, so unlike the mean it does not reward overshooting one
    group to hide a failure on another (Agarwal et al. 2021, sec. 4.2). Lower is better.
    """
    return gamma - np.minimum(pooled(scores), gamma).mean(axis=-1)


def pairwise_improvement(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """P(X > Y) + 0.5 P(X = Y) over all (x_i, y_j) pairs of one group; runs on the last axis.

    This is the Mann-Whitney U statistic of x divided by n*m (Mann & Whitney 1947).
    """
    xs = np.asarray(x, dtype=float)[..., :, None]  # (..., n, 1)
    ys = np.asarray(y, dtype=float)[..., None, :]  # (..., 1, m)
    wins = (xs > ys).astype(float) + 0.5 * (xs == ys)  # (..., n, m)
    return wins.mean(axis=(-2, -1))


def probability_of_improvement(x: Scores, y: Scores) -> np.ndarray:
    """Mean over groups m of P(X_m > Y_m) + 0.5 P(X_m = Y_m) (Agarwal et al. 2021, sec. 4.3).

    rliable's `probability_of_improvement`; with one group it is the plain pairwise PoI.
    """
    pairs = zip(groups_of(x), groups_of(y), strict=True)
    per_group = [pairwise_improvement(xm, ym) for xm, ym in pairs]
    return np.mean(np.stack(per_group, axis=-1), axis=-1)


def profile_values(scores: Scores, taus: np.ndarray) -> np.ndarray:
    """Performance profile: mean over groups of the fraction of runs scoring above each tau.

    rliable's run-score distribution: P(score > tau) per group, averaged so every group weighs
    the same. Output (..., len(taus)).
    """
    per_group = [(g[..., None] > taus).mean(axis=-2) for g in groups_of(scores)]  # (..., T)
    return np.mean(np.stack(per_group, axis=0), axis=0)


METRICS: dict[str, Metric] = {
    "iqm": iqm,
    "mean": mean,
    "pooled_mean": pooled_mean,
    "median": median,
    "optimality_gap": optimality_gap,
}
