"""Compute-matched curves on hand-made curves: budget axes, interpolation onto a common grid
without extrapolation, and the leader at equal budget."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from analysis.sections.compute_matched import (
    budget_axes,
    interpolate,
    leader_rows,
    matched_curves,
)
from contract import metrics as mn


def test_budget_axes_cumulate_tokens_and_count_time_from_the_first_update() -> None:
    start = 1000.0
    trial = pd.DataFrame(
        {
            mn.STEP: [0, 1, 2, 3],
            # step 0 (the initial eval) 20 s after the start; step 1 waited 9 s of its 10
            mn.TIMESTAMP: [start + 20, start + 30, start + 31, start + 33],
            mn.EVAL_PASS_RATE: [0.1, np.nan, np.nan, 0.4],
            mn.TOKENS_GENERATED: [100.0, np.nan, 300.0, 200.0],  # NaN: none logged = 0
            mn.PERF_LEARNER_STEP_S: [np.nan, 10.0, 1.0, 2.0],
            mn.PERF_LEARNER_WAIT_FRAC: [np.nan, 0.9, 0.1, 0.1],
        }
    )
    axes = budget_axes(trial)
    # cumulative tokens 100, 100, 400, 600 -> at the evals (steps 0 and 3): 100 and 600
    np.testing.assert_array_equal(axes["tokens"], [100.0, 600.0])
    # the first update began at 1030 - 10 x (1 - 0.9) = 1029: step 3 at 1033 - 1029 = 4 s; the
    # step-0 eval scores the initial weights, at 0 s
    np.testing.assert_allclose(axes["seconds"], [0.0, 4.0], rtol=1e-12)
    np.testing.assert_array_equal(axes["step"], [0.0, 3.0])
    np.testing.assert_array_equal(axes["value"], [0.1, 0.4])
    # no step times logged (older trials): from step 1's row, 1033 - 1030 = 3 s; no tokens
    # column: NaN tokens
    legacy = budget_axes(
        trial.drop(columns=[mn.TOKENS_GENERATED, mn.PERF_LEARNER_STEP_S, mn.PERF_LEARNER_WAIT_FRAC])
    )
    np.testing.assert_array_equal(legacy["seconds"], [0.0, 3.0])
    assert legacy["tokens"].isna().all()


def test_interpolation_stops_at_the_shortest_curve() -> None:
    curves = {
        "a": (np.array([0.0, 10.0, 20.0]), np.array([0.0, 0.5, 1.0])),
        "b": (np.array([5.0, 15.0]), np.array([0.2, 0.4])),
    }
    grid, values = interpolate(curves, points=3)
    # common range [max first x, min last x] = [5, 15]: b never reached 20, so no grid point
    # goes past 15 (a's 1.0 at x = 20 is never compared) and none before 5.
    np.testing.assert_array_equal(grid, [5.0, 10.0, 15.0])
    np.testing.assert_allclose(values["a"], [0.25, 0.5, 0.75], atol=1e-12)  # on a's line
    np.testing.assert_allclose(values["b"], [0.2, 0.3, 0.4], atol=1e-12)


def test_repeated_budget_keeps_the_last_score_and_disjoint_curves_give_no_grid() -> None:
    # x = 10 twice (a step that generated no tokens): the later eval (0.4) stands
    grid, values = interpolate(
        {"a": (np.array([0.0, 10.0, 10.0, 20.0]), np.array([0, 0.2, 0.4, 0.6]))}, 3
    )
    np.testing.assert_allclose(values["a"], [0.0, 0.4, 0.6], atol=1e-12)
    grid, values = interpolate(
        {
            "a": (np.array([0.0, 1.0]), np.array([0.1, 0.2])),
            "b": (np.array([2.0, 3.0]), np.array([0.3, 0.4])),
        }
    )
    assert len(grid) == 0 and all(len(v) == 0 for v in values.values())


def test_matched_curves_share_a_grid_per_lag() -> None:
    rows = []
    for arm, seed, xs, ys in [
        ("gspo", 0, [0, 100, 200], [0.0, 0.4, 0.8]),
        ("grpo", 0, [0, 50, 150], [0.0, 0.1, 0.3]),
    ]:
        for x, y in zip(xs, ys, strict=True):
            rows.append(
                {
                    "arm": arm,
                    "lag": 0,
                    "trial_name": f"{arm}{seed}",
                    "seed": seed,
                    "axis": "tokens",
                    "x": x,
                    "value": y,
                }
            )
    matched = matched_curves(pd.DataFrame(rows), points=4)
    # common range [0, 150]: grid 0, 50, 100, 150
    gspo = matched[matched["arm"] == "gspo"]
    np.testing.assert_array_equal(gspo["x"], [0.0, 50.0, 100.0, 150.0])
    np.testing.assert_allclose(gspo["value"], [0.0, 0.2, 0.4, 0.6], atol=1e-12)
    grpo = matched[matched["arm"] == "grpo"]
    np.testing.assert_allclose(grpo["value"], [0.0, 0.1, 0.2, 0.3], atol=1e-12)


def test_leader_at_each_budget_and_interval_overlap() -> None:
    grid = [0.0, 1.0, 2.0, 3.0, 4.0]  # budgets 0.25, 0.5, 1.0 -> grid points 1, 2, 4
    agg = pd.DataFrame(
        [
            ("tokens", 0, "a", x, iqm, iqm - 0.05, iqm + 0.05, 3)
            for x, iqm in zip(grid, [0.1, 0.2, 0.3, 0.4, 0.5], strict=True)
        ]
        + [
            ("tokens", 0, "b", x, iqm, iqm - 0.05, iqm + 0.05, 3)
            for x, iqm in zip(grid, [0.1, 0.25, 0.25, 0.3, 0.3], strict=True)
        ],
        columns=["axis", "lag", "arm", "x", "iqm", "low", "high", "n"],
    )
    rows = pd.DataFrame(leader_rows(agg))
    leaders = rows[rows["statistic"] == "leader_iqm"].reset_index(drop=True)
    # x = 1: b 0.25 [0.20, 0.30] leads a 0.2 [0.15, 0.25]: overlap
    # x = 2: b 0.25 [0.20, 0.30] vs a 0.3 [0.25, 0.35]: a leads, overlap
    # x = 4: a 0.5 [0.45, 0.55] vs b 0.3 [0.25, 0.35]: a leads, no overlap
    assert list(leaders["arm"]) == ["b", "a", "a"]
    np.testing.assert_allclose(leaders["value"], [0.25, 0.3, 0.5], atol=1e-12)
    assert list(leaders["note"]) == [
        "runner-up a; intervals overlap",
        "runner-up b; intervals overlap",
        "runner-up b; intervals do not overlap",
    ]
    assert leaders["comparison"].iloc[2] == "tokens: 1.00 of common range (4)"
    runner = rows[rows["statistic"] == "runner_up_iqm"]
    assert runner["value"].iloc[2] == pytest.approx(0.3)
