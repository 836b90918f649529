"""Section "Scores": final score and area under the eval curve per (arm, lag), and learning curves.

IQM and mean across seeds with intervals. Per-condition intervals bootstrap seeds; the per-arm
"all lags" row is the stratified bootstrap of Agarwal et al. 2021 (each lag is a stratum, its
seeds resampled within it). Learning curves: IQM across seeds at each eval step with a band.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd

from analysis.config import ReportConfig
from analysis.curves import aggregate_curves, curve_rows, trial_curves
from analysis.figures import arm_colors, draw_curves, interval_grid, lag_grid
from analysis.render import Block
from analysis.sections.base import Inputs, Measure, Page, Part, cell_rows, figure, table
from analysis.sections.eval_sets import eval_set_count
from analysis.stats import BootstrapSpec, stratified_interval
from analysis.summary import interval_row
from analysis.trial_scores import by_condition
from contract import metrics as mn

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

SCORE_SECTIONS = ("final_score", "auc")
ALL_LAGS = "all lags (stratified)"
METHODS = [
    "Diverged trials (diverged_scores=zero_after, the default) keep their seed in the score "
    "statistics but are never credited for steps they did not run: from the step after their "
    "last logged step to the planned step count their pass rate is taken as 0, the floor (the "
    "policy after a non-finite update is unusable). Final score = 0, since the policy at the "
    "planned end is the diverged one; AUC = area under the eval curve extended by 0 to the "
    "planned end (linear from the last eval to the drop), divided by the full planned span, "
    "as for a completed trial.",
]


def condition_rows(scored: pd.DataFrame, column: str, spec: BootstrapSpec) -> list[dict]:
    """IQM and mean of `column` across seeds for every (arm, lag), a scoreless one included."""
    measures = [Measure("iqm", "iqm", column), Measure("mean", "mean", column)]
    return cell_rows(scored, column, measures, spec, keep_empty=True)


def stratified_rows(scored: pd.DataFrame, column: str, spec: BootstrapSpec) -> list[dict]:
    """Per arm, IQM and mean pooled over lags with lag-stratified intervals (>1 lag only)."""
    if scored["lag"].nunique() < 2:
        return []
    rows = []
    cells = by_condition(scored, column)
    for arm in sorted({a for a, _ in cells}):
        strata = [values for (a, _), values in cells.items() if a == arm]
        for aggregate in ("iqm", "mean"):
            interval = stratified_interval(strata, aggregate, spec)
            rows.append(interval_row(column, aggregate, interval, arm=arm, comparison=ALL_LAGS))
    return rows


def performance_rows(scored: pd.DataFrame, spec: BootstrapSpec) -> list[dict]:
    """Summary rows of sections `final_score` and `auc`."""
    rows: list[dict] = []
    if scored.empty:
        return rows
    for column in SCORE_SECTIONS:
        rows += condition_rows(scored, column, spec)
        rows += stratified_rows(scored, column, spec)
    return rows


def analyse(inputs: Inputs, prior: pd.DataFrame) -> Part:
    """Score tables, and the learning curves (section `learning_curve`, for the figure)."""
    raw = trial_curves(inputs.experiment.metrics, inputs.scored, mn.EVAL_PASS_RATE)
    agg = aggregate_curves(raw, inputs.curve_spec)
    rows = performance_rows(inputs.scored, inputs.spec) + curve_rows(agg, "learning_curve")
    return Part(rows, {"curves": agg, "seeds": raw})


def learning_curves_figure(
    agg: pd.DataFrame,
    raw: pd.DataFrame,
    threshold: float | None = None,
    colors: dict[str, str] | None = None,
    confidence: float = 0.95,
) -> Figure | None:
    """Eval pass rate vs step: IQM over seeds, bootstrap band, thin seed lines; panel per lag."""
    if agg.empty:
        return None
    colors = colors or arm_colors(list(raw["arm"].unique()) + list(agg["arm"].unique()))

    def panel(ax: Axes, lag: int) -> None:
        draw_curves(ax, agg[agg["lag"] == lag], raw[raw["lag"] == lag], colors)
        if threshold is not None:
            ax.axhline(threshold, color="grey", ls=":", lw=1)
        ax.set(title=f"lag {lag}", xlabel="learner step", ylabel="eval pass rate")
        ax.grid(alpha=0.3)

    title = f"Learning curves: IQM across seeds, band = {confidence:.0%} bootstrap CI; thin = seeds"
    return lag_grid(sorted(agg["lag"].unique()), panel, title)


def intervals_figure(
    summary: pd.DataFrame, colors: dict[str, str] | None = None, confidence: float = 0.95
) -> Figure | None:
    """Final score and AUC per (arm, lag): IQM and mean with interval bars."""
    cells = summary[summary["section"].isin(SCORE_SECTIONS) & summary["lag"].notna()]
    if cells.empty:
        return None
    colors = colors or arm_colors(list(cells["arm"].unique()))
    height = 0.3 * cells["arm"].nunique() * cells["lag"].nunique() + 1.2
    panels = [
        (
            f"{section.replace('_', ' ')}: {aggregate.upper()}",
            cells[(cells["section"] == section) & (cells["statistic"] == aggregate)],
        )
        for section in SCORE_SECTIONS
        for aggregate in ("iqm", "mean")
    ]
    title = f"Scores across seeds with {confidence:.0%} bootstrap CIs"
    return interval_grid(panels, colors, title, width=5.0, height=height, max_cols=2)


def draw(
    part: Part, summary: pd.DataFrame, colors: dict[str, str], config: ReportConfig
) -> dict[str, Figure | None]:
    agg, raw = part.tables["curves"], part.tables["seeds"]
    return {
        "learning_curves": learning_curves_figure(
            agg, raw, config.pass_threshold, colors, config.confidence
        ),
        "final_scores": intervals_figure(summary, colors, config.confidence),
    }


def blocks(page: Page) -> list[Block]:
    if not page.any_scored:
        return []
    summary, figs = page.summary, page.figures
    several = eval_set_count(summary) > 1
    scope = (
        "Primary eval set only (the first; the headline is the aggregate across eval sets above). "
        if several
        else ""
    )
    return [
        Block("h2", "Scores on the primary eval set" if several else "Scores"),
        *table(
            summary,
            "final_score",
            "Final score",
            f"{scope}IQM and mean across seeds with CI; n = seeds. 'all' rows pool lags with a "
            "bootstrap stratified by lag (the strata are lags).",
        ),
        *table(
            summary, "auc", "Area under the eval curve", "Mean pass rate over training; n = seeds."
        ),
        *figure(
            figs, "final_scores", "Final score and AUC per arm and lag, IQM and mean with CIs."
        ),
        *figure(
            figs,
            "learning_curves",
            "Learning curves: IQM across seeds with bootstrap band, thin lines are seeds; a "
            "diverged seed drops out after its last eval.",
        ),
    ]
