"""Section "Scores across eval sets" (the headline with several eval sets).

Method: Agarwal et al. 2021 as implemented in rliable: per (arm, lag) the final scores form a
seeds x eval-sets matrix; IQM / mean / median / optimality gap with a bootstrap stratified by
eval set, performance profiles, and the probability of improvement averaged over eval sets
(analysis.stats). Shown only with more than one eval set: across one set they would repeat the
final-score and PoI sections.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from analysis.config import ReportConfig
from analysis.eval_tables import eval_set_names
from analysis.figures import interval_grid, lag_grid
from analysis.render import Block
from analysis.sections.base import Inputs, Page, Part, figure, table
from analysis.sections.eval_sets import (
    HEADLINE,
    cell_height,
    colors_for,
    eval_set_count,
    eval_set_scores,
    task_matrix,
)
from analysis.stats import (
    AGGREGATE_NAMES,
    BootstrapSpec,
    performance_profile,
    poi_interval,
    stratified_aggregate,
)
from analysis.summary import interval_row

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

AGGREGATED = ("final_greedy", "auc_greedy", "final_pass1")
TAUS = np.round(np.linspace(0.0, 1.0, 21), 2)  # performance-profile grid, step 0.05
TABLE_TAUS = (0.25, 0.5, 0.75)  # the profile points the report's table shows
METHODS = [
    "Across eval sets (Agarwal et al. 2021; rliable): each (arm, lag) has a seeds x eval-sets "
    "matrix of final greedy scores; IQM over all entries, mean and median of the per-set means, "
    "optimality gap 1 - mean(min(score, 1)); percentile intervals from a bootstrap stratified "
    "by eval set (seeds resampled with replacement within each eval set, each set "
    "independently). Performance profile: mean over eval sets of the fraction of seeds scoring "
    "above tau, with the same bootstrap. PoI across eval sets: mean over sets of P(X > Y) + "
    "0.5 P(X = Y), X and Y resampled apart within each set.",
]


def tau_statistic(tau: float) -> str:
    return f"above_{tau:.2f}"


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
                keys = {"arm": str(arm), "lag": int(lag), "comparison": column}
                r = interval_row("eval_aggregate", name, interval, **keys)
                rows.append({**r, "note": interval.note or _strata_note(sets)})
    return rows


def profile_rows(per_set: pd.DataFrame, spec: BootstrapSpec) -> list[dict]:
    """Section `performance_profile`: fraction of runs (x eval sets) with final greedy > tau."""
    rows, sets = [], eval_set_names(per_set)
    for (arm, lag), cell in per_set.groupby(["arm", "lag"], sort=True):
        tasks = task_matrix(cell, HEADLINE, sets)
        for tau, interval in zip(TAUS, performance_profile(tasks, TAUS, spec), strict=True):
            statistic = tau_statistic(float(tau))
            keys = {"arm": str(arm), "lag": int(lag)}
            rows.append(interval_row("performance_profile", statistic, interval, **keys))
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
                interval = poi_interval(tx, ty, spec)
                keys = {"lag": int(lag), "comparison": f"{x} vs {y}"}
                r = interval_row("poi_eval_sets", column, interval, **keys)
                rows.append({**r, "note": interval.note or _strata_note(sets)})
    return rows


def analyse(inputs: Inputs, prior: pd.DataFrame) -> Part:
    """Aggregates, profiles and PoI across eval sets; nothing with fewer than 2 eval sets."""
    per_set = eval_set_scores(inputs.experiment.evals, inputs.scored, inputs.config)
    if per_set.empty or len(eval_set_names(per_set)) < 2:
        return Part()
    spec = inputs.spec
    rows = aggregate_rows(per_set, spec) + profile_rows(per_set, spec)
    return Part(rows + poi_rows_across_sets(per_set, spec))


def aggregate_figure(
    summary: pd.DataFrame, colors: dict[str, str] | None = None, confidence: float = 0.95
) -> Figure | None:
    """IQM, mean, median and optimality gap across eval sets of the final greedy score."""
    cells = summary[(summary["section"] == "eval_aggregate") & (summary["comparison"] == HEADLINE)]
    if cells.empty:
        return None
    panels = [
        (
            name.replace("_", " ") + (" (lower is better)" if name == "optimality_gap" else ""),
            cells[cells["statistic"] == name],
        )
        for name in AGGREGATE_NAMES
    ]
    title = f"Aggregates across eval sets, {confidence:.0%} bootstrap CI stratified by eval set"
    colors = colors_for(cells, colors)
    return interval_grid(panels, colors, title, width=4.6, height=cell_height(cells), max_cols=4)


def profile_figure(
    summary: pd.DataFrame, colors: dict[str, str] | None = None, confidence: float = 0.95
) -> Figure | None:
    """Performance profiles: fraction of runs x eval sets above tau, a panel per lag, bands."""
    cells = summary[summary["section"] == "performance_profile"]
    if cells.empty:
        return None
    cells = cells.assign(tau=cells["statistic"].str.removeprefix("above_").astype(float))
    colors = colors_for(cells, colors)
    lags = sorted(int(lag) for lag in cells["lag"].unique())

    def panel(ax: Axes, lag: int) -> None:
        for arm, line in cells[cells["lag"] == lag].sort_values("tau").groupby("arm", sort=True):
            ax.plot(line["tau"], line["value"], color=colors[arm], lw=1.8, label=str(arm))
            if line["ci_low"].notna().any():
                ax.fill_between(
                    line["tau"], line["ci_low"], line["ci_high"], color=colors[arm], alpha=0.15
                )
        ax.set(title=f"lag {lag}", xlabel="final greedy pass rate tau", ylabel="P(score > tau)")
        ax.set(ylim=(-0.02, 1.02))
        ax.grid(alpha=0.3)

    title = f"Performance profiles, {confidence:.0%} stratified-bootstrap bands"
    return lag_grid(lags, panel, title, width=4.0, height=3.0)


def draw(
    part: Part, summary: pd.DataFrame, colors: dict[str, str], config: ReportConfig
) -> dict[str, Figure | None]:
    return {
        "eval_aggregates": aggregate_figure(summary, colors, config.confidence),
        "performance_profiles": profile_figure(summary, colors, config.confidence),
    }


def blocks(page: Page) -> list[Block]:
    """The headline when there are several eval sets: aggregates, profiles, PoI across sets."""
    sets = eval_set_count(page.summary)
    if not page.any_scored or sets < 2:
        return []
    summary, figs = page.summary, page.figures
    taus = [tau_statistic(t) for t in TABLE_TAUS]
    return [
        Block("h2", f"Scores across {sets} eval sets (headline)"),
        *table(
            summary,
            "eval_aggregate",
            "Aggregates across eval sets",
            "Per (arm, lag) and score (comparison column): IQM, mean, median and optimality gap "
            "(lower is better) of the seeds x eval-sets matrix, with percentile CIs from a "
            "bootstrap stratified by eval set: the strata are the eval sets (note), seeds are "
            "resampled within each. n = seeds.",
        ),
        *figure(figs, "eval_aggregates", "Aggregates of the final greedy score across eval sets."),
        *table(
            summary,
            "performance_profile",
            "Performance profile",
            "Fraction of runs (seeds x eval sets, each set weighted equally) whose final greedy "
            "score is above tau, at three taus; the figure shows the full profile with bands.",
            statistics=taus,
        ),
        *figure(figs, "performance_profiles", "Performance profiles with bootstrap bands."),
        *table(
            summary,
            "poi_eval_sets",
            "Probability of improvement across eval sets",
            "Mean over eval sets of P(X > Y) + 0.5 P(X = Y), with CI from resampling each arm's "
            "seeds within each eval set; n = seeds of both arms.",
        ),
    ]
