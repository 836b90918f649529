"""Report figures as PNG files (matplotlib's object API on the Agg canvas, no pyplot state).

Each `*_figure` function takes tables the report already computed and returns a Figure, or None
when there is nothing to draw, so the report lists what it could not plot instead of failing.
Styles follow Agarwal et al. 2021: point estimates with interval bars, PoI on [0, 1].
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.artist import Artist
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from analysis.survival import kaplan_meier

MAX_COLS = 4


def arm_colors(arms: list[str]) -> dict[str, str]:
    """A stable colour per arm (tab10 in sorted order), shared by every figure."""
    palette = [f"C{i}" for i in range(10)]
    return {arm: palette[i % 10] for i, arm in enumerate(sorted(set(arms)))}


def _grid(
    n_panels: int, width: float = 4.2, height: float = 3.2, max_cols: int = MAX_COLS
) -> tuple[Figure, list[Axes]]:
    cols = min(n_panels, max_cols)
    rows = math.ceil(n_panels / cols)
    fig = Figure(figsize=(width * cols, height * rows), layout="constrained")
    FigureCanvasAgg(fig)
    axes = [fig.add_subplot(rows, cols, i + 1) for i in range(n_panels)]
    return fig, axes


def outside_legend(fig: Figure, axes: Sequence[Axes]) -> None:
    """One legend for the whole figure, right of the panels (constrained layout makes room).

    With 6 arms x 5 lags a legend inside a panel hides the curves it explains; one entry per
    label, gathered from every panel, so a label missing from the first panel still shows.
    """
    entries: dict[str, Artist] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            entries.setdefault(label, handle)
    if entries:
        fig.legend(list(entries.values()), list(entries), loc="outside right upper", fontsize=8)


def save(fig: Figure, path: Path, dpi: int) -> Path:
    """Write `fig` as PNG; returns the path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", dpi=dpi)
    return path


def _draw_curves(ax: Axes, agg: pd.DataFrame, raw: pd.DataFrame, colors: dict[str, str]) -> None:
    for arm, seeds in raw.groupby("arm", sort=True):
        for _, seed in seeds.groupby("trial_name"):
            ax.plot(seed["step"], seed["value"], color=colors[arm], lw=0.6, alpha=0.3)
    for arm, line in agg.groupby("arm", sort=True):
        ax.plot(line["step"], line["iqm"], color=colors[arm], lw=2, label=str(arm))
        if line["low"].notna().any():
            ax.fill_between(line["step"], line["low"], line["high"], color=colors[arm], alpha=0.2)


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
    lags = sorted(agg["lag"].unique())
    fig, axes = _grid(len(lags))
    for ax, lag in zip(axes, lags, strict=True):
        _draw_curves(ax, agg[agg["lag"] == lag], raw[raw["lag"] == lag], colors)
        if threshold is not None:
            ax.axhline(threshold, color="grey", ls=":", lw=1)
        ax.set(title=f"lag {lag}", xlabel="learner step", ylabel="eval pass rate")
        ax.grid(alpha=0.3)
    outside_legend(fig, axes)
    fig.suptitle(
        f"Learning curves: IQM across seeds, band = {confidence:.0%} bootstrap CI; thin = seeds"
    )
    return fig


def _interval_panel(ax: Axes, cells: pd.DataFrame, colors: dict[str, str], title: str) -> None:
    labels = [f"{r.arm} | lag {r.lag}" for r in cells.itertuples()]
    y = np.arange(len(cells))[::-1]
    for yi, r in zip(y, cells.itertuples(), strict=True):
        err = [[r.value - r.ci_low], [r.ci_high - r.value]] if np.isfinite(r.ci_low) else None
        ax.errorbar(r.value, yi, xerr=err, fmt="o", color=colors[r.arm], capsize=3)
    ax.set_yticks(y, labels, fontsize=8)
    ax.set(title=title, xlabel="pass rate")
    ax.grid(axis="x", alpha=0.3)


def intervals_figure(
    summary: pd.DataFrame, colors: dict[str, str] | None = None, confidence: float = 0.95
) -> Figure | None:
    """Final score and AUC per (arm, lag): IQM and mean with interval bars."""
    cells = summary[summary["section"].isin(["final_score", "auc"]) & summary["lag"].notna()]
    if cells.empty:
        return None
    colors = colors or arm_colors(list(cells["arm"].unique()))
    height = 0.3 * cells["arm"].nunique() * cells["lag"].nunique() + 1.2
    fig, axes = _grid(4, width=5.0, height=height, max_cols=2)
    panels = [(s, a) for s in ("final_score", "auc") for a in ("iqm", "mean")]
    for ax, (section, aggregate) in zip(axes, panels, strict=True):
        part = cells[(cells["section"] == section) & (cells["statistic"] == aggregate)]
        part = part.sort_values(["lag", "arm"])
        _interval_panel(ax, part, colors, f"{section.replace('_', ' ')}: {aggregate.upper()}")
    fig.suptitle(f"Scores across seeds with {confidence:.0%} bootstrap CIs")
    return fig


def poi_figure(summary: pd.DataFrame, confidence: float = 0.95) -> Figure | None:
    """P(X > Y) on the final score for each arm pair and lag, with bootstrap intervals."""
    cells = summary[
        (summary["section"] == "probability_of_improvement")
        & (summary["statistic"] == "final_score")
    ].sort_values(["lag", "comparison"])
    if cells.empty:
        return None
    fig = Figure(figsize=(6.5, 0.4 * len(cells) + 1.5), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    y = np.arange(len(cells))[::-1]
    for yi, r in zip(y, cells.itertuples(), strict=True):
        err = [[r.value - r.ci_low], [r.ci_high - r.value]] if np.isfinite(r.ci_low) else None
        ax.errorbar(r.value, yi, xerr=err, fmt="o", color="C0", capsize=3)
    labels = [f"lag {r.lag}: P({r.comparison.replace(' vs ', ' > ')})" for r in cells.itertuples()]
    ax.set_yticks(y, labels, fontsize=8)
    ax.axvline(0.5, color="grey", ls="--", lw=1)
    ax.set(xlim=(-0.03, 1.03), xlabel="probability of improvement (final score)")
    ax.set_title(f"Probability of improvement, {confidence:.0%} bootstrap CI")
    ax.grid(axis="x", alpha=0.3)
    return fig


def _by_lag(ax: Axes, cells: pd.DataFrame, colors: dict[str, str], ls: str = "-") -> None:
    if len(cells):
        ax.set_xticks(sorted(int(lag) for lag in cells["lag"].unique()))
    for arm, line in cells.sort_values("lag").groupby("arm", sort=True):
        lo = (line["value"] - line["ci_low"]).fillna(0).clip(lower=0)
        hi = (line["ci_high"] - line["value"]).fillna(0).clip(lower=0)
        ax.errorbar(
            line["lag"],
            line["value"],
            yerr=[lo, hi],
            color=colors[arm],
            ls=ls,
            marker="o",
            capsize=3,
            label=str(arm) if ls == "-" else None,
        )


def staleness_figure(
    summary: pd.DataFrame, frontier: pd.DataFrame, colors: dict[str, str] | None = None
) -> Figure | None:
    """Score, throughput and utilisation against lag, and the throughput/score frontier."""
    stale = summary[summary["section"] == "staleness"]
    final = summary[(summary["section"] == "final_score") & (summary["statistic"] == "iqm")]
    final = final[final["lag"].notna()]
    if stale.empty and final.empty:
        return None
    colors = colors or arm_colors(list(summary["arm"].dropna().unique()))
    fig, axes = _grid(4, width=5.0, height=3.6, max_cols=2)
    _by_lag(axes[0], final, colors)
    axes[0].set(title="final score (IQM)", xlabel="lag", ylabel="pass rate")
    _by_lag(axes[1], stale[stale["statistic"] == "steps_per_s"], colors)
    axes[1].set(title="learner throughput", xlabel="lag", ylabel="steps / s")
    _by_lag(axes[2], stale[stale["statistic"] == "learner_wait_frac"], colors, "-")
    _by_lag(axes[2], stale[stale["statistic"] == "gen_idle_frac"], colors, "--")
    axes[2].set(
        title="learner wait (solid), generator idle (dashed)",
        xlabel="lag",
        ylabel="fraction of time",
        ylim=(-0.02, 1.02),
    )
    ax = axes[3]
    for arm, pts in frontier.groupby("arm", sort=True):
        ax.plot(pts["steps_per_s"], pts["final_iqm"], "o-", color=colors[arm], alpha=0.6)
        best = pts[pts["pareto_within_arm"]]
        ax.scatter(
            best["steps_per_s"],
            best["final_iqm"],
            s=120,
            facecolors="none",
            edgecolors=colors[arm],
            linewidths=2,
        )
        for r in pts.itertuples():
            if np.isfinite([r.steps_per_s, r.final_iqm]).all():
                ax.annotate(
                    f"lag {r.lag}",
                    (r.steps_per_s, r.final_iqm),
                    fontsize=7,
                    xytext=(4, 4),
                    textcoords="offset points",
                )
    ax.set(
        title="trade-off (ringed = Pareto-optimal lag)",
        xlabel="steps / s",
        ylabel="final score IQM",
    )
    for a in axes:
        a.grid(alpha=0.3)
    outside_legend(fig, axes)
    return fig


def diagnostics_figure(
    curves: dict[str, tuple[pd.DataFrame, pd.DataFrame]], colors: dict[str, str] | None = None
) -> Figure | None:
    """Per-step diagnostics (e.g. clip fraction, KL): rows = metric, columns = lag; IQM + seeds."""
    curves = {name: c for name, c in curves.items() if not c[0].empty}
    if not curves:
        return None
    lags = sorted({lag for agg, _ in curves.values() for lag in agg["lag"].unique()})
    arms = sorted({a for agg, _ in curves.values() for a in agg["arm"].unique()})
    colors = colors or arm_colors(arms)
    fig = Figure(figsize=(4.2 * len(lags), 3.0 * len(curves)), layout="constrained")
    FigureCanvasAgg(fig)
    grid = fig.subplots(len(curves), len(lags), squeeze=False)
    for i, (name, (agg, raw)) in enumerate(curves.items()):
        for j, lag in enumerate(lags):
            ax = grid[i][j]
            _draw_curves(ax, agg[agg["lag"] == lag], raw[raw["lag"] == lag], colors)
            ax.set(title=f"{name}, lag {lag}", xlabel="learner step", ylabel=name)
            ax.grid(alpha=0.3)
    outside_legend(fig, [ax for line in grid for ax in line])
    return fig


def survival_figure(
    finished: pd.DataFrame, threshold: float, colors: dict[str, str] | None = None
) -> Figure | None:
    """Kaplan-Meier curves of 'not yet at the threshold' vs step, one panel per lag."""
    timed = finished[np.isfinite(finished["time_to_threshold"].to_numpy(dtype=float))]
    if timed.empty:
        return None
    colors = colors or arm_colors(list(timed["arm"].unique()))
    lags = sorted(timed["lag"].unique())
    fig, axes = _grid(len(lags), height=2.8)
    for ax, lag in zip(axes, lags, strict=True):
        for arm, cell in timed[timed["lag"] == lag].groupby("arm", sort=True):
            km = kaplan_meier(cell["time_to_threshold"], cell["reached_threshold"].astype(bool))
            end = float(cell["time_to_threshold"].max())
            xs = np.concatenate([[0.0], km.times, [end]])
            ys = np.concatenate([[1.0], km.survival, [km.survival[-1] if len(km.times) else 1.0]])
            ax.step(xs, ys, where="post", color=colors[arm], label=str(arm))
        ax.axhline(0.5, color="grey", ls=":", lw=1)
        ax.set(
            title=f"lag {lag}", xlabel="learner step", ylabel="P(not reached)", ylim=(-0.02, 1.02)
        )
        ax.grid(alpha=0.3)
    outside_legend(fig, axes)
    fig.suptitle(f"Time to pass rate >= {threshold:g} (Kaplan-Meier, censored trials included)")
    return fig
