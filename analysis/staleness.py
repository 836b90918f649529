"""Staleness study: what each lag buys in throughput and utilisation, and costs in score.

Per (arm, lag): learner steps per second, learner wait fraction and generator idle fraction
(mean across seeds with bootstrap intervals), and which lags are Pareto-optimal on
(throughput, final-score IQM): no other lag is at least as good on both and better on one.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.stats import BootstrapSpec, aggregate_interval, iqm
from analysis.summary import interval_row, row
from analysis.trial_scores import by_condition

UTILISATION_METRICS = ("steps_per_s", "learner_wait_frac", "gen_idle_frac")


def pareto_optimal(points: np.ndarray) -> np.ndarray:
    """Mask of rows of (K, 2) `points` not dominated when maximising both columns.

    Row j dominates i when j >= i in both and > in one; rows with a NaN are never optimal.
    """
    points = np.asarray(points, dtype=float)
    ok = np.isfinite(points).all(axis=1)
    mask = np.zeros(len(points), dtype=bool)
    for i in np.flatnonzero(ok):
        others = points[ok]
        dominated = np.any(np.all(others >= points[i], axis=1) & np.any(others > points[i], axis=1))
        mask[i] = not dominated
    return mask


def utilisation_rows(finished: pd.DataFrame, spec: BootstrapSpec) -> list[dict]:
    """Section `staleness`: mean throughput and utilisation fractions per (arm, lag)."""
    rows = []
    for column in UTILISATION_METRICS:
        for (arm, lag), values in by_condition(finished, column).items():
            if len(values) == 0:
                continue
            interval = aggregate_interval(values, "mean", spec)
            rows.append(interval_row("staleness", column, interval, arm=arm, lag=lag))
    return rows


def frontier_table(finished: pd.DataFrame, scored: pd.DataFrame) -> pd.DataFrame:
    """(arm, lag, steps_per_s mean, final-score IQM, within-arm and overall Pareto flags)."""
    speed = {
        k: float(np.mean(v)) if len(v) else np.nan
        for k, v in by_condition(finished, "steps_per_s").items()
    }
    score = {
        k: float(iqm(v)) if len(v) else np.nan
        for k, v in by_condition(scored, "final_score").items()
    }
    keys = sorted(set(speed) | set(score))
    table = pd.DataFrame(
        [(a, lag, speed.get((a, lag), np.nan), score.get((a, lag), np.nan)) for a, lag in keys],
        columns=["arm", "lag", "steps_per_s", "final_iqm"],
    )
    if table.empty:
        return table.assign(pareto_within_arm=[], pareto_overall=[])
    points = table[["steps_per_s", "final_iqm"]].to_numpy()
    table["pareto_overall"] = pareto_optimal(points)
    table["pareto_within_arm"] = False
    for _, idx in table.groupby("arm").groups.items():
        table.loc[idx, "pareto_within_arm"] = pareto_optimal(points[np.asarray(idx)])
    return table


def frontier_rows(frontier: pd.DataFrame) -> list[dict]:
    """Pareto flags as 1/0 rows of section `staleness` (statistic pareto_*)."""
    rows = []
    for r in frontier.itertuples(index=False):
        keys = {"arm": r.arm, "lag": int(r.lag)}
        note = (
            "" if np.isfinite([r.steps_per_s, r.final_iqm]).all() else "throughput or score missing"
        )
        rows.append(
            row("staleness", "pareto_within_arm", float(r.pareto_within_arm), note=note, **keys)
        )
        rows.append(row("staleness", "pareto_overall", float(r.pareto_overall), note=note, **keys))
    return rows


def staleness_rows(finished: pd.DataFrame, scored: pd.DataFrame, spec: BootstrapSpec) -> list[dict]:
    """All staleness-study rows."""
    if finished.empty:
        return []
    return utilisation_rows(finished, spec) + frontier_rows(frontier_table(finished, scored))
