"""Section "Compute-matched comparison": learning curves of the primary score against steps,
tokens and wall-clock time.

Arms differ in how much compute a learner step costs (a lag lets the learner run ahead; PPO
trains a critic), so equal steps is not equal compute. Each trial's eval curve is re-indexed by
three budgets: learner steps, cumulative generated tokens (`tokens/generated` summed over steps:
every response read, trained or dropped) and seconds since the trial's first learner update
began (`analysis.wall_clock`: start-up is left out, and shown per trial in the Trials table);
each curve is linearly interpolated onto a grid shared by the trials compared at one lag. The
grid spans only the budget every compared trial reached (from the largest first point to the
smallest last point): nothing is extrapolated, so a faster arm is not credited with scores it
never measured.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from analysis.config import ReportConfig
from analysis.curves import band_rows, iqm_bands
from analysis.figures import MAX_COLS, arm_colors, outside_legend
from analysis.render import Block
from analysis.sections.base import Inputs, Page, Part, figure, table
from analysis.stats import BootstrapSpec
from analysis.summary import row
from analysis.wall_clock import training_seconds
from contract import metrics as mn

if TYPE_CHECKING:
    from matplotlib.axes import Axes

TOKENS_GENERATED = mn.TOKENS_GENERATED  # absent from trials written before it existed
AXES = {
    "step": "learner steps",
    "tokens": "generated tokens",
    "seconds": "wall-clock seconds from first update",
}
GRID_POINTS = 21  # 20 intervals: the budget fractions below fall on grid points
BUDGETS = (0.25, 0.5, 1.0)  # fractions of the common range at which the leader is named
CURVE_COLUMNS = ["arm", "lag", "trial_name", "seed", "axis", "x", "value"]
METHODS = [
    "Compute-matched curves: each trial's primary eval curve against learner steps, cumulative "
    "generated tokens (`tokens/generated`, trained and dropped groups) and seconds since the "
    "trial's first learner update began (its first batch in hand: the row's timestamp less "
    "perf/learner_step_s x (1 - perf/learner_wait_frac)), so start-up - process start, model "
    "load, initial eval, the wait for the first batch while generators start - is not on the "
    "curve (it is the Trials table's startup_s); the step-0 eval of the initial weights sits "
    "at 0 s. Curves are linearly interpolated "
    "onto a grid per lag that spans only the budget every compared trial reached (no "
    "extrapolation); IQM across seeds with bootstrap bands. "
    "Diverged trials are left out of them.",
]


def budget_axes(trial: pd.DataFrame) -> pd.DataFrame:
    """One trial's eval rows with their step, cumulative tokens and training seconds.

    Tokens are summed over every step (NaN = none logged that step counts 0) up to and including
    the eval's step; NaN throughout when the trial never logged `tokens/generated`. Seconds
    count from the first learner update (`wall_clock.training_seconds`): start-up (model load,
    generator start; seconds to tens of seconds that differ per trial) would otherwise shift
    each curve by its own amount and leave short trials no common time range. The eval at step
    0 scores the initial weights, which hold until the first update, so it sits at 0 s.
    """
    trial = trial.sort_values(mn.STEP)
    values = trial[mn.EVAL_PASS_RATE].to_numpy(dtype=float)
    if TOKENS_GENERATED in trial.columns and trial[TOKENS_GENERATED].notna().any():
        tokens = np.cumsum(np.nan_to_num(trial[TOKENS_GENERATED].to_numpy(dtype=float)))
    else:
        tokens = np.full(len(trial), np.nan)
    keep = np.isfinite(values)
    steps = trial[mn.STEP].to_numpy(dtype=float)
    seconds = np.where(steps == 0, 0.0, training_seconds(trial))
    return pd.DataFrame(
        {
            "step": steps[keep],
            "tokens": tokens[keep],
            "seconds": seconds[keep],
            "value": values[keep],
        }
    )


def completed(scored: pd.DataFrame) -> pd.DataFrame:
    """Scored trials that did not diverge: a diverged trial spent no tokens or time after its
    drop, so it has no score at larger budgets and would cut every lag's common range short
    (its divergence is counted in the Stability section)."""
    return scored[~scored["diverged"].astype(bool)] if len(scored) else scored


def budget_curves(metrics: pd.DataFrame, scored: pd.DataFrame) -> pd.DataFrame:
    """Long table (CURVE_COLUMNS) of every scored trial's eval curve on each budget axis."""
    if metrics.empty or scored.empty or mn.EVAL_PASS_RATE not in metrics.columns:
        return pd.DataFrame(columns=CURVE_COLUMNS)
    by_trial = dict(tuple(metrics.groupby("trial_name", sort=False)))
    out = []
    for t in scored.itertuples(index=False):
        if t.trial_name not in by_trial:
            continue
        curve = budget_axes(by_trial[t.trial_name])
        for axis in AXES:
            part = curve[np.isfinite(curve[axis].to_numpy(dtype=float))]
            keys = {"arm": t.arm, "lag": int(t.lag), "trial_name": t.trial_name, "seed": t.seed}
            out.append(
                pd.DataFrame({**keys, "axis": axis, "x": part[axis], "value": part["value"]})
            )
    return pd.concat(out, ignore_index=True) if out else pd.DataFrame(columns=CURVE_COLUMNS)


def common_grid(curves: dict[str, tuple[np.ndarray, np.ndarray]], points: int) -> np.ndarray:
    """Grid over [max of first x, min of last x] across the trials; empty if they share none."""
    if not curves:
        return np.array([], dtype=float)
    lo = max(float(x[0]) for x, _ in curves.values())
    hi = min(float(x[-1]) for x, _ in curves.values())
    if not hi > lo:
        return np.array([], dtype=float)
    return np.linspace(lo, hi, points)


def _monotone(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted by x with repeated x values collapsed to their last y (steps with no new tokens)."""
    order = np.argsort(x, kind="stable")
    x, y = x[order], y[order]
    last = np.append(x[1:] != x[:-1], True)
    return x[last], y[last]


def interpolate(
    trials: dict[str, tuple[np.ndarray, np.ndarray]], points: int = GRID_POINTS
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """(grid, {trial: values on the grid}) by linear interpolation, no extrapolation."""
    clean = {
        name: _monotone(np.asarray(x, float), np.asarray(y, float))
        for name, (x, y) in trials.items()
    }
    clean = {name: c for name, c in clean.items() if len(c[0])}
    grid = common_grid(clean, points)
    return grid, {name: np.interp(grid, x, y) for name, (x, y) in clean.items()}


def matched_curves(curves: pd.DataFrame, points: int = GRID_POINTS) -> pd.DataFrame:
    """Per (axis, lag): every trial's curve on the lag's common grid (CURVE_COLUMNS)."""
    out = []
    for (axis, lag), group in curves.groupby(["axis", "lag"], sort=True):
        meta = group.drop_duplicates("trial_name").set_index("trial_name")
        trials = {
            name: (g["x"].to_numpy(dtype=float), g["value"].to_numpy(dtype=float))
            for name, g in group.groupby("trial_name", sort=True)
        }
        grid, values = interpolate(trials, points)
        for name, ys in values.items():
            keys = {"arm": meta.loc[name, "arm"], "lag": lag, "trial_name": name}
            keys |= {"seed": meta.loc[name, "seed"], "axis": axis}
            out.append(pd.DataFrame({**keys, "x": grid, "value": ys}))
    return pd.concat(out, ignore_index=True) if out else pd.DataFrame(columns=CURVE_COLUMNS)


def aggregate_matched(matched: pd.DataFrame, spec: BootstrapSpec) -> pd.DataFrame:
    """IQM across seeds with a bootstrap band at each (axis, lag, arm, grid point)."""
    return iqm_bands(matched, ["axis", "lag", "arm", "x"], spec)


def curve_summary_rows(agg: pd.DataFrame) -> list[dict]:
    """Section `compute_curves`: the aggregated curves; `comparison` = '<axis> <x>'."""
    return band_rows(agg, "compute_curves", lambda r: f"{r.axis} {r.x:.6g}")


def _budget_label(axis: str, fraction: float, x: float) -> str:
    amount = f"{x:,.1f}" if axis == "seconds" else f"{x:,.0f}"
    return f"{axis}: {fraction:.2f} of common range ({amount})"


def leader_rows(agg: pd.DataFrame) -> list[dict]:
    """Section `compute_matched`: at each budget, the arm with the highest IQM and its rival.

    `arm` is the leader; `leader_iqm` and `runner_up_iqm` carry their intervals; the note says
    whether the two intervals overlap (if they do, the lead is not established at that budget).
    """
    rows = []
    for (axis, lag), group in agg.groupby(["axis", "lag"], sort=True):
        grid = np.sort(group["x"].unique())
        if group["arm"].nunique() < 2 or len(grid) < 2:
            continue
        for fraction in BUDGETS:
            x = grid[round(fraction * (len(grid) - 1))]
            at = group[group["x"] == x].sort_values("iqm", ascending=False)
            lead, rival = at.iloc[0], at.iloc[1]
            if pd.isna(lead["low"]) or pd.isna(rival["high"]):
                verdict = "no intervals (fewer than 2 seeds)"
            elif lead["low"] > rival["high"]:
                verdict = "intervals do not overlap"
            else:
                verdict = "intervals overlap"
            note = f"runner-up {rival['arm']}; {verdict}"
            common = {"arm": str(lead["arm"]), "lag": int(lag)}
            common["comparison"] = _budget_label(axis, fraction, float(x))
            rows += [
                {
                    **row(
                        "compute_matched",
                        name,
                        arm_row["iqm"],
                        ci_low=arm_row["low"],
                        ci_high=arm_row["high"],
                        n=int(arm_row["n"]),
                        **common,
                    ),
                    "note": note,
                }
                for name, arm_row in (("leader_iqm", lead), ("runner_up_iqm", rival))
            ]
    return rows


def compute_matched_rows(agg: pd.DataFrame) -> list[dict]:
    """Both compute-matched sections."""
    return leader_rows(agg) + curve_summary_rows(agg)


def analyse(inputs: Inputs, prior: pd.DataFrame) -> Part:
    """Curves on common budget grids, and who leads at equal budgets."""
    curves = budget_curves(inputs.experiment.metrics, completed(inputs.scored))
    agg = aggregate_matched(matched_curves(curves), inputs.curve_spec)
    rows = compute_matched_rows(agg) if len(inputs.scored) else []
    return Part(rows, {"curves": agg})


def _panel(ax: Axes, part: pd.DataFrame, colors: dict[str, str]) -> None:
    for arm, line in part.groupby("arm", sort=True):
        ax.plot(line["x"], line["iqm"], color=colors[arm], lw=1.8, label=str(arm))
        if line["low"].notna().any():
            ax.fill_between(line["x"], line["low"], line["high"], color=colors[arm], alpha=0.15)
    ax.grid(alpha=0.3)


def compute_matched_figure(
    agg: pd.DataFrame, colors: dict[str, str] | None = None, confidence: float = 0.95
) -> Figure | None:
    """Primary score against steps, tokens and seconds: a row per budget axis, a column per lag
    (wrapped past MAX_COLS lags); IQM across seeds with bands, on each lag's common grid."""
    if agg.empty:
        return None
    colors = colors or arm_colors(list(agg["arm"].dropna().unique()))
    axes_present = [a for a in AXES if (agg["axis"] == a).any()]
    lags = sorted(int(lag) for lag in agg["lag"].unique())
    cols = min(len(lags), MAX_COLS)
    rows = len(axes_present) * math.ceil(len(lags) / cols)
    fig = Figure(figsize=(4.0 * cols, 2.9 * rows), layout="constrained")
    FigureCanvasAgg(fig)
    grid = fig.subplots(rows, cols, squeeze=False)
    used = []
    for i, axis in enumerate(axes_present):
        for j, lag in enumerate(lags):
            ax = grid[(j // cols) * len(axes_present) + i][j % cols]
            used.append(ax)
            _panel(ax, agg[(agg["axis"] == axis) & (agg["lag"] == lag)], colors)
            ax.set(title=f"lag {lag}", xlabel=AXES[axis], ylabel="eval pass rate")
    for ax in np.ravel(grid):
        if ax not in used:
            ax.set_visible(False)
    outside_legend(fig, used)
    fig.suptitle(
        f"Compute-matched: IQM across seeds, {confidence:.0%} band; common budget range per lag"
    )
    return fig


def draw(
    part: Part, summary: pd.DataFrame, colors: dict[str, str], config: ReportConfig
) -> dict[str, Figure | None]:
    fig = compute_matched_figure(part.tables["curves"], colors, config.confidence)
    return {"compute_matched": fig}


def blocks(page: Page) -> list[Block]:
    """Compute-matched curves and who leads at equal budgets."""
    if not page.any_scored or not page.has("compute_curves"):
        return []
    return [
        Block("h2", "Compute-matched comparison"),
        *figure(
            page.figures,
            "compute_matched",
            "Primary eval score against learner steps, generated tokens and wall-clock seconds. "
            "Seconds count from each trial's first learner update, so start-up (model load, "
            "generator start, initial eval) is not on the curve: it is startup_s in the Trials "
            "table.",
        ),
        *table(
            page.summary,
            "compute_matched",
            "Which arm leads at equal budget",
            "At a quarter, half and all of the budget range every trial of the lag reached: the "
            "arm with the highest IQM (arm column) and the runner-up, with CIs; when the "
            "intervals overlap the lead is not established. Diverged trials are left out of "
            "these curves (no score exists past their drop). n = seeds.",
            skip_empty=True,  # one arm per lag: no one to lead
        ),
    ]
