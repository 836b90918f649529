"""Per-trial scalars against hand-worked values."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from analysis.trial_scores import (
    area_under_curve,
    detect_spikes,
    final_score,
    grad_spike_rate,
    learner_steps_per_s,
    time_to_threshold,
)
from contract import metrics as mn


def test_final_score_last_k() -> None:
    values = np.array([0.1, 0.2, 0.4, 0.6, 0.8])
    assert final_score(values, 3) == pytest.approx(0.6)  # (0.4 + 0.6 + 0.8) / 3
    assert final_score(values[:2], 3) == pytest.approx(0.15)  # fewer evals than K: all of them
    assert math.isnan(final_score(np.array([]), 3))


def test_area_under_curve_is_mean_pass_rate() -> None:
    # Trapezoids: 10 * (0 + 0.5) / 2 + 10 * (0.5 + 1) / 2 = 10; span 20 -> 0.5.
    assert area_under_curve(np.array([0.0, 10, 20]), np.array([0.0, 0.5, 1.0])) == 0.5
    # Uneven spacing: 10 * (0.2 + 0.2) / 2 + 30 * (0.2 + 0.6) / 2 = 2 + 12 = 14; / 40 = 0.35.
    assert area_under_curve(np.array([0.0, 10, 40]), np.array([0.2, 0.2, 0.6])) == pytest.approx(
        0.35
    )
    assert area_under_curve(np.array([5.0]), np.array([0.3])) == 0.3


def test_time_to_threshold_and_censoring() -> None:
    steps, values = np.array([0.0, 10, 20, 30]), np.array([0.1, 0.4, 0.55, 0.3])
    assert time_to_threshold(steps, values, 0.5) == (20.0, True)
    assert time_to_threshold(steps, values, 0.9) == (30.0, False)  # censored at the last eval


def test_steps_per_s_prefers_median_step_time() -> None:
    trial = pd.DataFrame(
        {
            mn.STEP: [0, 1, 2],
            mn.TIMESTAMP: [0.0, 1.0, 2.0],
            mn.PERF_LEARNER_STEP_S: [100.0, 2.0, 2.0],  # a slow first (compile) step
        }
    )
    assert learner_steps_per_s(trial) == pytest.approx(0.5)  # 1 / median 2 s
    # Without step times: 10 steps over 20 s of wall time.
    wall = pd.DataFrame({mn.STEP: [0, 10], mn.TIMESTAMP: [100.0, 120.0]})
    assert learner_steps_per_s(wall) == pytest.approx(0.5)


def test_spike_detection_and_logged_counts() -> None:
    norms = np.array([1.0, 1.0, 1.2, 0.9, 50.0, 1.0, np.inf])
    # Step 4: 50 > 10 x median(1, 1, 1.2, 0.9) = 10; step 5: 1 < 10 x median(...) ; inf counts.
    assert detect_spikes(norms, 10.0, 20).tolist() == [
        False,
        False,
        False,
        False,
        True,
        False,
        True,
    ]
    trial = pd.DataFrame({mn.OPTIM_GRAD_NORM: norms[:6]})
    assert grad_spike_rate(trial, 10.0, 20) == pytest.approx(1 / 6)
    logged = pd.DataFrame({mn.OPTIM_GRAD_SPIKES: [0.0, 0.0, 2.0, np.nan], mn.OPTIM_GRAD_NORM: 1.0})
    assert grad_spike_rate(logged, 10.0, 20) == pytest.approx(2 / 3)  # learner's own counts win
