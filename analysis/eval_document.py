"""Report sections for eval sets, compute-matched comparisons and what to do next."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from analysis.eval_sets import TABLE_TAUS, tau_statistic
from analysis.render import Block, wide_table

METHODS = [
    "Across eval sets (Agarwal et al. 2021; rliable): each (arm, lag) has a seeds x eval-sets "
    "matrix of final greedy scores; IQM over all entries, mean and median of the per-set means, "
    "optimality gap 1 - mean(min(score, 1)); percentile intervals from a bootstrap stratified "
    "by eval set (seeds resampled with replacement within each eval set, each set "
    "independently). Performance profile: mean over eval sets of the fraction of seeds scoring "
    "above tau, with the same bootstrap. PoI across eval sets: mean over sets of P(X > Y) + "
    "0.5 P(X = Y), X and Y resampled apart within each set.",
    "Compute-matched curves: each trial's primary eval curve against learner steps, cumulative "
    "generated tokens (`tokens/generated`, trained and dropped groups) and seconds since the "
    "trial started (the step-0 eval of the initial weights at 0 s), linearly interpolated "
    "onto a grid per lag that spans only the budget every compared trial reached (no "
    "extrapolation); IQM across seeds with bootstrap bands. "
    "Diverged trials are left out of them.",
]


def eval_set_count(summary: pd.DataFrame) -> int:
    """How many eval sets the per-set table holds (0 when nothing was scored)."""
    part = summary[summary["section"] == "eval_set_scores"]
    return int(part["comparison"].nunique()) if len(part) else 0


def _figure(paths: dict[str, Path], name: str, caption: str) -> list[Block]:
    return [Block("figure", caption, path=paths[name])] if name in paths else []


def _table(summary: pd.DataFrame, section: str, title: str, text: str, **kw: object) -> list[Block]:
    return [
        Block("h3", title),
        Block("p", text),
        Block("table", table=wide_table(summary, section, **kw)),
    ]


def aggregate_blocks(summary: pd.DataFrame, figs: dict[str, Path]) -> list[Block]:
    """The headline when there are several eval sets: aggregates, profiles, PoI across sets."""
    sets = eval_set_count(summary)
    taus = [tau_statistic(t) for t in TABLE_TAUS]
    return [
        Block("h2", f"Scores across {sets} eval sets (headline)"),
        *_table(
            summary,
            "eval_aggregate",
            "Aggregates across eval sets",
            "Per (arm, lag) and score (comparison column): IQM, mean, median and optimality gap "
            "(lower is better) of the seeds x eval-sets matrix, with percentile CIs from a "
            "bootstrap stratified by eval set: the strata are the eval sets (note), seeds are "
            "resampled within each. n = seeds.",
        ),
        *_figure(figs, "eval_aggregates", "Aggregates of the final greedy score across eval sets."),
        *_table(
            summary,
            "performance_profile",
            "Performance profile",
            "Fraction of runs (seeds x eval sets, each set weighted equally) whose final greedy "
            "score is above tau, at three taus; the figure shows the full profile with bands.",
            statistics=taus,
        ),
        *_figure(figs, "performance_profiles", "Performance profiles with bootstrap bands."),
        *_table(
            summary,
            "poi_eval_sets",
            "Probability of improvement across eval sets",
            "Mean over eval sets of P(X > Y) + 0.5 P(X = Y), with CI from resampling each arm's "
            "seeds within each eval set; n = seeds of both arms.",
        ),
    ]


def per_set_blocks(summary: pd.DataFrame, figs: dict[str, Path]) -> list[Block]:
    """Per-eval-set scores (shown for one eval set too: pass@1 and pass@k live here)."""
    return [
        *_table(
            summary,
            "eval_set_scores",
            "Scores per eval set",
            "IQM across seeds with CI of: final greedy pass rate, greedy AUC, final sampled "
            "pass@1 and pass@k (unbiased estimator, Chen et al. 2021), per eval set "
            "(comparison column). n = seeds.",
        ),
        *_figure(figs, "eval_sets", "Final greedy score per eval set."),
    ]


def compute_blocks(summary: pd.DataFrame, figs: dict[str, Path]) -> list[Block]:
    """Compute-matched curves and who leads at equal budgets."""
    if not (summary["section"] == "compute_curves").any():
        return []
    return [
        Block("h2", "Compute-matched comparison"),
        *_figure(
            figs,
            "compute_matched",
            "Primary eval score against learner steps, generated tokens and wall-clock seconds.",
        ),
        *_table(
            summary,
            "compute_matched",
            "Which arm leads at equal budget",
            "At a quarter, half and all of the budget range every trial of the lag reached: the "
            "arm with the highest IQM (arm column) and the runner-up, with CIs; when the "
            "intervals overlap the lead is not established. Diverged trials are left out of "
            "these curves (no score exists past their drop). n = seeds.",
        ),
    ]


def next_step_blocks(summary: pd.DataFrame) -> list[Block]:
    """What to do next: seeds for the target power and the command that adds them."""
    if not (summary["section"] == "next_steps").any():
        return []
    return [
        Block("h2", "What to do next"),
        *_table(
            summary,
            "next_steps",
            "Seeds for the target power",
            "Seeds per arm the observed effect on the final score needs for the target power "
            "(see Power), the seeds run so far, and the command that adds the missing seeds: "
            "`harness run` skips every finished trial and runs only the new seeds' trials (all "
            "arms and lags, so the comparison stays matched). Effects from few seeds are noisy; "
            "treat the count as a plan, not a promise.",
        ),
    ]
