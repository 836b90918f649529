"""What the report says: its sections as render blocks, built from the summary frame.

Every table is `render.wide_table` of one summary section, so what a reader sees is exactly what
`summary.parquet` holds.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from analysis.config import ReportConfig
from analysis.correction_document import correction_blocks
from analysis.eval_document import METHODS as EVAL_METHODS
from analysis.eval_document import (
    aggregate_blocks,
    compute_blocks,
    eval_set_count,
    next_step_blocks,
    per_set_blocks,
)
from analysis.render import Block, wide_table

METHODS = [
    "IQM (25% trimmed mean), stratified percentile bootstrap over seeds within each lag, and "
    "probability of improvement: Agarwal et al. 2021, 'Deep Reinforcement Learning at the Edge "
    "of the Statistical Precipice', NeurIPS; bootstrap via scipy.stats.bootstrap (Efron & "
    "Tibshirani 1993).",
    "Paired tests over matched seeds: Wilcoxon signed-rank (Wilcoxon 1945) and a paired "
    "bootstrap of the mean difference; unpaired: Welch's t-test (Welch 1947) and Mann-Whitney U "
    "(Mann & Whitney 1947); Holm step-down correction (Holm 1979) within each (metric, test) "
    "family over all arm pairs and lags. Rank-test p-values are exact permutation p-values, "
    "tied scores included (Mann-Whitney: exact distribution of the midrank sum over all "
    "C(n + m, n) splits, two-sided as twice the smaller tail, normal approximation only past "
    "about 50 vs 50 seeds; Wilcoxon: all 2^n sign flips up to 13 pairs, scipy). The smallest "
    "attainable p noted next to a test is computed for the same distribution (given the ties).",
    "Effect sizes: Hedges' g with small-sample correction (Hedges 1981); Cliff's delta (Cliff "
    "1993). Power: t-test power (Cohen 1988) via statsmodels TTestPower (paired d_z) or "
    "TTestIndPower (Cohen's d).",
    "Divergence rates: Wilson score interval (Wilson 1927; Brown, Cai & DasGupta 2001) and "
    "Fisher's exact test (Fisher 1922). Time to threshold: Kaplan-Meier product-limit estimator "
    "(Kaplan & Meier 1958) with non-reaching trials right-censored at their last eval.",
    "Diverged trials (diverged_scores=zero_after, the default) keep their seed in the score "
    "statistics but are never credited for steps they did not run: from the step after their "
    "last logged step to the planned step count their pass rate is taken as 0, the floor (the "
    "policy after a non-finite update is unusable). Final score = 0, since the policy at the "
    "planned end is the diverged one; AUC = area under the eval curve extended by 0 to the "
    "planned end (linear from the last eval to the drop), divided by the full planned span, "
    "as for a completed trial.",
]


def _table(summary: pd.DataFrame, section: str, title: str, text: str) -> list[Block]:
    return [
        Block("h3", title),
        Block("p", text),
        Block("table", table=wide_table(summary, section)),
    ]


def _figure(paths: dict[str, Path], name: str, caption: str) -> list[Block]:
    return [Block("figure", caption, path=paths[name])] if name in paths else []


def _warnings(scores: pd.DataFrame, config: ReportConfig) -> list[str]:
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


def _overview(scores: pd.DataFrame, config: ReportConfig) -> str:
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


def _problem_items(problems: pd.DataFrame) -> list[str]:
    items = []
    for p in problems.itertuples(index=False):
        known = [
            f"{k} {v}"
            for k, v in (("arm", p.arm), ("seed", p.seed), ("lag", p.lag))
            if not pd.isna(v)
        ]
        where = f" ({', '.join(known)})" if known else ""
        items.append(f"{p.trial_name}{where}: {p.problem}")
    return items


def _score_blocks(summary: pd.DataFrame, figs: dict[str, Path]) -> list[Block]:
    several = eval_set_count(summary) > 1
    scope = (
        "Primary eval set only (the first; the headline is the aggregate across eval sets above). "
        if several
        else ""
    )
    return [
        *(aggregate_blocks(summary, figs) if several else []),
        Block("h2", "Scores on the primary eval set" if several else "Scores"),
        *_table(
            summary,
            "final_score",
            "Final score",
            f"{scope}IQM and mean across seeds with CI; n = seeds. 'all' rows pool lags with a "
            "bootstrap stratified by lag (the strata are lags).",
        ),
        *_table(
            summary, "auc", "Area under the eval curve", "Mean pass rate over training; n = seeds."
        ),
        *_figure(
            figs, "final_scores", "Final score and AUC per arm and lag, IQM and mean with CIs."
        ),
        *_figure(
            figs,
            "learning_curves",
            "Learning curves: IQM across seeds with bootstrap band, thin lines are seeds; a "
            "diverged seed drops out after its last eval.",
        ),
        *per_set_blocks(summary, figs),
        Block("h2", "Comparisons"),
        *_table(
            summary,
            "probability_of_improvement",
            "Probability of improvement",
            "P(X > Y) + 0.5 P(X = Y) over seeds for X vs Y, with bootstrap CI; n = seeds of "
            "both arms. 0.5 = no difference.",
        ),
        *_figure(
            figs, "probability_of_improvement", "Probability of improvement on the final score."
        ),
        *_table(
            summary,
            "tests_final_score",
            "Tests on the final score",
            "mean_diff_paired: X - Y over matched seeds with paired-bootstrap CI; n = matched "
            "seed pairs. Wilcoxon is paired; Welch and Mann-Whitney unpaired. *_holm = "
            "Holm-adjusted over every row of this table (all arm pairs and lags), per test. "
            "Hedges' g and Cliff's delta are X relative to Y. A note flags a test whose "
            "smallest attainable p at this n is above alpha.",
        ),
        *_table(summary, "tests_auc", "Tests on the AUC", "As above, on the AUC."),
        *_table(
            summary,
            "power",
            "Power",
            "Observed standardised effect (paired d_z when >= 2 matched seeds), seeds per "
            "arm needed for the target power, and the smallest effect detectable with the "
            "current n (two-sided t-test).",
        ),
    ]


def _stability_blocks(
    summary: pd.DataFrame, figs: dict[str, Path], config: ReportConfig
) -> list[Block]:
    return [
        Block("h2", "Stability"),
        *_table(
            summary,
            "divergence",
            "Divergence",
            "Fraction of finished trials that diverged, k/N with Wilson CI; 'all' = all lags.",
        ),
        *_table(
            summary,
            "divergence_tests",
            "Divergence: Fisher's exact test",
            "Arm pairs pooled over lags; n = trials of both arms.",
        ),
        *_table(
            summary,
            "stability",
            "Gradient spikes, KL and clipping",
            f"Mean across seeds with CI of: spikes per step (optim/grad_spikes, else grad "
            f"norm > {config.spike_factor:g} x trailing median of {config.spike_window} "
            f"steps), max KL to the old policy, mean clip fraction.",
        ),
        *_figure(
            figs,
            "clip_kl",
            "Clip fraction and KL to the old policy (IQM across seeds, seeds thin).",
        ),
        *_table(
            summary,
            "time_to_threshold",
            "Time to threshold",
            f"Kaplan-Meier median learner steps to eval pass rate >= {config.pass_threshold:g}; "
            "trials that never reach it are censored at their last eval.",
        ),
        *_figure(
            figs, "time_to_threshold", "Kaplan-Meier curves of time to the pass-rate threshold."
        ),
        Block("h2", "Staleness and utilisation"),
        *_table(
            summary,
            "staleness",
            "Throughput and utilisation by lag",
            "Learner steps/s (1 / median step time), learner wait and generator idle fractions: "
            "mean across seeds with CI. pareto_* = 1 if the lag is Pareto-optimal on "
            "(throughput, final-score IQM) within the arm / over all arms and lags.",
        ),
        *_figure(
            figs,
            "staleness_tradeoff",
            "Staleness trade-off: score, throughput and utilisation vs lag.",
        ),
    ]


def report_blocks(
    scores: pd.DataFrame,
    summary: pd.DataFrame,
    problems: pd.DataFrame,
    figs: dict[str, Path],
    *,
    config: ReportConfig,
    default_title: str,
) -> list[Block]:
    """The whole report; the first block is the h1 title."""
    names = (
        sorted({e for e in scores.get("experiment", pd.Series(dtype=str)) if e})
        if len(scores)
        else []
    )
    title = f"Comparison report: {', '.join(names) or default_title}"
    blocks = [Block("h1", title), Block("p", _overview(scores, config))]
    warnings = _warnings(scores, config)
    if warnings:
        blocks += [Block("h2", "Warnings"), Block("list", items=warnings)]
    blocks += [
        Block("h2", "Trials"),
        Block("table", table=wide_table(summary, "trials")),
        Block("h3", "Diverged, incomplete or missing trials"),
        Block("list", items=_problem_items(problems)),
    ]
    if len(scores) and scores["scored"].any():
        blocks += _score_blocks(summary, figs)
        blocks += compute_blocks(summary, figs)
        blocks += next_step_blocks(summary)
    blocks += _stability_blocks(summary, figs, config)
    blocks += correction_blocks(summary, figs)
    blocks += [Block("h2", "Methods"), Block("list", items=METHODS + EVAL_METHODS)]
    return blocks
