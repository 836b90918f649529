"""Section "Stability" per arm: divergence and collapse rates, gradient spikes, KL, clipping,
time to threshold.

Divergence (a non-finite or exploding loss ends the trial) and collapse (a trial that ran to its
end but finished more than `collapse_drop` below its own best eval: the slow decline the GSPO
paper reports for GRPO on MoE models) are counts of k events in N trials: the Wilson score
interval (Wilson 1927) keeps sensible coverage at the tiny N and k = 0 or N typical here, where
the Wald interval collapses to zero width (Brown, Cai & DasGupta 2001). Arms are compared with
Fisher's exact test, pooled over lags. Time to threshold uses the Kaplan-Meier estimator
(analysis.stats.survival). The clip-fraction and KL trajectories are IQM curves across seeds.
"""

from __future__ import annotations

import itertools
import math
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from analysis.config import ReportConfig
from analysis.curves import aggregate_curves, bin_steps, curve_rows, trial_curves
from analysis.figures import arm_colors, draw_curves, lag_grid, outside_legend
from analysis.render import Block
from analysis.sections.base import Inputs, Measure, Page, Part, figure, measure_rows, table
from analysis.stats import BootstrapSpec, wilson
from analysis.stats.significance import fisher, holm
from analysis.stats.survival import kaplan_meier, median_time
from analysis.summary import row
from contract import metrics as mn

if TYPE_CHECKING:
    from matplotlib.axes import Axes

STABILITY_METRICS = ("grad_spike_rate", "max_kl_old", "clip_frac_mean", "peak_drop")
DIAGNOSTICS = {"clip fraction": mn.POLICY_CLIP_FRAC, "KL to old policy": mn.POLICY_KL_OLD}
METHODS = [
    "Divergence rates: Wilson score interval (Wilson 1927; Brown, Cai & DasGupta 2001) and "
    "Fisher's exact test (Fisher 1922). Time to threshold: Kaplan-Meier product-limit estimator "
    "(Kaplan & Meier 1958) with non-reaching trials right-censored at their last eval.",
]


def _rate_row(
    section: str, statistic: str, k: int, n: int, confidence: float, **keys: object
) -> dict:
    low, high = wilson(k, n, confidence)
    value = k / n if n else math.nan
    return row(section, statistic, value, ci_low=low, ci_high=high, n=n, note=f"{k}/{n}", **keys)


def event_rows(
    finished: pd.DataFrame, column: str, section: str, statistic: str, confidence: float
) -> list[dict]:
    """Section `section`: the fraction k/N of finished trials with the 0/1 `column` set, per arm
    (all lags) and per (arm, lag); a trial whose flag is NaN (nothing to judge) is not counted."""
    judged = finished[np.isfinite(finished[column].to_numpy(dtype=float))]
    rows = []
    for arm, group in judged.groupby("arm", sort=True):
        k, n = int(group[column].sum()), len(group)
        rows.append(_rate_row(section, statistic, k, n, confidence, arm=arm))
        for lag, cell in group.groupby("lag", sort=True):
            k, n = int(cell[column].sum()), len(cell)
            rows.append(_rate_row(section, statistic, k, n, confidence, arm=arm, lag=int(lag)))
    return rows


def event_tests(finished: pd.DataFrame, column: str, section: str, alpha: float) -> list[dict]:
    """Section `section`: Fisher's exact test of the 0/1 `column` for every arm pair (pooled
    over lags), Holm-adjusted over the pairs."""
    judged = finished[np.isfinite(finished[column].to_numpy(dtype=float))]
    counts = judged.groupby("arm", sort=True)[column].agg(["sum", "count"])
    rows = []
    for x, y in itertools.combinations(counts.index, 2):
        kx, nx = int(counts.loc[x, "sum"]), int(counts.loc[x, "count"])
        ky, ny = int(counts.loc[y, "sum"]), int(counts.loc[y, "count"])
        result = fisher(kx, nx, ky, ny, alpha)
        note = f"{kx}/{nx} vs {ky}/{ny}" + (f"; {result.note}" if result.note else "")
        rows.append(
            row(section, "fisher_p", result.p_value, comparison=f"{x} vs {y}", n=nx + ny, note=note)
        )
    adjusted = holm(np.array([r["value"] for r in rows]))
    holm_note = f"Holm over {int(np.isfinite(adjusted).sum())} comparisons"
    rows += [
        {**r, "statistic": "fisher_p_holm", "value": float(p), "note": holm_note}
        for r, p in zip(rows, adjusted, strict=True)
    ]
    return rows


def divergence_rows(finished: pd.DataFrame, confidence: float) -> list[dict]:
    """Section `divergence`: diverged fraction k/N per arm (all lags) and per (arm, lag)."""
    flags = finished.assign(diverged=finished["diverged"].astype(float))
    return event_rows(flags, "diverged", "divergence", "diverged_frac", confidence)


def fisher_rows(finished: pd.DataFrame, alpha: float) -> list[dict]:
    """Section `divergence_tests`: Fisher's exact test for every arm pair, Holm-adjusted."""
    flags = finished.assign(diverged=finished["diverged"].astype(float))
    return event_tests(flags, "diverged", "divergence_tests", alpha)


def collapse_rows(finished: pd.DataFrame, confidence: float, alpha: float) -> list[dict]:
    """Sections `collapse` and `collapse_tests`: the share of finished trials whose final score
    fell more than `ReportConfig.collapse_drop` below their own peak, and its Fisher tests."""
    if "collapsed" not in finished.columns:
        return []
    return event_rows(finished, "collapsed", "collapse", "collapsed_frac", confidence) + (
        event_tests(finished, "collapsed", "collapse_tests", alpha)
    )


def metric_rows(finished: pd.DataFrame, spec: BootstrapSpec) -> list[dict]:
    """Section `stability`: mean across seeds of spike rate, max KL, mean clip fraction and the
    drop from the best eval to the final score."""
    return measure_rows(finished, "stability", [Measure(c) for c in STABILITY_METRICS], spec)


def threshold_rows(finished: pd.DataFrame, threshold: float, confidence: float) -> list[dict]:
    """Section `time_to_threshold`: Kaplan-Meier median steps and the fraction that got there."""
    rows = []
    timed = finished[np.isfinite(finished["time_to_threshold"].to_numpy(dtype=float))]
    for (arm, lag), cell in timed.groupby(["arm", "lag"], sort=True):
        km = kaplan_meier(cell["time_to_threshold"], cell["reached_threshold"].astype(bool))
        median = median_time(km)
        k, n = int(cell["reached_threshold"].sum()), len(cell)
        note = "" if median is not None else f"median not reached (pass rate >= {threshold:g})"
        keys = {"arm": str(arm), "lag": int(lag)}
        rows.append(
            row(
                "time_to_threshold",
                "median_steps",
                math.nan if median is None else median,
                n=n,
                note=note,
                **keys,
            )
        )
        reached = _rate_row("time_to_threshold", "reached_frac", k, n, confidence, **keys)
        rows.append({**reached, "note": f"{k}/{n} reached"})
    return rows


def stability_rows(
    finished: pd.DataFrame, spec: BootstrapSpec, alpha: float, threshold: float
) -> list[dict]:
    """All stability sections for trials that ran to an end (completed or diverged)."""
    if finished.empty:
        return []
    return (
        divergence_rows(finished, spec.confidence)
        + fisher_rows(finished, alpha)
        + collapse_rows(finished, spec.confidence, alpha)
        + metric_rows(finished, spec)
        + threshold_rows(finished, threshold, spec.confidence)
    )


def diagnostic_curves(inputs: Inputs) -> dict[str, tuple[pd.DataFrame, pd.DataFrame]]:
    """{label: (IQM across seeds per binned step, per-seed binned values)} of DIAGNOSTICS."""
    out = {}
    for label, column in DIAGNOSTICS.items():
        per_seed = trial_curves(inputs.experiment.metrics, inputs.done, column)
        per_seed = bin_steps(per_seed, inputs.config.curve_points)
        out[label] = (aggregate_curves(per_seed, None), per_seed)
    return out


def analyse(inputs: Inputs, prior: pd.DataFrame) -> Part:
    """Stability tables, and the clip/KL curves (sections `curve_<label>`, for the figure)."""
    config = inputs.config
    rows = stability_rows(inputs.done, inputs.spec, config.alpha, config.pass_threshold)
    curves = diagnostic_curves(inputs)
    for label, (agg, _) in curves.items():
        rows += curve_rows(agg, f"curve_{label.replace(' ', '_').lower()}")
    return Part(rows, {"diagnostics": curves, "done": inputs.done})


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
            draw_curves(ax, agg[agg["lag"] == lag], raw[raw["lag"] == lag], colors)
            ax.set(title=f"{name}, lag {lag}", xlabel="learner step", ylabel=name)
            ax.grid(alpha=0.3)
    outside_legend(fig, [ax for line in grid for ax in line])
    return fig


def _survival_panel(ax: Axes, cells: pd.DataFrame, colors: dict[str, str]) -> None:
    for arm, cell in cells.groupby("arm", sort=True):
        km = kaplan_meier(cell["time_to_threshold"], cell["reached_threshold"].astype(bool))
        end = float(cell["time_to_threshold"].max())
        xs = np.concatenate([[0.0], km.times, [end]])
        ys = np.concatenate([[1.0], km.survival, [km.survival[-1] if len(km.times) else 1.0]])
        ax.step(xs, ys, where="post", color=colors[arm], label=str(arm))
    ax.axhline(0.5, color="grey", ls=":", lw=1)
    ax.grid(alpha=0.3)


def survival_figure(
    finished: pd.DataFrame, threshold: float, colors: dict[str, str] | None = None
) -> Figure | None:
    """Kaplan-Meier curves of 'not yet at the threshold' vs step, one panel per lag."""
    timed = finished[np.isfinite(finished["time_to_threshold"].to_numpy(dtype=float))]
    if timed.empty:
        return None
    colors = colors or arm_colors(list(timed["arm"].unique()))

    def panel(ax: Axes, lag: int) -> None:
        _survival_panel(ax, timed[timed["lag"] == lag], colors)
        ax.set(
            title=f"lag {lag}", xlabel="learner step", ylabel="P(not reached)", ylim=(-0.02, 1.02)
        )

    title = f"Time to pass rate >= {threshold:g} (Kaplan-Meier, censored trials included)"
    return lag_grid(sorted(timed["lag"].unique()), panel, title, height=2.8)


def draw(
    part: Part, summary: pd.DataFrame, colors: dict[str, str], config: ReportConfig
) -> dict[str, Figure | None]:
    done = part.tables["done"]
    return {
        "clip_kl": diagnostics_figure(part.tables["diagnostics"], colors),
        "time_to_threshold": (
            survival_figure(done, config.pass_threshold, colors) if len(done) else None
        ),
    }


def blocks(page: Page) -> list[Block]:
    summary, figs, config = page.summary, page.figures, page.config
    return [
        Block("h2", "Stability"),
        *table(
            summary,
            "divergence",
            "Divergence",
            "Fraction of finished trials that diverged, k/N with Wilson CI; 'all' = all lags.",
        ),
        *table(
            summary,
            "divergence_tests",
            "Divergence: Fisher's exact test",
            "Arm pairs pooled over lags; n = trials of both arms.",
            skip_empty=True,  # one arm: no pair
        ),
        *table(
            summary,
            "collapse",
            "Collapse",
            f"Fraction of finished trials whose final score is more than "
            f"{config.collapse_drop:g} below the best eval they reached (`collapse_drop`), k/N "
            "with Wilson CI; 'all' = all lags. A diverged trial scores 0 and counts once its "
            "peak was above that.",
        ),
        *table(
            summary,
            "collapse_tests",
            "Collapse: Fisher's exact test",
            "Arm pairs pooled over lags; n = trials of both arms.",
            skip_empty=True,  # one arm: no pair
        ),
        *table(
            summary,
            "stability",
            "Gradient spikes, KL and clipping",
            f"Mean across seeds with CI of: spikes per step (optim/grad_spikes, else grad "
            f"norm > {config.spike_factor:g} x trailing median of {config.spike_window} "
            f"steps), max KL to the old policy, mean clip fraction, and the drop from the "
            f"best eval to the final score (peak_drop).",
        ),
        *figure(
            figs,
            "clip_kl",
            "Clip fraction and KL to the old policy (IQM across seeds, seeds thin).",
        ),
        *table(
            summary,
            "time_to_threshold",
            "Time to threshold",
            f"Kaplan-Meier median learner steps to eval pass rate >= {config.pass_threshold:g}; "
            "trials that never reach it are censored at their last eval.",
        ),
        *figure(
            figs, "time_to_threshold", "Kaplan-Meier curves of time to the pass-rate threshold."
        ),
    ]
