"""The one bootstrap engine: a stratified percentile bootstrap over the runs of each group.

Every interval of the report comes from `stratified_bootstrap` (rliable's
`get_interval_estimates`, Agarwal et al. 2021, Appendix A.1): in each resample the runs of every
group are drawn with replacement, each group independently, so every group (a lag, an eval set,
an arm of a comparison) keeps its share of the data; with one group it is the ordinary
bootstrap. Intervals are percentile intervals (Efron & Tibshirani 1993, ch. 13).

Random draws: one `np.random.default_rng(spec.seed)` per interval, never the global state; for
each group j in order, one `integers(0, n_j, size=(n_resamples, n_j))` call. This is the order
`scipy.stats.bootstrap` draws in (sample by sample), so intervals formerly computed with it
replay the same resamples.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

MIN_RUNS = 2  # a group with one run resamples to itself: no interval


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

    def __post_init__(self) -> None:
        if self.n_resamples < 1:
            raise ValueError(f"n_resamples must be >= 1, got {self.n_resamples}")
        if not 0 < self.confidence < 1:
            raise ValueError(f"confidence must be in (0, 1), got {self.confidence}")


Statistic = Callable[[list[np.ndarray]], np.ndarray]


def _check_groups(groups: Sequence[np.ndarray]) -> list[np.ndarray]:
    if len(groups) == 0:
        raise ValueError("stratified_bootstrap needs at least one group")
    out = []
    for j, group in enumerate(groups):
        arr = np.asarray(group, dtype=float)
        if arr.ndim != 1:
            raise ValueError(f"group {j} must be 1-D (runs), got shape {arr.shape}")
        if len(arr) < MIN_RUNS:
            raise ValueError(
                f"group {j} has {len(arr)} run(s); resampling needs at least {MIN_RUNS} "
                "(report the point estimate without an interval instead)"
            )
        if not np.isfinite(arr).all():
            raise ValueError(f"group {j} has non-finite scores; drop them before resampling")
        out.append(arr)
    return out


def resample(groups: Sequence[np.ndarray], n_resamples: int, rng: np.random.Generator) -> list:
    """One stratified draw per resample: runs within each group, group by group -> (B, n_j)."""
    return [g[rng.integers(0, len(g), size=(n_resamples, len(g)))] for g in groups]


def percentile_interval(samples: np.ndarray, confidence: float) -> tuple[np.ndarray, np.ndarray]:
    """Percentile bootstrap interval along axis 0 (Efron & Tibshirani 1993)."""
    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(samples, [tail, 100 - tail], axis=0)
    return low, high


def stratified_bootstrap(
    groups: Sequence[np.ndarray], statistic: Statistic, spec: BootstrapSpec
) -> tuple[np.ndarray, np.ndarray]:
    """(low, high) percentile interval of `statistic` under the stratified bootstrap.

    `groups` are 1-D arrays of finite scores, at least 2 runs each (checked). `statistic`
    maps the resampled groups, each (B, n_j), to (B,) or (B, K) values; the bounds have the
    shape of one value (a scalar array, or (K,)).
    """
    clean = _check_groups(groups)
    rng = np.random.default_rng(spec.seed)
    samples = np.asarray(statistic(resample(clean, spec.n_resamples, rng)))  # (B, ...)
    return percentile_interval(samples, spec.confidence)
