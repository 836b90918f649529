"""Section "Staleness and utilisation": what each lag buys in throughput and utilisation, and
what it costs in score.

Per (arm, lag): learner steps per second, learner wait fraction, generator idle fraction and
mean per-token lag (mean across seeds with bootstrap intervals), and which lags are
Pareto-optimal on (throughput, final-score IQM): no other lag is at least as good on both and
better on one. A staleness regime other than the experiment's (partial rollouts, a weight-sync
interval) is an arm of its own (`learner.config.arm_staleness`), so the overall Pareto flags
mark the front over every regime and lag.
The Pareto flags and the trade-off figure compare lags, so an experiment with a single lag gets
neither (each lag would be plotted, and found optimal, against itself): only the throughput and
utilisation table, under a heading without "staleness".
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from analysis import figures
from analysis.config import ReportConfig
from analysis.render import Block
from analysis.sections.base import Inputs, Page, Part, figure, table
from analysis.stats import BootstrapSpec, aggregate_interval, iqm
from analysis.summary import interval_row, row
from analysis.trial_scores import by_condition

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

UTILISATION_METRICS = ("steps_per_s", "learner_wait_frac", "gen_idle_frac", "token_lag_mean")
METHODS: list[str] = []


def pareto_optimal(points: np.ndarray) -> np.ndarray:
    """Mask of rows of (K, 2) `points` not dominated when maximising both columns.

    Row j dominates i when j >= i in both and > in one; rows with a NaN are never optimal.
    """
    points = np.asarray(points, dtype=float)
    ok = np.isfinite(points).all(axis=1)
    mask = np.zeros(len(points), dtype=bool)
    for i in np.flatnonzero(ok):
        others = points[ok]
        dominated = np.any(np.all(others >= points[i], axis=1) & np.any(others > points[i], axis=1))
        mask[i] = not dominated
    return mask


def utilisation_rows(finished: pd.DataFrame, spec: BootstrapSpec) -> list[dict]:
    """Section `staleness`: mean throughput and utilisation fractions per (arm, lag)."""
    rows = []
    for column in UTILISATION_METRICS:
        for (arm, lag), values in by_condition(finished, column).items():
            if len(values) == 0:
                continue
            interval = aggregate_interval(values, "mean", spec)
            rows.append(interval_row("staleness", column, interval, arm=arm, lag=lag))
    return rows


def frontier_table(finished: pd.DataFrame, scored: pd.DataFrame) -> pd.DataFrame:
    """(arm, lag, steps_per_s mean, final-score IQM, within-arm and overall Pareto flags)."""
    speed = {
        k: float(np.mean(v)) if len(v) else np.nan
        for k, v in by_condition(finished, "steps_per_s").items()
    }
    score = {
        k: float(iqm(v)) if len(v) else np.nan
        for k, v in by_condition(scored, "final_score").items()
    }
    keys = sorted(set(speed) | set(score))
    table = pd.DataFrame(
        [(a, lag, speed.get((a, lag), np.nan), score.get((a, lag), np.nan)) for a, lag in keys],
        columns=["arm", "lag", "steps_per_s", "final_iqm"],
    )
    if table.empty:
        return table.assign(pareto_within_arm=[], pareto_overall=[])
    points = table[["steps_per_s", "final_iqm"]].to_numpy()
    table["pareto_overall"] = pareto_optimal(points)
    table["pareto_within_arm"] = False
    for _, idx in table.groupby("arm").groups.items():
        table.loc[idx, "pareto_within_arm"] = pareto_optimal(points[np.asarray(idx)])
    return table


def frontier_rows(frontier: pd.DataFrame) -> list[dict]:
    """Pareto flags as 1/0 rows of section `staleness` (statistic pareto_*)."""
    rows = []
    for r in frontier.itertuples(index=False):
        keys = {"arm": r.arm, "lag": int(r.lag)}
        note = (
            "" if np.isfinite([r.steps_per_s, r.final_iqm]).all() else "throughput or score missing"
        )
        rows.append(
            row("staleness", "pareto_within_arm", float(r.pareto_within_arm), note=note, **keys)
        )
        rows.append(row("staleness", "pareto_overall", float(r.pareto_overall), note=note, **keys))
    return rows


def several_lags(trials: pd.DataFrame) -> bool:
    """True when the trials ran more than one lag: only then is there a trade-off to show."""
    return bool(len(trials)) and trials["lag"].nunique() > 1


def staleness_rows(finished: pd.DataFrame, scored: pd.DataFrame, spec: BootstrapSpec) -> list[dict]:
    """All staleness-study rows: utilisation, and the Pareto flags when lags vary."""
    if finished.empty:
        return []
    rows = utilisation_rows(finished, spec)
    if several_lags(finished):
        rows += frontier_rows(frontier_table(finished, scored))
    return rows


def analyse(inputs: Inputs, prior: pd.DataFrame) -> Part:
    done, scored = inputs.done, inputs.scored
    frontier = frontier_table(done, scored) if several_lags(done) else pd.DataFrame()
    return Part(staleness_rows(done, scored, inputs.spec), {"frontier": frontier})


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


def _frontier_panel(ax: Axes, frontier: pd.DataFrame, colors: dict[str, str]) -> None:
    """Throughput vs final-score IQM per arm, each arm's Pareto-optimal lags ringed, and the
    front over every arm and lag (with regimes as arms: over every regime) dashed."""
    front = frontier[frontier["pareto_overall"]].sort_values("steps_per_s")
    if len(frontier["arm"].unique()) > 1 and len(front):
        ax.plot(
            front["steps_per_s"],
            front["final_iqm"],
            "k--",
            lw=1,
            zorder=0,
            label="Pareto front over all arms",
        )
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
        title="trade-off (ringed = Pareto-optimal lag of its arm)",
        xlabel="steps / s",
        ylabel="final score IQM",
    )


def staleness_figure(
    summary: pd.DataFrame, frontier: pd.DataFrame, colors: dict[str, str] | None = None
) -> Figure | None:
    """Score, throughput and utilisation against lag, and the throughput/score frontier; None
    with fewer than two lags (every panel would be one point per arm)."""
    stale = summary[summary["section"] == "staleness"]
    final = summary[(summary["section"] == "final_score") & (summary["statistic"] == "iqm")]
    final = final[final["lag"].notna()]
    if pd.concat([stale["lag"], final["lag"]]).dropna().nunique() < 2:
        return None
    colors = colors or figures.arm_colors(list(summary["arm"].dropna().unique()))
    fig, axes = figures.grid(6, width=5.0, height=3.6, max_cols=2)
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
    _by_lag(axes[3], stale[stale["statistic"] == "token_lag_mean"], colors)
    axes[3].set(title="per-token lag (mean)", xlabel="lag", ylabel="versions behind the learner")
    _frontier_panel(axes[4], frontier, colors)
    axes[5].remove()  # five panels in a 2-column grid
    axes = axes[:5]
    for a in axes:
        a.grid(alpha=0.3)
    figures.outside_legend(fig, axes)
    return fig


def draw(
    part: Part, summary: pd.DataFrame, colors: dict[str, str], config: ReportConfig
) -> dict[str, Figure | None]:
    return {"staleness_tradeoff": staleness_figure(summary, part.tables["frontier"], colors)}


def blocks(page: Page) -> list[Block]:
    rows = page.summary[page.summary["section"] == "staleness"]
    if rows.empty:
        return []
    if rows["lag"].nunique() < 2:
        return [
            Block("h2", "Throughput and utilisation"),
            *table(
                page.summary,
                "staleness",
                "Throughput and utilisation per arm",
                "Learner steps/s (1 / median step time), learner wait and generator idle "
                "fractions, mean per-token lag: mean across seeds with CI. One lag ran, so there "
                "is no staleness "
                "trade-off to show.",
            ),
        ]
    return [
        Block("h2", "Staleness and utilisation"),
        *table(
            page.summary,
            "staleness",
            "Throughput and utilisation by lag",
            "Learner steps/s (1 / median step time), learner wait and generator idle "
            "fractions, mean per-token lag (versions between the policy that sampled a response "
            "token and the learner step that trained it): mean across seeds with CI. pareto_* "
            "= 1 if the lag is Pareto-optimal on "
            "(throughput, final-score IQM) within the arm / over all arms and lags.",
        ),
        *figure(
            page.figures,
            "staleness_tradeoff",
            "Staleness trade-off: score, throughput, utilisation and per-token lag vs lag.",
        ),
    ]
