"""Pairwise arm comparisons at each lag: probability of improvement, tests, effects, power.

For arms X and Y at one lag: the probability of improvement (Agarwal et al. 2021); paired
tests over matched seeds (Wilcoxon signed-rank, paired bootstrap of the mean difference);
unpaired Welch and Mann-Whitney tests; Holm adjustment within each (metric, test) family over
all pairs and lags; Hedges' g and Cliff's delta; and a t-test power analysis.
"""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd

from analysis.power import power_analysis
from analysis.significance import (
    cliffs_delta,
    hedges_g,
    holm,
    mann_whitney,
    welch,
    wilcoxon_paired,
)
from analysis.stats import BootstrapSpec, paired_mean_difference, poi_interval
from analysis.summary import interval_row, row
from analysis.trial_scores import matched

TEST_METRICS = ("final_score", "auc")
HOLM_TESTS = ("wilcoxon_p", "welch_p", "mann_whitney_p")


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
    scored: pd.DataFrame, column: str, pair: tuple[int, str, str], spec: BootstrapSpec, alpha: float
) -> list[dict]:
    """Paired and unpaired tests and effect sizes of X vs Y at one lag (section tests_<column>)."""
    lag, x, y = pair
    section, label = f"tests_{column}", f"{x} vs {y}"
    xs, ys = _arm_values(scored, column, x, lag), _arm_values(scored, column, y, lag)
    pairs = matched(scored, column, x, y, lag)
    n_pairs, sizes = len(pairs), f"{len(xs)} vs {len(ys)} seeds"
    diff = paired_mean_difference(pairs["x"], pairs["y"], spec)
    wil = wilcoxon_paired(pairs["x"].to_numpy(), pairs["y"].to_numpy(), alpha)
    wel = welch(xs, ys, alpha)
    mw = mann_whitney(xs, ys, alpha)
    common = {"lag": lag, "comparison": label}
    return [
        interval_row(section, "mean_diff_paired", diff, **common),
        row(section, "wilcoxon_p", wil.p_value, n=n_pairs, note=wil.note, **common),
        row(section, "welch_p", wel.p_value, n=len(xs) + len(ys), note=wel.note or sizes, **common),
        row(section, "mann_whitney_p", mw.p_value, n=len(xs) + len(ys), note=mw.note, **common),
        row(section, "hedges_g", hedges_g(xs, ys), n=len(xs) + len(ys), **common),
        row(section, "cliffs_delta", cliffs_delta(xs, ys), n=len(xs) + len(ys), **common),
    ]


def add_holm(rows: list[dict]) -> list[dict]:
    """Append `<test>_holm` rows, adjusting each (section, test) family over all its rows."""
    out = list(rows)
    for section in sorted({r["section"] for r in rows}):
        for test in HOLM_TESTS:
            family = [r for r in rows if r["section"] == section and r["statistic"] == test]
            adjusted = holm(np.array([r["value"] for r in family]))
            for r, p in zip(family, adjusted, strict=True):
                note = f"Holm over {int(np.isfinite(adjusted).sum())} comparisons"
                out.append({**r, "statistic": f"{test}_holm", "value": float(p), "note": note})
    return out


def significance_rows(scored: pd.DataFrame, spec: BootstrapSpec, alpha: float) -> list[dict]:
    """Sections `tests_final_score` and `tests_auc`, with Holm-adjusted p-values."""
    rows = []
    for column in TEST_METRICS:
        for pair in arm_pairs(scored):
            rows += _pair_rows(scored, column, pair, spec, alpha)
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
        ]
    return rows
