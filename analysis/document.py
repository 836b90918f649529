"""The report document: title, findings, overview, warnings, every other section's blocks, and
the methods.

Every table is `render.wide_table` of one summary section, so what a reader sees is exactly what
`summary.parquet` holds. The sections (`analysis.sections`) write their own parts.
"""

from __future__ import annotations

import pandas as pd

from analysis.config import ReportConfig
from analysis.render import Block
from analysis.sections import SECTIONS, Page, findings

METHODS = [
    "IQM (25% trimmed mean; with fewer than 4 values it trims none and equals the mean), "
    "mean, median, optimality gap and probability of improvement as functions of a runs x "
    "groups score matrix, with percentile intervals from one stratified bootstrap (seeds "
    "resampled with replacement within each stratum - a lag, an eval set or an arm - each "
    "independently, from a seeded numpy Generator): Agarwal et al. 2021, 'Deep Reinforcement "
    "Learning at the Edge of the Statistical Precipice', NeurIPS (rliable); percentile "
    "bootstrap: Efron & Tibshirani 1993.",
]


def warnings(scores: pd.DataFrame, config: ReportConfig) -> list[str]:
    """What a reader must know before reading any number."""
    out = []
    scored = scores[scores["scored"]] if len(scores) else scores
    if scored.empty:
        return ["No trial has eval scores yet: score tables and tests are empty."]
    seeds = scored.groupby(["arm", "lag"])["seed"].nunique()
    if seeds.max() < 2:
        out.append(
            "Only a single seed per (arm, lag): intervals need at least 2 seeds, so all "
            "confidence intervals, tests and power estimates are undefined (shown as —). "
            "Run more seeds before drawing conclusions."
        )
    elif seeds.min() < 2:
        cells = ", ".join(f"{a} lag {lag}" for (a, lag), s in seeds.items() if s < 2)
        out.append(
            f"Cells with a single seed have no interval (intervals need at least 2 seeds): {cells}."
        )
    if config.diverged_scores == "exclude" and scores["diverged"].any():
        out.append(
            "Diverged trials are excluded from scores (diverged_scores=exclude); score "
            "statistics describe survivors only."
        )
    return out


def overview(scores: pd.DataFrame, config: ReportConfig) -> str:
    """One paragraph: trials, arms, lags, what the scores are and how intervals are made."""
    arms = sorted(scores["arm"].unique()) if len(scores) else []
    lags = sorted(scores["lag"].unique()) if len(scores) else []
    diverged = ""
    if config.diverged_scores == "zero_after":
        diverged = "; a diverged trial scores pass rate 0 after divergence (see Methods)"
    return (
        f"{len(scores)} trials, {int(scores['scored'].sum()) if len(scores) else 0} scored; "
        f"arms: {', '.join(map(str, arms)) or 'none'}; "
        f"lags: {', '.join(map(str, lags)) or 'none'}. "
        f"Final score = mean of the last {config.last_k_evals} evals; AUC = area under the eval "
        f"curve / step span (a mean pass rate){diverged}. Intervals: {config.confidence:.0%} "
        f"percentile bootstrap, {config.n_resamples} resamples, seed {config.seed}; "
        f"alpha = {config.alpha}."
    )


def report_blocks(page: Page, *, default_title: str) -> list[Block]:
    """The whole report; the first block is the h1 title."""
    scores, config = page.scores, page.config
    names = (
        sorted({e for e in scores.get("experiment", pd.Series(dtype=str)) if e})
        if len(scores)
        else []
    )
    title = f"Comparison report: {', '.join(names) or default_title}"
    # Findings first: what the statistics support, before how the numbers were made.
    blocks = [Block("h1", title), *findings.blocks(page), Block("p", overview(scores, config))]
    notes = warnings(scores, config) + ([page.software_note] if page.software_note else [])
    if notes:
        blocks += [Block("h2", "Warnings"), Block("list", items=notes)]
    # Methods cite only what the report shows: a section left out (no data, or no axis to vary)
    # takes its methods with it.
    methods = list(METHODS)
    for section in SECTIONS:
        shown = section.blocks(page) if section is not findings else []
        blocks += shown
        methods += section.METHODS if shown else []
    return [*blocks, Block("h2", "Methods"), Block("list", items=methods)]
