"""Figures of the eval-set and compute-matched sections (same conventions as analysis.figures:
tables in, a Figure or None out, one colour per arm, legend outside the panels)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from analysis.compute_matched import AXES
from analysis.eval_sets import HEADLINE
from analysis.figures import MAX_COLS, _grid, _interval_panel, arm_colors, outside_legend


def _colors(cells: pd.DataFrame, colors: dict[str, str] | None) -> dict[str, str]:
    return colors or arm_colors(list(cells["arm"].dropna().unique()))


def _cell_height(cells: pd.DataFrame) -> float:
    """Panel height for one interval bar per (arm, lag), so 6 arms x 5 lags stay legible."""
    return 0.28 * cells["arm"].nunique() * cells["lag"].nunique() + 1.2


def eval_set_figure(
    summary: pd.DataFrame, colors: dict[str, str] | None = None, confidence: float = 0.95
) -> Figure | None:
    """Final greedy score per eval set: one panel per set, IQM across seeds with CIs (None with
    a single set)."""
    cells = summary[(summary["section"] == "eval_set_scores") & (summary["statistic"] == HEADLINE)]
    if cells.empty:
        return None
    sets = list(dict.fromkeys(cells["comparison"]))
    if len(sets) < 2:  # one set: the final-score figure already shows it
        return None
    fig, axes = _grid(len(sets), width=4.6, height=_cell_height(cells), max_cols=3)
    for ax, name in zip(axes, sets, strict=True):
        part = cells[cells["comparison"] == name].sort_values(["lag", "arm"])
        _interval_panel(ax, part, _colors(cells, colors), f"{name}: final greedy pass rate")
    fig.suptitle(f"Final score per eval set: IQM across seeds, {confidence:.0%} bootstrap CI")
    return fig


def aggregate_figure(
    summary: pd.DataFrame, colors: dict[str, str] | None = None, confidence: float = 0.95
) -> Figure | None:
    """IQM, mean, median and optimality gap across eval sets of the final greedy score."""
    cells = summary[(summary["section"] == "eval_aggregate") & (summary["comparison"] == HEADLINE)]
    if cells.empty:
        return None
    names = ["iqm", "mean", "median", "optimality_gap"]
    fig, axes = _grid(4, width=4.6, height=_cell_height(cells), max_cols=4)
    for ax, name in zip(axes, names, strict=True):
        part = cells[cells["statistic"] == name].sort_values(["lag", "arm"])
        title = name.replace("_", " ") + (" (lower is better)" if name == "optimality_gap" else "")
        _interval_panel(ax, part, _colors(cells, colors), title)
    fig.suptitle(
        f"Aggregates across eval sets, {confidence:.0%} bootstrap CI stratified by eval set"
    )
    return fig


def profile_figure(
    summary: pd.DataFrame, colors: dict[str, str] | None = None, confidence: float = 0.95
) -> Figure | None:
    """Performance profiles: fraction of runs x eval sets above tau, a panel per lag, bands."""
    cells = summary[summary["section"] == "performance_profile"]
    if cells.empty:
        return None
    cells = cells.assign(tau=cells["statistic"].str.removeprefix("above_").astype(float))
    colors = _colors(cells, colors)
    lags = sorted(int(lag) for lag in cells["lag"].unique())
    fig, axes = _grid(len(lags), width=4.0, height=3.0)
    for ax, lag in zip(axes, lags, strict=True):
        for arm, line in cells[cells["lag"] == lag].sort_values("tau").groupby("arm", sort=True):
            ax.plot(line["tau"], line["value"], color=colors[arm], lw=1.8, label=str(arm))
            if line["ci_low"].notna().any():
                ax.fill_between(
                    line["tau"], line["ci_low"], line["ci_high"], color=colors[arm], alpha=0.15
                )
        ax.set(title=f"lag {lag}", xlabel="final greedy pass rate tau", ylabel="P(score > tau)")
        ax.set(ylim=(-0.02, 1.02))
        ax.grid(alpha=0.3)
    outside_legend(fig, axes)
    fig.suptitle(f"Performance profiles, {confidence:.0%} stratified-bootstrap bands")
    return fig


def compute_matched_figure(
    agg: pd.DataFrame, colors: dict[str, str] | None = None, confidence: float = 0.95
) -> Figure | None:
    """Primary score against steps, tokens and seconds: a row per budget axis, a column per lag
    (wrapped past MAX_COLS lags); IQM across seeds with bands, on each lag's common grid."""
    if agg.empty:
        return None
    colors = _colors(agg, colors)
    axes_present = [a for a in AXES if (agg["axis"] == a).any()]
    lags = sorted(int(lag) for lag in agg["lag"].unique())
    cols = min(len(lags), MAX_COLS)
    blocks = math.ceil(len(lags) / cols)
    rows = len(axes_present) * blocks
    fig = Figure(figsize=(4.0 * cols + 1.5, 2.9 * rows), layout="constrained")
    FigureCanvasAgg(fig)
    grid = fig.subplots(rows, cols, squeeze=False)
    used = []
    for i, axis in enumerate(axes_present):
        for j, lag in enumerate(lags):
            ax = grid[(j // cols) * len(axes_present) + i][j % cols]
            used.append(ax)
            part = agg[(agg["axis"] == axis) & (agg["lag"] == lag)]
            for arm, line in part.groupby("arm", sort=True):
                ax.plot(line["x"], line["iqm"], color=colors[arm], lw=1.8, label=str(arm))
                if line["low"].notna().any():
                    ax.fill_between(
                        line["x"], line["low"], line["high"], color=colors[arm], alpha=0.15
                    )
            ax.set(title=f"lag {lag}", xlabel=AXES[axis], ylabel="eval pass rate")
            ax.grid(alpha=0.3)
    for ax in np.ravel(grid):
        if ax not in used:
            ax.set_visible(False)
    outside_legend(fig, used)
    fig.suptitle(
        f"Compute-matched: IQM across seeds, {confidence:.0%} band; common budget range per lag"
    )
    return fig
