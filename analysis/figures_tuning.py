"""Figures of the tuning protocol: expected validation performance curves and sensitivity panels.

Same conventions as the report's other figures (`analysis.figures`): matplotlib's object API
on the Agg canvas (no pyplot state, so no figure is left open to close), one colour per arm
from `arm_colors`, one legend below the panels, PNG written by `save`.
Unlike the sections' `*_figure` functions, which return None when there is nothing to draw,
these raise ValueError on empty input: a tuning report without curves is a caller's bug.
"""

from __future__ import annotations

from collections.abc import Mapping
from numbers import Real
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator, NullLocator

from analysis.figures import arm_colors, grid, outside_legend, save
from analysis.stats.expected_max import SENSITIVITY_COLUMNS, ExpectedMaxCurve

DPI = 110  # ReportConfig.figure_dpi's default
LOG_SPAN = 10.0  # positive numeric values spanning this factor or more get a log x axis
DODGE = 0.015  # horizontal offset between arms, as a fraction of the panel's x span
MARKER_MAX_BUDGET = 30  # mark each budget when there are this few
MAX_VALUE_TICKS = 8  # label every value tried when a hyperparameter has this few


def expected_max_figure(curves: Mapping[str, ExpectedMaxCurve]) -> Figure:
    """Expected max validation score against configurations tried, one line per arm.

    The band is +-1 std of the max at each budget (Dodge et al. 2019's EVP plot): how much the
    tuned score would vary across tuning runs of that size, not a confidence interval.
    """
    if not curves:
        raise ValueError("plot_expected_max needs at least one arm's ExpectedMaxCurve, got none")
    estimators = {curve.estimator for curve in curves.values()}
    if len(estimators) > 1:
        raise ValueError(f"curves mix estimators {sorted(estimators)}; plot like with like")
    colors = arm_colors(list(curves))
    fig = Figure(figsize=(6.5, 4.0), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    n_max = max(curve.n_configurations for curve in curves.values())
    for arm in sorted(curves):
        curve = curves[arm]
        marker = "o" if curve.n_configurations <= MARKER_MAX_BUDGET else None
        label = f"{arm} (N={curve.n_configurations})"
        ax.plot(
            curve.budgets, curve.mean, color=colors[arm], lw=2, marker=marker, ms=3, label=label
        )
        low, high = curve.mean - curve.std, curve.mean + curve.std
        ax.fill_between(curve.budgets, low, high, color=colors[arm], alpha=0.2, lw=0)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if n_max > 1:
        ax.set_xlim(1, n_max)
    (estimator,) = estimators
    ax.set(xlabel="configurations tried (n)", ylabel="expected max validation score")
    ax.grid(alpha=0.3)
    outside_legend(fig, [ax])
    fig.suptitle(f"Expected validation performance ({estimator} estimator), band +-1 std")
    return fig


def plot_expected_max(
    curves: Mapping[str, ExpectedMaxCurve], path: Path | str, *, dpi: int = DPI
) -> Path:
    """Write `expected_max_figure(curves)` as a PNG at `path`; returns the path."""
    return save(expected_max_figure(curves), Path(path), dpi)


def _is_numeric(values: pd.Series) -> bool:
    return all(isinstance(v, Real) and not isinstance(v, bool) for v in values)


def _positions(values: pd.Series) -> tuple[dict[object, float], str]:
    """x position of each value and the axis scale: numbers as they are (log when positive and
    spanning LOG_SPAN or more), anything else as categories in order of first appearance."""
    if _is_numeric(values):
        numbers = values.astype(float)
        positive = bool((numbers > 0).all())
        scale = "log" if positive and numbers.max() / numbers.min() >= LOG_SPAN else "linear"
        return {v: float(v) for v in values}, scale
    return {v: float(i) for i, v in enumerate(dict.fromkeys(values))}, "categorical"


def _dodged(x: np.ndarray, shift: float, scale: str, span: float) -> np.ndarray:
    """`x` moved `shift` (a fraction of the x span) so arms' error bars do not overlap."""
    if scale == "log":
        return x * 10 ** (shift * span)
    return x + shift * span


def _sensitivity_panel(ax: Axes, cells: pd.DataFrame, param: str, colors: dict[str, str]) -> None:
    where, scale = _positions(cells["value"])
    xs = np.array(list(where.values()))
    span = np.ptp(np.log10(xs)) if scale == "log" else np.ptp(xs)
    span = span if span > 0 else 1.0
    arms = sorted(cells["arm"].unique())
    for k, arm in enumerate(arms):
        rows = cells[cells["arm"] == arm].copy()
        rows["x"] = rows["value"].map(where).astype(float)
        rows = rows.sort_values("x")
        x = _dodged(rows["x"].to_numpy(), (k - (len(arms) - 1) / 2) * DODGE, scale, span)
        mean = rows["mean"].to_numpy(dtype=float)
        err = np.vstack([mean - rows["low"].to_numpy(float), rows["high"].to_numpy(float) - mean])
        ax.errorbar(x, mean, yerr=err, fmt="o-", color=colors[arm], capsize=3, lw=1.5, label=arm)
    if scale == "log":
        ax.set_xscale("log")
        ax.xaxis.set_minor_locator(NullLocator())
    if scale == "categorical" or len(where) <= MAX_VALUE_TICKS:  # a tick at every value tried
        labels = [f"{v:g}" if scale != "categorical" else str(v) for v in where]
        ax.set_xticks(list(where.values()), labels, fontsize=8)
    ax.set(title=param, xlabel=f"{param} value", ylabel="mean score over tuning seeds")
    ax.grid(alpha=0.3)


def sensitivity_figure(table: pd.DataFrame, *, confidence: float = 0.95) -> Figure:
    """One panel per hyperparameter of a `sensitivity_table`: one line per arm, the mean score
    at each value with its bootstrap interval across tuning seeds. Numeric values sit at their
    value (log axis when all positive and spanning 10x or more), others as categories."""
    missing = [col for col in SENSITIVITY_COLUMNS if col not in table.columns]
    if missing:
        raise ValueError(f"plot_sensitivity needs a sensitivity_table; columns {missing} missing")
    if table.empty:
        raise ValueError("plot_sensitivity got an empty sensitivity table: nothing to draw")
    params = list(dict.fromkeys(table["param"]))
    colors = arm_colors([str(arm) for arm in table["arm"].unique()])
    fig, axes = grid(len(params), width=4.2, height=3.2)
    for ax, param in zip(axes, params, strict=True):
        cells = table[table["param"] == param].astype({"arm": str})
        _sensitivity_panel(ax, cells, str(param), colors)
    outside_legend(fig, axes)
    fig.suptitle(
        f"Hyperparameter sensitivity: mean over tuning seeds, {confidence:.0%} bootstrap interval"
    )
    return fig


def plot_sensitivity(
    table: pd.DataFrame, path: Path | str, *, confidence: float = 0.95, dpi: int = DPI
) -> Path:
    """Write `sensitivity_figure(table)` as a PNG at `path`; returns the path."""
    return save(sensitivity_figure(table, confidence=confidence), Path(path), dpi)
