"""Kaplan-Meier estimate of time to a pass-rate threshold, with censored trials.

A trial that never reaches the threshold (or diverges first) is right-censored at its last eval:
we only know its time exceeds that. Dropping such trials, or scoring them at the step budget,
biases the median towards fast arms (Kaplan & Meier 1958). The product-limit estimator is

    S(t) = prod_{t_i <= t} (1 - d_i / n_i)

with d_i events at time t_i and n_i trials still at risk (time >= t_i). At tied times events
are counted before censorings, the usual convention (Kalbfleisch & Prentice 2002, sec. 1.4).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class KaplanMeier:
    """Step function S(t) at the distinct event times (right-continuous)."""

    times: np.ndarray  # (K,) distinct event times, ascending
    survival: np.ndarray  # (K,) S(t) just after each event time
    at_risk: np.ndarray  # (K,) n_i
    events: np.ndarray  # (K,) d_i


def kaplan_meier(durations: np.ndarray, observed: np.ndarray) -> KaplanMeier:
    """Product-limit estimator; `observed[i]` is False for a censored duration."""
    durations = np.asarray(durations, dtype=float)
    observed = np.asarray(observed, dtype=bool)
    keep = np.isfinite(durations)
    durations, observed = durations[keep], observed[keep]
    times = np.unique(durations[observed])
    at_risk = np.array([(durations >= t).sum() for t in times], dtype=float)
    events = np.array([(observed & (durations == t)).sum() for t in times], dtype=float)
    survival = np.cumprod(1.0 - events / at_risk) if len(times) else np.array([], dtype=float)
    return KaplanMeier(times, survival, at_risk, events)


def survival_at(km: KaplanMeier, t: float) -> float:
    """S(t): 1 before the first event, then the value after the last event time <= t."""
    idx = np.searchsorted(km.times, t, side="right")
    return 1.0 if idx == 0 else float(km.survival[idx - 1])


def median_time(km: KaplanMeier) -> float | None:
    """Smallest t with S(t) <= 0.5, or None ("not reached") when S stays above one half."""
    hit = np.flatnonzero(km.survival <= 0.5)
    return float(km.times[hit[0]]) if len(hit) else None
