"""Wall-clock axes count from each trial's first learner update; start-up is reported apart.

Hand-worked rows for `analysis.wall_clock`, then two synthetic experiments that differ only in
their trials' start-ups: the compute-matched seconds curves are the same, and the Trials table's
startup_s moves by exactly the added seconds.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis import ReportConfig
from analysis.loading import load_experiment
from analysis.report import Analysis, analyse
from analysis.sections import SECTIONS, compute_matched
from analysis.sections.base import Page
from analysis.sections.trials import blocks as trial_blocks
from analysis.synthetic import SyntheticSpec, write_experiment
from analysis.wall_clock import first_update_s, startup_s, training_seconds
from contract import metrics as mn

CONFIG = ReportConfig(n_resamples=100, curve_resamples=100, make_figures=False)
START = 1000.0
NAN = math.nan


def _trial() -> pd.DataFrame:
    """Step 0 (the initial eval) at +20 s; step 1 took 10 s, 9 of them waiting for its batch
    (the generators starting); steps 2 and 3 took 1 s and 2 s.

    First update began at 1030 - 10 x (1 - 0.9) = 1029: start-up 29 s; the rows sit at
    0 (clipped from -9), 1, 2 and 4 s.
    """
    return pd.DataFrame(
        {
            mn.STEP: [0, 1, 2, 3],
            mn.TIMESTAMP: [START + 20, START + 30, START + 31, START + 33],
            mn.PERF_LEARNER_STEP_S: [NAN, 10.0, 1.0, 2.0],
            mn.PERF_LEARNER_WAIT_FRAC: [NAN, 0.9, 0.1, 0.1],
        }
    )


def test_first_update_leaves_out_the_wait_for_the_first_batch() -> None:
    trial = _trial()
    assert first_update_s(trial) == pytest.approx(START + 29, abs=1e-9)
    assert startup_s(trial, START) == pytest.approx(29.0, abs=1e-9)
    np.testing.assert_allclose(training_seconds(trial), [0.0, 1.0, 2.0, 4.0], atol=1e-9)
    # rows out of step order: the first update is still step 1's
    np.testing.assert_allclose(training_seconds(trial.iloc[::-1]), [4.0, 2.0, 1.0, 0.0], atol=1e-9)


def test_without_step_times_the_first_training_row_is_the_origin() -> None:
    # trials written before perf/learner_step_s: step 1's row itself (1030), start-up 30 s
    trial = _trial().drop(columns=[mn.PERF_LEARNER_STEP_S, mn.PERF_LEARNER_WAIT_FRAC])
    assert startup_s(trial, START) == pytest.approx(30.0, abs=1e-9)
    np.testing.assert_allclose(training_seconds(trial), [0.0, 0.0, 1.0, 3.0], atol=1e-9)


def test_unknown_start_or_no_training_row_gives_nan() -> None:
    assert math.isnan(startup_s(_trial(), NAN))  # trial.json without started_at
    eval_only = _trial().iloc[:1]  # only the initial eval was logged
    assert math.isnan(first_update_s(eval_only)) and math.isnan(startup_s(eval_only, START))
    assert np.isnan(training_seconds(eval_only)).all()


SPEC = SyntheticSpec(
    skill={"gspo": 0.7, "grpo": 0.6}, seeds=(0, 1, 2), lags=(0,), steps=20, eval_every=5
)
LATE = (("gspo", 0, 0, 25.0), ("grpo", 1, 0, 7.0))  # (arm, seed, lag, extra start-up seconds)


def _analysis(spec: SyntheticSpec, tmp: Path) -> Analysis:
    return analyse(load_experiment(write_experiment(tmp, spec)), CONFIG)


def _startup(analysis: Analysis) -> pd.Series:
    s = analysis.summary
    rows = s[(s["section"] == "trials") & (s["statistic"] == "startup_s")]
    return rows.set_index("arm")["value"]


def test_start_ups_move_the_trials_table_not_the_curves(tmp_path: Path) -> None:
    base = _analysis(SPEC, tmp_path / "base")
    late = _analysis(replace(SPEC, startup=LATE), tmp_path / "late")
    # mean over 3 seeds: +25 / 3 s for gspo, +7 / 3 s for grpo (float64 epoch seconds: 1e-6)
    shift = _startup(late) - _startup(base)
    assert shift["gspo"] == pytest.approx(25 / 3, abs=1e-6)
    assert shift["grpo"] == pytest.approx(7 / 3, abs=1e-6)
    assert (_startup(base) > 0).all()  # the step-0 row and the first wait are start-up too

    def curves(analysis: Analysis) -> pd.DataFrame:
        return analysis.parts[SECTIONS.index(compute_matched)].tables["curves"]

    pd.testing.assert_frame_equal(curves(late), curves(base), atol=1e-6, check_exact=False)
    assert (curves(base)["axis"] == "seconds").any()


def test_captions_say_where_the_clock_starts(tmp_path: Path) -> None:
    analysis = _analysis(SPEC, tmp_path)
    page = Page(
        analysis.summary,
        {"compute_matched": tmp_path / "compute_matched.png"},
        CONFIG,
        analysis.inputs.scores,
        analysis.inputs.experiment.problems,
    )
    figure = [b for b in compute_matched.blocks(page) if b.kind == "figure"]
    assert len(figure) == 1 and "first learner update" in figure[0].text
    assert "startup_s" in figure[0].text
    texts = [b.text for b in trial_blocks(page) if b.kind == "p"]
    assert any(t.startswith("startup_s: seconds from a trial's start") for t in texts)
    table = next(b.table for b in trial_blocks(page) if b.kind == "table")
    assert "startup_s" in table.columns
