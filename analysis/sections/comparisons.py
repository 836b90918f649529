"""Section "Comparisons": pairwise arm comparisons at each lag: probability of improvement,
tests, effects, power.

For arms X and Y at one lag: the probability of improvement (Agarwal et al. 2021); paired
tests over matched seeds (paired bootstrap of the mean difference, paired t-test, Wilcoxon
signed-rank);
unpaired Welch and Mann-Whitney tests; the paired equivalence test (TOST) at
`report.equivalence_margin`; Holm adjustment within each (metric, test) family over all pairs
and lags; Hedges' g and Cliff's delta; and a t-test power analysis.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from analysis.config import ReportConfig
from analysis.render import Block
from analysis.sections.base import Inputs, Page, Part, figure, table
from analysis.stats import BootstrapSpec, paired_mean_difference, poi_interval
from analysis.stats.equivalence import tost_paired
from analysis.stats.power import power_analysis
from analysis.stats.significance import (
    cliffs_delta,
    hedges_g,
    holm,
    mann_whitney,
    paired_t,
    welch,
    wilcoxon_paired,
)
from analysis.summary import interval_row, row
from analysis.trial_scores import matched

if TYPE_CHECKING:
    from matplotlib.axes import Axes

TEST_METRICS = ("final_score", "auc")
HOLM_TESTS = ("paired_t_p", "wilcoxon_p", "welch_p", "mann_whitney_p", "tost_p")
# Its summary sections: all empty when no lag has two arms.
ROW_SECTIONS = ("probability_of_improvement", "tests_final_score", "tests_auc", "power")
METHODS = [
    "Paired tests over matched seeds: Student's paired t-test (Student 1908; the test the power "
    "analysis plans for), Wilcoxon signed-rank (Wilcoxon 1945) and a paired bootstrap of the "
    "mean difference; unpaired: Welch's t-test (Welch 1947) and Mann-Whitney U "
    "(Mann & Whitney 1947); Holm step-down correction (Holm 1979) within each (metric, test) "
    "family over all arm pairs and lags. Equivalence: paired two one-sided t-tests (TOST, "
    "Schuirmann 1987) of H0 |mean difference| >= report.equivalence_margin. Rank-test "
    "p-values are exact permutation p-values, "
    "tied scores included (Mann-Whitney: exact distribution of the midrank sum over all "
    "C(n + m, n) splits, two-sided as twice the smaller tail, normal approximation only past "
    "about 50 vs 50 seeds; Wilcoxon: all 2^n sign flips up to 13 pairs, scipy). The smallest "
    "attainable p noted next to a test is computed for the same distribution (given the ties).",
    "Effect sizes: Hedges' g with small-sample correction (Hedges 1981); Cliff's delta (Cliff "
    "1993). Power: t-test power (Cohen 1988) via statsmodels TTestPower (paired d_z) or "
    "TTestIndPower (Cohen's d).",
]


def arm_pairs(scored: pd.DataFrame) -> list[tuple[int, str, str]]:
    """(lag, X, Y) for every pair of arms present at a lag, X before Y alphabetically."""
    out = []
    for lag, group in scored.groupby("lag", sort=True):
        arms = sorted(group["arm"].unique())
        out += [(int(lag), x, y) for x, y in itertools.combinations(arms, 2)]
    return out


def _arm_values(scored: pd.DataFrame, column: str, arm: str, lag: int) -> np.ndarray:
    cell = scored[(scored["arm"] == arm) & (scored["lag"] == lag)]
    values = cell[column].to_numpy(dtype=float)
    return values[np.isfinite(values)]


def poi_rows(scored: pd.DataFrame, spec: BootstrapSpec) -> list[dict]:
    """Section `probability_of_improvement`: P(X > Y) of final score and AUC per lag."""
    rows = []
    for lag, x, y in arm_pairs(scored):
        for column in TEST_METRICS:
            interval = poi_interval(
                _arm_values(scored, column, x, lag), _arm_values(scored, column, y, lag), spec
            )
            rows.append(
                interval_row(
                    "probability_of_improvement",
                    column,
                    interval,
                    lag=lag,
                    comparison=f"{x} vs {y}",
                )
            )
    return rows


def _pair_rows(
    scored: pd.DataFrame,
    column: str,
    pair: tuple[int, str, str],
    spec: BootstrapSpec,
    *,
    alpha: float,
    margin: float,
) -> list[dict]:
    """Paired and unpaired tests and effect sizes of X vs Y at one lag (section tests_<column>)."""
    lag, x, y = pair
    section, label = f"tests_{column}", f"{x} vs {y}"
    xs, ys = _arm_values(scored, column, x, lag), _arm_values(scored, column, y, lag)
    pairs = matched(scored, column, x, y, lag)
    n_pairs, sizes = len(pairs), f"{len(xs)} vs {len(ys)} seeds"
    diff = paired_mean_difference(pairs["x"], pairs["y"], spec)
    pt = paired_t(pairs["x"].to_numpy(), pairs["y"].to_numpy())
    wil = wilcoxon_paired(pairs["x"].to_numpy(), pairs["y"].to_numpy(), alpha)
    wel = welch(xs, ys, alpha)
    mw = mann_whitney(xs, ys, alpha)
    tost = tost_paired(pairs["x"].to_numpy(), pairs["y"].to_numpy(), margin)
    common = {"lag": lag, "comparison": label}
    return [
        interval_row(section, "mean_diff_paired", diff, **common),
        row(section, "paired_t_p", pt.p_value, n=n_pairs, note=pt.note, **common),
        row(section, "wilcoxon_p", wil.p_value, n=n_pairs, note=wil.note, **common),
        row(section, "welch_p", wel.p_value, n=len(xs) + len(ys), note=wel.note or sizes, **common),
        row(section, "mann_whitney_p", mw.p_value, n=len(xs) + len(ys), note=mw.note, **common),
        row(section, "tost_p", tost.p_value, n=n_pairs, note=tost.note, **common),
        row(section, "hedges_g", hedges_g(xs, ys), n=len(xs) + len(ys), **common),
        row(section, "cliffs_delta", cliffs_delta(xs, ys), n=len(xs) + len(ys), **common),
    ]


def add_holm(rows: list[dict], tests: tuple[str, ...] = HOLM_TESTS) -> list[dict]:
    """Append `<test>_holm` rows, adjusting each (section, test) family over all its rows."""
    out = list(rows)
    for section in sorted({r["section"] for r in rows}):
        for test in tests:
            family = [r for r in rows if r["section"] == section and r["statistic"] == test]
            adjusted = holm(np.array([r["value"] for r in family]))
            for r, p in zip(family, adjusted, strict=True):
                note = f"Holm over {int(np.isfinite(adjusted).sum())} comparisons"
                out.append({**r, "statistic": f"{test}_holm", "value": float(p), "note": note})
    return out


def significance_rows(
    scored: pd.DataFrame, spec: BootstrapSpec, alpha: float, margin: float
) -> list[dict]:
    """Sections `tests_final_score` and `tests_auc`, with Holm-adjusted p-values."""
    rows = []
    for column in TEST_METRICS:
        for pair in arm_pairs(scored):
            rows += _pair_rows(scored, column, pair, spec, alpha=alpha, margin=margin)
    return add_holm(rows)


def power_rows(scored: pd.DataFrame, alpha: float, power: float) -> list[dict]:
    """Section `power` on the final score: paired over matched seeds when >= 2 pairs exist."""
    rows = []
    for lag, x, y in arm_pairs(scored):
        pairs = matched(scored, "final_score", x, y, lag)
        paired = len(pairs) >= 2
        if paired:
            result = power_analysis(pairs["x"], pairs["y"], True, alpha, power)
        else:
            xs = _arm_values(scored, "final_score", x, lag)
            ys = _arm_values(scored, "final_score", y, lag)
            result = power_analysis(xs, ys, False, alpha, power)
        common = {"lag": lag, "comparison": f"{x} vs {y}", "n": result.n, "note": result.note}
        rows += [
            row("power", "observed_effect", result.effect, **common),
            row("power", "seeds_needed", result.seeds_needed, **common),
            row("power", "min_detectable_effect", result.min_detectable_effect, **common),
            row("power", "min_detectable_diff", result.min_detectable_difference, **common),
        ]
    return rows


def analyse(inputs: Inputs, prior: pd.DataFrame) -> Part:
    """PoI, tests and power of every arm pair at every lag (nothing before any score)."""
    scored, config = inputs.scored, inputs.config
    if scored.empty:
        return Part()
    rows = poi_rows(scored, inputs.spec)
    rows += significance_rows(scored, inputs.spec, config.alpha, config.equivalence_margin)
    return Part(rows + power_rows(scored, config.alpha, config.target_power))


def _poi_axes(ax: Axes, cells: pd.DataFrame) -> None:
    y = np.arange(len(cells))[::-1]
    for yi, r in zip(y, cells.itertuples(), strict=True):
        err = [[r.value - r.ci_low], [r.ci_high - r.value]] if np.isfinite(r.ci_low) else None
        ax.errorbar(r.value, yi, xerr=err, fmt="o", color="C0", capsize=3)
    labels = [f"lag {r.lag}: P({r.comparison.replace(' vs ', ' > ')})" for r in cells.itertuples()]
    ax.set_yticks(y, labels, fontsize=8)
    ax.axvline(0.5, color="grey", ls="--", lw=1)
    ax.set(xlim=(-0.03, 1.03), xlabel="probability of improvement (final score)")
    ax.grid(axis="x", alpha=0.3)


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
    _poi_axes(ax, cells)
    ax.set_title(f"Probability of improvement, {confidence:.0%} bootstrap CI")
    return fig


def draw(
    part: Part, summary: pd.DataFrame, colors: dict[str, str], config: ReportConfig
) -> dict[str, Figure | None]:
    return {"probability_of_improvement": poi_figure(summary, config.confidence)}


def blocks(page: Page) -> list[Block]:
    """The section, or nothing without a pair of arms to compare (one arm per lag)."""
    if not page.any_scored or not any(page.has(section) for section in ROW_SECTIONS):
        return []
    summary = page.summary
    return [
        Block("h2", "Comparisons"),
        *table(
            summary,
            "probability_of_improvement",
            "Probability of improvement",
            "P(X > Y) + 0.5 P(X = Y) over seeds for X vs Y, with bootstrap CI; n = seeds of "
            "both arms. 0.5 = no difference.",
        ),
        *figure(
            page.figures,
            "probability_of_improvement",
            "Probability of improvement on the final score.",
        ),
        *table(
            summary,
            "tests_final_score",
            "Tests on the final score",
            "mean_diff_paired: X - Y over matched seeds with paired-bootstrap CI; n = matched "
            "seed pairs. The paired t-test and Wilcoxon are paired; Welch and Mann-Whitney "
            "unpaired. *_holm = "
            "Holm-adjusted over every row of this table (all arm pairs and lags), per test. "
            "tost_p: paired equivalence test (two one-sided t-tests) of H0 |X - Y| >= "
            f"{page.config.equivalence_margin:g} (report.equivalence_margin); a small p supports "
            "'X and Y within the margin'. "
            "Hedges' g and Cliff's delta are X relative to Y. A note flags a test whose "
            "smallest attainable p at this n is above alpha.",
        ),
        *table(summary, "tests_auc", "Tests on the AUC", "As above, on the AUC."),
        *table(
            summary,
            "power",
            "Power",
            "Observed standardised effect (paired d_z when >= 2 matched seeds), seeds per "
            "arm needed for the target power, and the smallest effect detectable with the "
            "current n (two-sided t-test, unadjusted alpha), standardised and as a final-score "
            "difference at the observed SD (min_detectable_diff).",
        ),
    ]
