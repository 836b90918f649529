"""Section "Staleness and utilisation": what each lag buys in throughput and utilisation, and
what it costs in score.

Per (arm, lag): learner steps per second, learner wait fraction, generator idle fraction, mean
per-token lag and how far the stale behaviour policies were from the learner
(`staleness/kl_behavior`, k3; mean across seeds with bootstrap intervals). Per arm: its *max
safe lag*, the largest lag up to which every lag is non-inferior to the arm's smallest lag
(`claims`: Holm over every Findings line), with its throughput there: the knee of the
trade-off. And which lags are Pareto-optimal on (throughput, final score) where the statistics
support it: a lag is dominated by one at least as fast whose score is not detectably lower, and
that is faster or detectably better (paired t-test over seeds, Holm over every pair compared);
score differences the seeds cannot resolve count as ties, so a front is never drawn through
noise. A staleness regime other than the experiment's (partial rollouts, a weight-sync
interval) is an arm of its own (`learner.config.arm_staleness`), so the overall Pareto flags
mark the front over every regime and lag.
The Pareto flags and the trade-off figure compare lags, so an experiment with a single lag gets
neither (each lag would be plotted, and found optimal, against itself): only the throughput and
utilisation table, under a heading without "staleness".
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from analysis.config import ReportConfig
from analysis.figures import arm_colors, grid, outside_legend
from analysis.render import Block
from analysis.sections.base import Inputs, Measure, Page, Part, figure, measure_rows, table
from analysis.sections.claims import adjusted_p_values
from analysis.sections.lag_effects import lag_label, max_safe_lag
from analysis.stats import BootstrapSpec, iqm
from analysis.stats.significance import holm, paired_t
from analysis.summary import row
from analysis.trial_scores import by_condition, paired_by_seed, seed_values

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

UTILISATION_METRICS = (
    "steps_per_s",
    "learner_wait_frac",
    "gen_idle_frac",
    "token_lag_mean",
    "kl_behavior_mean",
)
METHODS: list[str] = []


def utilisation_rows(finished: pd.DataFrame, spec: BootstrapSpec) -> list[dict]:
    """Section `staleness`: mean throughput and utilisation fractions per (arm, lag)."""
    return measure_rows(finished, "staleness", [Measure(c) for c in UTILISATION_METRICS], spec)


def mean_speed(finished: pd.DataFrame) -> dict[tuple[str, int], float]:
    """{(arm, lag): mean learner steps/s over seeds} (NaN where no trial measured it)."""
    return {
        k: float(np.mean(v)) if len(v) else np.nan
        for k, v in by_condition(finished, "steps_per_s").items()
    }


def detectably_better(seed_scores: list[pd.Series], alpha: float) -> np.ndarray:
    """better[i, j]: condition i's final score is detectably above condition j's.

    Each pair is compared over the seeds both ran (a paired t-test: matched conditions share
    the seed's prompts and initial weights), Holm-adjusted over every pair compared here;
    fewer than 2 shared seeds, or no spread in the differences, is no evidence either way.
    """
    k = len(seed_scores)
    compared = list(itertools.combinations(range(k), 2))
    p_values, signs = [], []
    for i, j in compared:
        both = paired_by_seed(seed_scores[i], seed_scores[j])
        p_values.append(paired_t(both["x"].to_numpy(), both["y"].to_numpy()).p_value)
        signs.append(float(np.sign((both["x"] - both["y"]).mean())) if len(both) else 0.0)
    adjusted = holm(np.array(p_values, dtype=float))
    better = np.zeros((k, k), dtype=bool)
    for (i, j), p, sign in zip(compared, adjusted, signs, strict=True):
        if np.isfinite(p) and p < alpha and sign != 0:
            better[(i, j) if sign > 0 else (j, i)] = True
    return better


def supported_front(speed: np.ndarray, scored: np.ndarray, better: np.ndarray) -> np.ndarray:
    """Mask of conditions on the (throughput, score) front the statistics support.

    j dominates i when j is at least as fast, i is not detectably better than j, and j is
    faster or detectably better. Score differences the seeds do not resolve are ties, so among
    tied scores only the fastest condition stays. A condition without a throughput or without
    scores (`scored` False) is never on the front and dominates nothing.
    """
    speed = np.asarray(speed, dtype=float)
    ok = np.isfinite(speed) & np.asarray(scored, dtype=bool)
    mask = np.zeros(len(speed), dtype=bool)
    for i in np.flatnonzero(ok):
        mask[i] = not any(
            speed[j] >= speed[i] and not better[i, j] and (speed[j] > speed[i] or better[j, i])
            for j in np.flatnonzero(ok)
            if j != i
        )
    return mask


def frontier_table(finished: pd.DataFrame, scored: pd.DataFrame, alpha: float) -> pd.DataFrame:
    """(arm, lag, steps_per_s mean, final-score IQM, within-arm and overall front flags)."""
    speed = mean_speed(finished)
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
    per_seed = [seed_values(scored, "final_score", a, lag) for a, lag in keys]
    fast, has_score = table["steps_per_s"].to_numpy(), table["final_iqm"].notna().to_numpy()
    table["pareto_overall"] = supported_front(fast, has_score, detectably_better(per_seed, alpha))
    table["pareto_within_arm"] = False
    for _, idx in table.groupby("arm").groups.items():
        at = np.asarray(idx)
        better = detectably_better([per_seed[i] for i in at], alpha)
        table.loc[idx, "pareto_within_arm"] = supported_front(fast[at], has_score[at], better)
    return table


def safe_lag_rows(finished: pd.DataFrame, prior: pd.DataFrame, alpha: float) -> list[dict]:
    """Section `max_safe_lag`: per arm with several lags, its max safe lag (`max_safe_lag`) and
    the learner throughput there, absolute and as a multiple of its smallest lag's."""
    adjusted = adjusted_p_values(prior)
    speed = mean_speed(finished)
    rows = []
    for arm, group in finished.groupby("arm", sort=True):
        lags = sorted(int(lag) for lag in group["lag"].unique())
        if len(lags) < 2:
            continue
        base = lags[0]
        p_holm = {
            lag: adjusted.get((str(arm), lag, lag_label(lag, base), "final_score_margin_p_holm"))
            for lag in lags[1:]
        }
        if any(p is None for p in p_holm.values()):
            continue  # no matched scores at some lag: nothing was tested
        safe = max_safe_lag(p_holm, base, alpha)
        at_safe, at_base = speed.get((str(arm), safe), np.nan), speed.get((str(arm), base), np.nan)
        keys = {"arm": str(arm), "lag": safe}
        note = f"every lag up to {safe} non-inferior to lag {base}" if safe != base else ""
        rows += [
            row("max_safe_lag", "max_safe_lag", float(safe), note=note, **keys),
            row("max_safe_lag", "steps_per_s", at_safe, **keys),
            row("max_safe_lag", "speedup", at_safe / at_base, note=f"vs lag {base}", **keys),
        ]
    return rows


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


def analyse(inputs: Inputs, prior: pd.DataFrame) -> Part:
    """Utilisation rows; with several lags, the front flags and each arm's max safe lag."""
    done, scored, alpha = inputs.done, inputs.scored, inputs.config.alpha
    if done.empty:
        return Part(tables={"frontier": pd.DataFrame()})
    rows = utilisation_rows(done, inputs.spec)
    frontier = pd.DataFrame()
    if several_lags(done):
        frontier = frontier_table(done, scored, alpha)
        rows += frontier_rows(frontier) + safe_lag_rows(done, prior, alpha)
    return Part(rows, {"frontier": frontier})


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
    if len(frontier["arm"].unique()) > 1 and len(front) > 1:  # one point is no front to draw
        ax.plot(
            front["steps_per_s"],
            front["final_iqm"],
            "k--",
            lw=1,
            zorder=0,
            label="front over all arms (supported differences)",
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
        title="trade-off (ringed: on its arm's supported front)",
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
    colors = colors or arm_colors(list(summary["arm"].dropna().unique()))
    fig, axes = grid(6, width=5.0, height=3.6, max_cols=2)
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
    _by_lag(axes[5], stale[stale["statistic"] == "kl_behavior_mean"], colors)
    axes[5].set(title="stale behaviour policy vs learner (k3 KL)", xlabel="lag", ylabel="KL (mean)")
    for a in axes:
        a.grid(alpha=0.3)
    outside_legend(fig, axes)
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
            "token and the learner step that trained it), kl_behavior_mean (k3 KL of the stale "
            "behaviour policies from the learner, staleness/kl_behavior: how far the policy "
            "moved between the versions that sampled and trained; empty where no row was "
            "stale): mean across seeds with CI. pareto_* = 1 if the lag is on the front of "
            "(throughput, final score) within the arm / over all arms and lags, where a score "
            "difference counts only when a paired t-test over seeds detects it (Holm over the "
            "pairs compared); undetected differences are ties, so among tied lags only the "
            "fastest is on the front.",
        ),
        *table(
            page.summary,
            "max_safe_lag",
            "Max safe lag per arm",
            "The largest lag up to which every lag of the arm is non-inferior to its smallest "
            "lag on the final score (one-sided paired test at report.equivalence_margin "
            f"{page.config.equivalence_margin:g}, Holm over every Findings line; see Tests "
            "behind the Findings), the learner's steps/s there and its speed-up over the "
            "smallest lag. A max safe lag equal to the smallest lag means no later lag was "
            "shown to be safe, not that the later lags are harmful.",
            skip_empty=True,
        ),
        *figure(
            page.figures,
            "staleness_tradeoff",
            "Staleness trade-off: score, throughput, utilisation, per-token lag and behaviour KL "
            "vs lag; the front through the differences the statistics support.",
        ),
    ]
