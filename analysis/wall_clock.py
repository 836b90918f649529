"""A trial's wall clock: when its first learner update began, and the start-up before it.

Every metric row carries `timestamp`, the epoch second the learner recorded the step (right
after its update, `learner.runtime.loop`); the step-0 row, the eval of the initial weights, is
written before the first step. A trial's first seconds are start-up, not training: processes
spawn, the model loads, the initial eval runs, and the first step waits for its batch while the
generators start (7 to 50 s on the quickstart's CPU runs, against about 0.1 s for a later step's
wait). Start-up differs per trial (a warm cache, a loaded machine) and says nothing about the
arm, so wall-clock axes count from the first update instead, and the start-up is reported on
its own (the Trials table).

The first update begins when the first step's batch is in hand: the first training row's
timestamp less the seconds that step spent after its wait, `perf/learner_step_s x (1 -
perf/learner_wait_frac)` (its update and publish). Without those metrics (trials written before
them), the row's timestamp itself: the first update then counts as start-up.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from contract import metrics as mn


def _value(row: pd.Series, column: str) -> float:
    """A finite metric of one row, or NaN (absent or unmeasured)."""
    value = float(row[column]) if column in row.index else math.nan
    return value if math.isfinite(value) else math.nan


def first_update_s(trial: pd.DataFrame) -> float:
    """Epoch seconds at which the trial's first learner update began (module docstring); NaN
    when no training row (step >= 1) has a timestamp."""
    if mn.TIMESTAMP not in trial.columns or mn.STEP not in trial.columns:
        return math.nan
    rows = trial[(trial[mn.STEP] >= 1) & np.isfinite(trial[mn.TIMESTAMP].to_numpy(dtype=float))]
    if rows.empty:
        return math.nan
    first = rows.sort_values(mn.STEP).iloc[0]
    after_wait = _value(first, mn.PERF_LEARNER_STEP_S) * (
        1.0 - _value(first, mn.PERF_LEARNER_WAIT_FRAC)
    )
    return float(first[mn.TIMESTAMP]) - (after_wait if math.isfinite(after_wait) else 0.0)


def startup_s(trial: pd.DataFrame, started_s: float) -> float:
    """Seconds from the trial's start (trial.json `started_at`) to its first update; NaN when
    either is unknown."""
    return first_update_s(trial) - started_s if math.isfinite(started_s) else math.nan


def training_seconds(trial: pd.DataFrame) -> np.ndarray:
    """Per row of `trial` (in its order): seconds since the first update began, 0 for rows
    before it (the step-0 eval: the initial weights hold until the first update); NaN without a
    first update or a timestamp."""
    stamps = trial[mn.TIMESTAMP].to_numpy(dtype=float)
    return np.maximum(stamps - first_update_s(trial), 0.0)
