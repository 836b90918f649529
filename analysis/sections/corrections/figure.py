"""The off-policy corrections figure: score and correction diagnostics against lag, per arm.

Drawn from summary section `corrections` only, so it shows exactly the tables' numbers. Lags sit
at evenly spaced positions (0, 1, 2, 4, 8 would crowd the small ones on a linear axis), and arms
are nudged sideways so their interval bars do not hide each other.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from analysis.figures import arm_colors, outside_legend
from analysis.sections.corrections.tables import SCORE_STATS, SECTION

# (statistic, panel title, y label), drawn when the section has rows of that statistic.
PANELS = (
    ("final_score_iqm", "final score (IQM)", "pass rate"),
    ("auc_iqm", "AUC (IQM)", "mean pass rate"),
    ("ess_frac", "ESS / N of the correction weights", "fraction"),
    ("clip_frac", "clip fraction", "fraction of tokens"),
)
NUDGE = 0.18  # total sideways spread of the arms at one lag, in lag positions


def _against_lag(ax: Axes, cells: pd.DataFrame, lags: list[int], colors: dict[str, str]) -> None:
    """Point per (arm, lag) with its interval bar, lines joining an arm's lags."""
    position = {lag: i for i, lag in enumerate(lags)}
    arms = sorted(cells["arm"].unique())
    offsets = np.linspace(-NUDGE / 2, NUDGE / 2, len(arms)) if len(arms) > 1 else [0.0]
    for arm, offset in zip(arms, offsets, strict=True):
        line = cells[cells["arm"] == arm].sort_values("lag")
        x = np.array([position[int(lag)] for lag in line["lag"]]) + offset
        lo = (line["value"] - line["ci_low"]).fillna(0).clip(lower=0)
        hi = (line["ci_high"] - line["value"]).fillna(0).clip(lower=0)
        ax.errorbar(
            x,
            line["value"],
            yerr=[lo, hi],
            color=colors[arm],
            marker="o",
            capsize=3,
            label=str(arm),
        )
    ax.set_xticks(range(len(lags)), [str(lag) for lag in lags])
    ax.grid(alpha=0.3)


def corrections_figure(
    summary: pd.DataFrame, colors: dict[str, str] | None = None, confidence: float = 0.95
) -> Figure | None:
    """Final score, AUC, ESS/N and clip fraction vs lag per arm; None without correction metrics
    or with a single lag.

    Scores against lag alone are already in the staleness trade-off figure, so this one is drawn
    only when the section holds ESS/N or clip fraction rows (the correction diagnostics); at a
    single lag every panel would be one point per arm, which the section's tables already show.
    """
    cells = summary[(summary["section"] == SECTION) & summary["lag"].notna()]
    panels = [p for p in PANELS if (cells["statistic"] == p[0]).any()]
    if all(stat in SCORE_STATS for stat, _, _ in panels) or cells["lag"].nunique() < 2:
        return None
    colors = colors or arm_colors(list(cells["arm"].unique()))
    lags = sorted(int(lag) for lag in cells["lag"].unique())
    cols = min(len(panels), 2)
    rows = -(-len(panels) // cols)
    fig = Figure(figsize=(5.0 * cols, 3.4 * rows), layout="constrained")
    FigureCanvasAgg(fig)
    for i, (stat, title, ylabel) in enumerate(panels):
        ax = fig.add_subplot(rows, cols, i + 1)
        _against_lag(ax, cells[cells["statistic"] == stat], lags, colors)
        ax.set(title=title, xlabel="lag", ylabel=ylabel)
    outside_legend(fig, fig.axes)
    fig.suptitle(f"Corrections across lags: mean or IQM over seeds, {confidence:.0%} bootstrap CI")
    return fig
