"""Per-trial scalars against hand-worked values."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.dataset as ds
import pytest

from analysis.config import ReportConfig
from analysis.loading import load_experiment
from analysis.synthetic import SyntheticSpec, write_experiment
from analysis.trial_scores import (
    area_under_curve,
    detect_spikes,
    diverged_curve,
    final_score,
    grad_spike_rate,
    learner_steps_per_s,
    score_trial,
    score_trials,
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


def _diverging_trial() -> pd.DataFrame:
    """Rows 0..25 with evals 0.2, 0.4, 0.6 at steps 0, 10, 20; the update after 25 diverged."""
    evals = np.full(26, np.nan)
    evals[[0, 10, 20]] = [0.2, 0.4, 0.6]
    steps = np.arange(26)
    return pd.DataFrame({mn.STEP: steps, mn.TIMESTAMP: steps * 2.0, mn.EVAL_PASS_RATE: evals})


def test_diverged_curve_drops_to_zero_until_the_planned_end() -> None:
    steps, values = diverged_curve(np.array([0.0, 10, 20]), np.array([0.2, 0.4, 0.6]), 25, 60)
    assert steps.tolist() == [0, 10, 20, 26, 60] and values.tolist() == [0.2, 0.4, 0.6, 0, 0]
    # Unknown plan: the curve ends at the drop.
    steps, values = diverged_curve(np.array([0.0, 10]), np.array([0.2, 0.4]), 15, math.nan)
    assert steps.tolist() == [0, 10, 16] and values.tolist() == [0.2, 0.4, 0]


def test_diverged_trial_scores_no_better_than_it_ran() -> None:
    """Trapezoids of the extended curve (0, .2) (10, .4) (20, .6) (26, 0) (60, 0):
    10 x (0.2 + 0.4) / 2 + 10 x (0.4 + 0.6) / 2 + 6 x 0.6 / 2 + 34 x 0 = 3 + 5 + 1.8 = 9.8,
    over the planned span 60: AUC = 0.163333. Before the fix it kept AUC = 8 / 20 = 0.4 over
    its own span and final score (0.2 + 0.4 + 0.6) / 3 = 0.4; now its final policy (diverged)
    scores 0.
    """
    config = ReportConfig()
    trial = _diverging_trial()
    scored = score_trial(trial, config, diverged=True, steps_planned=60.0)
    assert scored["final_score"] == 0.0
    assert scored["auc"] == pytest.approx(9.8 / 60, abs=1e-12)
    assert scored["n_evals"] == 3 and scored["time_to_threshold"] == 20.0  # censored, as before
    healthy = score_trial(trial, config)  # the same rows, not diverged: scored as they ran
    assert healthy["final_score"] == pytest.approx(0.4) and healthy["auc"] == pytest.approx(0.4)
    unplanned = score_trial(trial, config, diverged=True)  # no steps_planned: span ends at 26
    assert unplanned["auc"] == pytest.approx(9.8 / 26, abs=1e-12)


def test_score_trials_applies_the_divergence_rule(tmp_path: Path) -> None:
    # 20 planned steps, evals every 10; seed 1 logged steps 0..12 then diverged.
    spec = SyntheticSpec(
        skill={"gspo": 0.7},
        seeds=(0, 1),
        lags=(0,),
        steps=20,
        eval_every=10,
        diverged=(("gspo", 1, 0, 12),),
    )
    root = write_experiment(tmp_path, spec)
    scores = score_trials(load_experiment(root), ReportConfig()).set_index("seed")
    table = ds.dataset(root / "trials" / "gspo-s1-lag0" / "metrics.parquet").to_table()
    v0, v10 = table.to_pandas()[mn.EVAL_PASS_RATE].dropna().to_numpy()
    # Curve (0, v0) (10, v10) (13, 0) (20, 0): area 10 (v0 + v10) / 2 + 3 v10 / 2, span 20.
    assert scores.loc[1, "auc"] == pytest.approx((5 * (v0 + v10) + 1.5 * v10) / 20, abs=1e-12)
    assert scores.loc[1, "final_score"] == 0.0 and bool(scores.loc[1, "scored"])
    assert scores.loc[0, "final_score"] > 0  # the completed seed keeps its own evals
    excluded = score_trials(load_experiment(root), ReportConfig(diverged_scores="exclude"))
    assert excluded.set_index("seed")["scored"].tolist() == [True, False]


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


def _peaking_trial(evals: list[float]) -> pd.DataFrame:
    """One eval every 10 steps, from step 0."""
    steps = np.arange(10 * (len(evals) - 1) + 1)
    column = np.full(len(steps), np.nan)
    column[::10] = evals
    return pd.DataFrame({mn.STEP: steps, mn.TIMESTAMP: steps * 1.0, mn.EVAL_PASS_RATE: column})


def test_collapse_is_a_fall_from_the_trials_own_peak() -> None:
    # Evals 0.4, 0.8, 0.7, 0.5, 0.6: final (last 3) = 0.6, peak 0.8, drop 0.2.
    trial = _peaking_trial([0.4, 0.8, 0.7, 0.5, 0.6])
    scores = score_trial(trial, ReportConfig())
    assert scores["peak_score"] == 0.8
    assert scores["peak_drop"] == pytest.approx(0.2)
    assert scores["collapsed"] == 1.0  # 0.2 > 0.15, the default
    assert score_trial(trial, ReportConfig(collapse_drop=0.25))["collapsed"] == 0.0
    # Still climbing: the peak is one of the last evals, the drop is small, no collapse.
    rising = score_trial(_peaking_trial([0.2, 0.4, 0.6, 0.7, 0.65]), ReportConfig())
    assert rising["peak_drop"] == pytest.approx(0.7 - (0.6 + 0.7 + 0.65) / 3)
    assert rising["collapsed"] == 0.0
    # Diverged: scored 0, so a trial that had reached 0.6 collapsed; one that never got above
    # the threshold did not (there was nothing to lose).
    assert score_trial(_diverging_trial(), ReportConfig(), diverged=True)["collapsed"] == 1.0
    low = _peaking_trial([0.1, 0.12, 0.1])
    assert score_trial(low, ReportConfig(), diverged=True)["collapsed"] == 0.0
    # No evals: nothing to judge.
    empty = score_trial(pd.DataFrame({mn.STEP: [0, 1], mn.TIMESTAMP: [0.0, 1.0]}), ReportConfig())
    assert math.isnan(empty["collapsed"]) and math.isnan(empty["peak_score"])


def test_collapse_drop_is_validated_by_name() -> None:
    for bad in (0.0, 1.5):
        with pytest.raises(ValueError, match="collapse_drop"):
            ReportConfig(collapse_drop=bad)
