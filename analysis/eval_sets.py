"""Scores per eval set, and aggregates across eval sets (sections of the summary).

Per trial and eval set: the final score (mean of the last K evals, as for the primary score) of
each measured score (greedy pass rate, sampled pass@1, pass@k) and the AUC of the greedy curve.
A diverged trial is scored as in `trial_scores.score_trial`: final 0, greedy AUC over the planned
span with 0 after divergence. Across seeds: IQM with a bootstrap interval per eval set; across
eval sets: IQM / mean / median / optimality gap on the runs x eval-sets matrix with a bootstrap
stratified by eval set, performance profiles, and PoI averaged over eval sets
(analysis.aggregates).
"""

from __future__ import annotations

import itertools
import math
import re

import numpy as np
import pandas as pd

from analysis.aggregates import (
    AGGREGATE_NAMES,
    performance_profile,
    poi_interval_tasks,
    stratified_aggregate,
)
from analysis.config import ReportConfig
from analysis.eval_tables import EVAL_SET, GREEDY, PASS1, STEP, eval_set_names, is_pass_at_k
from analysis.stats import BootstrapSpec, aggregate_interval
from analysis.summary import interval_row
from analysis.trial_scores import area_under_curve, diverged_curve, final_score

HEADLINE = "final_greedy"  # the score the aggregates, profiles and PoI across eval sets use
AGGREGATED = ("final_greedy", "auc_greedy", "final_pass1")
TAUS = np.round(np.linspace(0.0, 1.0, 21), 2)  # performance-profile grid, step 0.05
TABLE_TAUS = (0.25, 0.5, 0.75)  # the profile points the report's table shows


def score_name(column: str) -> str:
    """`greedy_pass_rate` -> `final_greedy`, `pass1_sampled` -> `final_pass1`, `pass_at_k` kept."""
    if column == GREEDY:
        return "final_greedy"
    if column == PASS1:
        return "final_pass1"
    return f"final_{column}"


def tau_statistic(tau: float) -> str:
    return f"above_{tau:.2f}"


def _trial_set_scores(
    rows: pd.DataFrame, last_k: int, diverged: bool, last_step: float, planned: float
) -> dict[str, float]:
    out: dict[str, float] = {}
    for column in [c for c in rows.columns if c in (GREEDY, PASS1) or is_pass_at_k(c)]:
        measured = rows[np.isfinite(rows[column].to_numpy(dtype=float))]
        values = measured[column].to_numpy(dtype=float)
        out[score_name(column)] = 0.0 if diverged and len(values) else final_score(values, last_k)
        if column == GREEDY:
            steps = measured[STEP].to_numpy(dtype=float)
            if diverged and len(values):
                steps, values = diverged_curve(steps, values, last_step, planned)
            out["auc_greedy"] = area_under_curve(steps, values)
    return out


def eval_set_scores(
    evals: pd.DataFrame, scored: pd.DataFrame, config: ReportConfig
) -> pd.DataFrame:
    """One row per (scored trial, eval set): arm, lag, seed, trial_name, eval_set, scores."""
    if evals.empty or scored.empty:
        return pd.DataFrame(columns=["arm", "lag", "seed", "trial_name", EVAL_SET])
    info = scored.set_index("trial_name")
    out = []
    for (name, eval_set), rows in evals[evals["trial_name"].isin(info.index)].groupby(
        ["trial_name", EVAL_SET], sort=False
    ):
        trial = info.loc[name]
        planned = math.nan if pd.isna(trial["steps_planned"]) else float(trial["steps_planned"])
        scores = _trial_set_scores(
            rows.sort_values(STEP),
            config.last_k_evals,
            bool(trial["diverged"]),
            float(trial["last_step"]),
            planned,
        )
        keys = {"arm": trial["arm"], "lag": int(trial["lag"]), "seed": trial["seed"]}
        out.append({**keys, "trial_name": name, EVAL_SET: str(eval_set), **scores})
    return pd.DataFrame(out)


def set_score_columns(per_set: pd.DataFrame) -> list[str]:
    """Score columns of `eval_set_scores`, greedy first and pass@k by k."""
    names = [c for c in per_set.columns if c.startswith(("final_", "auc_"))]
    order = {"final_greedy": 0, "auc_greedy": 1, "final_pass1": 2}

    def key(name: str) -> tuple[int, int]:
        k = re.search(r"_(\d+)$", name)
        return order.get(name, 3), int(k.group(1)) if k else 0

    return sorted(names, key=key)


def per_set_rows(per_set: pd.DataFrame, spec: BootstrapSpec) -> list[dict]:
    """Section `eval_set_scores`: IQM across seeds of each score, per (arm, lag, eval set)."""
    rows = []
    sets = eval_set_names(per_set)
    for (arm, lag), cell in per_set.groupby(["arm", "lag"], sort=True):
        for eval_set in sets:
            part = cell[cell[EVAL_SET] == eval_set]
            for column in set_score_columns(per_set):
                if column not in part or part[column].isna().all():
                    continue
                interval = aggregate_interval(part[column].to_numpy(dtype=float), "iqm", spec)
                rows.append(
                    interval_row(
                        "eval_set_scores",
                        column,
                        interval,
                        arm=str(arm),
                        lag=int(lag),
                        comparison=eval_set,
                    )
                )
    return rows


def task_matrix(cell: pd.DataFrame, column: str, sets: list[str]) -> list[np.ndarray]:
    """Per-eval-set arrays of `column` over the cell's seeds (a seed run twice counts once)."""
    wide = cell.pivot_table(index="seed", columns=EVAL_SET, values=column, aggfunc="mean")
    return [
        wide[s].to_numpy(dtype=float) if s in wide.columns else np.array([], dtype=float)
        for s in sets
    ]


def _strata_note(sets: list[str]) -> str:
    return f"strata: {len(sets)} eval sets ({', '.join(sets)})"


def aggregate_rows(per_set: pd.DataFrame, spec: BootstrapSpec) -> list[dict]:
    """Section `eval_aggregate`: IQM, mean, median, optimality gap across eval sets.

    One row per (arm, lag, score); `comparison` names the score, `n` counts seeds.
    """
    rows, sets = [], eval_set_names(per_set)
    for (arm, lag), cell in per_set.groupby(["arm", "lag"], sort=True):
        for column in AGGREGATED:
            if column not in cell or cell[column].isna().all():
                continue
            tasks = task_matrix(cell, column, sets)
            for name in AGGREGATE_NAMES:
                interval = stratified_aggregate(tasks, name, spec)
                note = interval.note or _strata_note(sets)
                r = interval_row(
                    "eval_aggregate",
                    name,
                    interval,
                    arm=str(arm),
                    lag=int(lag),
                    comparison=column,
                )
                rows.append({**r, "note": note})
    return rows


def profile_rows(per_set: pd.DataFrame, spec: BootstrapSpec) -> list[dict]:
    """Section `performance_profile`: fraction of runs (x eval sets) with final greedy > tau."""
    rows, sets = [], eval_set_names(per_set)
    for (arm, lag), cell in per_set.groupby(["arm", "lag"], sort=True):
        tasks = task_matrix(cell, HEADLINE, sets)
        for tau, interval in zip(TAUS, performance_profile(tasks, TAUS, spec), strict=True):
            rows.append(
                interval_row(
                    "performance_profile",
                    tau_statistic(float(tau)),
                    interval,
                    arm=str(arm),
                    lag=int(lag),
                )
            )
    return rows


def poi_rows_across_sets(per_set: pd.DataFrame, spec: BootstrapSpec) -> list[dict]:
    """Section `poi_eval_sets`: PoI of X over Y per lag, averaged over eval sets."""
    rows, sets = [], eval_set_names(per_set)
    for lag, at_lag in per_set.groupby("lag", sort=True):
        arms = sorted(at_lag["arm"].unique())
        for x, y in itertools.combinations(arms, 2):
            for column in ("final_greedy", "auc_greedy"):
                tx = task_matrix(at_lag[at_lag["arm"] == x], column, sets)
                ty = task_matrix(at_lag[at_lag["arm"] == y], column, sets)
                interval = poi_interval_tasks(tx, ty, spec)
                r = interval_row(
                    "poi_eval_sets", column, interval, lag=int(lag), comparison=f"{x} vs {y}"
                )
                rows.append({**r, "note": interval.note or _strata_note(sets)})
    return rows


def eval_set_rows(per_set: pd.DataFrame, spec: BootstrapSpec) -> list[dict]:
    """Every eval-set section; empty when nothing was scored.

    With a single eval set only the per-set scores (they add pass@1 and pass@k): aggregates,
    profiles and PoI across one set would repeat the final-score and PoI sections.
    """
    if per_set.empty:
        return []
    rows = per_set_rows(per_set, spec)
    if len(eval_set_names(per_set)) > 1:
        rows += aggregate_rows(per_set, spec)
        rows += profile_rows(per_set, spec)
        rows += poi_rows_across_sets(per_set, spec)
    return rows
