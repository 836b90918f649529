"""Final score and area under the eval curve per (arm, lag), as IQM and mean with intervals.

Per-condition intervals bootstrap seeds; the per-arm "all lags" row is the stratified bootstrap
of Agarwal et al. 2021 (each lag is a stratum, its seeds resampled within it).
"""

from __future__ import annotations

import pandas as pd

from analysis.stats import BootstrapSpec, aggregate_interval, stratified_interval
from analysis.summary import interval_row
from analysis.trial_scores import by_condition

SCORE_SECTIONS = {"final_score": "final_score", "auc": "auc"}
ALL_LAGS = "all lags (stratified)"


def condition_rows(scored: pd.DataFrame, column: str, spec: BootstrapSpec) -> list[dict]:
    """IQM and mean of `column` across seeds for every (arm, lag)."""
    rows = []
    for (arm, lag), values in by_condition(scored, column).items():
        for aggregate in ("iqm", "mean"):
            interval = aggregate_interval(values, aggregate, spec)
            rows.append(interval_row(column, aggregate, interval, arm=arm, lag=lag))
    return rows


def stratified_rows(scored: pd.DataFrame, column: str, spec: BootstrapSpec) -> list[dict]:
    """Per arm, IQM and mean pooled over lags with lag-stratified intervals (>1 lag only)."""
    if scored["lag"].nunique() < 2:
        return []
    rows = []
    cells = by_condition(scored, column)
    for arm in sorted({a for a, _ in cells}):
        strata = [values for (a, _), values in cells.items() if a == arm]
        for aggregate in ("iqm", "mean"):
            interval = stratified_interval(strata, aggregate, spec)
            rows.append(interval_row(column, aggregate, interval, arm=arm, comparison=ALL_LAGS))
    return rows


def performance_rows(scored: pd.DataFrame, spec: BootstrapSpec) -> list[dict]:
    """Summary rows of sections `final_score` and `auc`."""
    rows: list[dict] = []
    if scored.empty:
        return rows
    for column in SCORE_SECTIONS:
        rows += condition_rows(scored, column, spec)
        rows += stratified_rows(scored, column, spec)
    return rows
