"""Training stability per arm: divergence rates, gradient spikes, KL, clipping, time to threshold.

Divergence is a count of k events in N trials: the Wilson score interval (Wilson 1927) keeps
sensible coverage at the tiny N and k = 0 or N typical here, where the Wald interval collapses
to zero width (Brown, Cai & DasGupta 2001). Arms are compared with Fisher's exact test, pooled
over lags. Time to threshold uses the Kaplan-Meier estimator (analysis.survival).
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd
from statsmodels.stats.proportion import proportion_confint

from analysis.significance import fisher, holm
from analysis.stats import BootstrapSpec, aggregate_interval
from analysis.summary import interval_row, row
from analysis.survival import kaplan_meier, median_time
from analysis.trial_scores import by_condition

STABILITY_METRICS = ("grad_spike_rate", "max_kl_old", "clip_frac_mean")


def wilson(k: int, n: int, confidence: float) -> tuple[float, float]:
    """Wilson score interval for k successes in n trials (statsmodels `proportion_confint`)."""
    if n == 0:
        return math.nan, math.nan
    low, high = proportion_confint(k, n, alpha=1 - confidence, method="wilson")
    return float(low), float(high)


def _rate_row(
    section: str, statistic: str, k: int, n: int, confidence: float, **keys: object
) -> dict:
    low, high = wilson(k, n, confidence)
    value = k / n if n else math.nan
    return row(section, statistic, value, ci_low=low, ci_high=high, n=n, note=f"{k}/{n}", **keys)


def divergence_rows(finished: pd.DataFrame, confidence: float) -> list[dict]:
    """Section `divergence`: diverged fraction k/N per arm (all lags) and per (arm, lag)."""
    rows = []
    for arm, group in finished.groupby("arm", sort=True):
        k, n = int(group["diverged"].sum()), len(group)
        rows.append(_rate_row("divergence", "diverged_frac", k, n, confidence, arm=arm))
        for lag, cell in group.groupby("lag", sort=True):
            k, n = int(cell["diverged"].sum()), len(cell)
            rows.append(
                _rate_row("divergence", "diverged_frac", k, n, confidence, arm=arm, lag=int(lag))
            )
    return rows


def fisher_rows(finished: pd.DataFrame, alpha: float) -> list[dict]:
    """Section `divergence_tests`: Fisher's exact test for every arm pair, Holm-adjusted."""
    counts = finished.groupby("arm", sort=True)["diverged"].agg(["sum", "count"])
    rows = []
    for x, y in itertools.combinations(counts.index, 2):
        kx, nx = int(counts.loc[x, "sum"]), int(counts.loc[x, "count"])
        ky, ny = int(counts.loc[y, "sum"]), int(counts.loc[y, "count"])
        result = fisher(kx, nx, ky, ny, alpha)
        note = f"{kx}/{nx} vs {ky}/{ny}" + (f"; {result.note}" if result.note else "")
        rows.append(
            row(
                "divergence_tests",
                "fisher_p",
                result.p_value,
                comparison=f"{x} vs {y}",
                n=nx + ny,
                note=note,
            )
        )
    adjusted = holm(np.array([r["value"] for r in rows]))
    holm_note = f"Holm over {int(np.isfinite(adjusted).sum())} comparisons"
    rows += [
        {**r, "statistic": "fisher_p_holm", "value": float(p), "note": holm_note}
        for r, p in zip(rows, adjusted, strict=True)
    ]
    return rows


def metric_rows(finished: pd.DataFrame, spec: BootstrapSpec) -> list[dict]:
    """Section `stability`: mean across seeds of spike rate, max KL and mean clip fraction."""
    rows = []
    for column in STABILITY_METRICS:
        for (arm, lag), values in by_condition(finished, column).items():
            if len(values) == 0:
                continue
            interval = aggregate_interval(values, "mean", spec)
            rows.append(interval_row("stability", column, interval, arm=arm, lag=lag))
    return rows


def threshold_rows(finished: pd.DataFrame, threshold: float, confidence: float) -> list[dict]:
    """Section `time_to_threshold`: Kaplan-Meier median steps and the fraction that got there."""
    rows = []
    timed = finished[np.isfinite(finished["time_to_threshold"].to_numpy(dtype=float))]
    for (arm, lag), cell in timed.groupby(["arm", "lag"], sort=True):
        km = kaplan_meier(cell["time_to_threshold"], cell["reached_threshold"].astype(bool))
        median = median_time(km)
        k, n = int(cell["reached_threshold"].sum()), len(cell)
        note = "" if median is not None else f"median not reached (pass rate >= {threshold:g})"
        keys = {"arm": str(arm), "lag": int(lag)}
        rows.append(
            row(
                "time_to_threshold",
                "median_steps",
                math.nan if median is None else median,
                n=n,
                note=note,
                **keys,
            )
        )
        reached = _rate_row("time_to_threshold", "reached_frac", k, n, confidence, **keys)
        rows.append({**reached, "note": f"{k}/{n} reached"})
    return rows


def stability_rows(
    finished: pd.DataFrame, spec: BootstrapSpec, alpha: float, threshold: float
) -> list[dict]:
    """All stability sections for trials that ran to an end (completed or diverged)."""
    if finished.empty:
        return []
    return (
        divergence_rows(finished, spec.confidence)
        + fisher_rows(finished, alpha)
        + metric_rows(finished, spec)
        + threshold_rows(finished, threshold, spec.confidence)
    )
