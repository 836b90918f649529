"""Plotting helpers the sections' figures share (matplotlib's object API on the Agg canvas, no
pyplot state): arm colours, panel grids, one legend outside the panels, curves with bands,
interval bars, and PNG output (titles wrapped to fit first: `analysis.figure_text`).

Each section's `*_figure` function takes tables the report already computed and returns a
Figure, or None when there is nothing to draw, so the report lists what it could not plot
instead of failing. Styles follow Agarwal et al. 2021: point estimates with interval bars.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.artist import Artist
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from analysis.figure_text import fit_text, fitted_legend

MAX_COLS = 4


def arm_colors(arms: list[str]) -> dict[str, str]:
    """A stable colour per arm (tab10 in sorted order), shared by every figure."""
    palette = [f"C{i}" for i in range(10)]
    return {arm: palette[i % 10] for i, arm in enumerate(sorted(set(arms)))}


def grid(
    n_panels: int, width: float = 4.2, height: float = 3.2, max_cols: int = MAX_COLS
) -> tuple[Figure, list[Axes]]:
    """A figure of `n_panels` panels, at most `max_cols` per row, each width x height inches."""
    cols = min(n_panels, max_cols)
    rows = math.ceil(n_panels / cols)
    fig = Figure(figsize=(width * cols, height * rows), layout="constrained")
    FigureCanvasAgg(fig)
    axes = [fig.add_subplot(rows, cols, i + 1) for i in range(n_panels)]
    return fig, axes


def lag_grid(
    lags: Sequence[Any],
    panel: Callable[[Axes, Any], None],
    title: str,
    *,
    width: float = 4.2,
    height: float = 3.2,
) -> Figure:
    """One panel per lag, drawn by `panel(ax, lag)`, one legend outside them all and `title`
    above: the layout every per-lag figure shares, so arms keep their place across lags."""
    fig, axes = grid(len(lags), width=width, height=height)
    for ax, lag in zip(axes, lags, strict=True):
        panel(ax, lag)
    outside_legend(fig, axes)
    fig.suptitle(title)
    return fig


def outside_legend(fig: Figure, axes: Sequence[Axes]) -> None:
    """One legend for the whole figure, below the panels (constrained layout makes room), in as
    many columns as fit (`figure_text.fitted_legend`).

    With 6 arms x 5 lags a legend inside a panel hides the curves it explains; one entry per
    label, gathered from every panel, so a label missing from the first panel still shows.
    """
    entries: dict[str, Artist] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            entries.setdefault(label, handle)
    if entries:
        fitted_legend(fig, list(entries.values()), list(entries))


def save(fig: Figure, path: Path, dpi: int) -> Path:
    """Write `fig` as PNG, its titles wrapped to fit (`figure_text.fit_text`); returns the path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fit_text(fig).savefig(path, format="png", dpi=dpi)
    return path


def draw_curves(ax: Axes, agg: pd.DataFrame, raw: pd.DataFrame, colors: dict[str, str]) -> None:
    """Thin per-seed lines under each arm's IQM curve with its band (when it has one)."""
    for arm, seeds in raw.groupby("arm", sort=True):
        for _, seed in seeds.groupby("trial_name"):
            ax.plot(seed["step"], seed["value"], color=colors[arm], lw=0.6, alpha=0.3)
    for arm, line in agg.groupby("arm", sort=True):
        ax.plot(line["step"], line["iqm"], color=colors[arm], lw=2, label=str(arm))
        if line["low"].notna().any():
            ax.fill_between(line["step"], line["low"], line["high"], color=colors[arm], alpha=0.2)


def interval_panel(ax: Axes, cells: pd.DataFrame, colors: dict[str, str], title: str) -> None:
    """One row per (arm, lag) summary row: the value with its interval bar."""
    labels = [f"{r.arm} | lag {r.lag}" for r in cells.itertuples()]
    y = np.arange(len(cells))[::-1]
    for yi, r in zip(y, cells.itertuples(), strict=True):
        err = [[r.value - r.ci_low], [r.ci_high - r.value]] if np.isfinite(r.ci_low) else None
        ax.errorbar(r.value, yi, xerr=err, fmt="o", color=colors[r.arm], capsize=3)
    ax.set_yticks(y, labels, fontsize=8)
    ax.set(title=title, xlabel="pass rate")
    ax.grid(axis="x", alpha=0.3)


def interval_grid(
    panels: Sequence[tuple[str, pd.DataFrame]],
    colors: dict[str, str],
    title: str,
    *,
    width: float,
    height: float,
    max_cols: int,
) -> Figure:
    """One `interval_panel` per (panel title, summary rows), rows ordered by lag then arm, and
    `title` above: every interval figure lists its cells in the same order."""
    fig, axes = grid(len(panels), width=width, height=height, max_cols=max_cols)
    for ax, (name, cells) in zip(axes, panels, strict=True):
        interval_panel(ax, cells.sort_values(["lag", "arm"]), colors, name)
    fig.suptitle(title)
    return fig
