"""Section "Findings": the report opens with one line per comparison, stating only what its
statistics support.

Per arm pair and lag (the comparisons of `comparisons`), on the final score: the paired mean
difference X - Y with its bootstrap interval and the paired t-test Holm-adjusted over every
pair and lag (section `tests_final_score`), and the power analysis of that same t-test (section
`power`). Nothing is computed here: every number is read from those rows, so the Findings and
the tables cannot disagree. A difference is *detected* only when the Holm-adjusted p is below
alpha and the interval excludes 0; when one says so and the other does not, the line says they
disagree and claims nothing. Otherwise the line gives the smallest difference the current seeds
detect with the target power and, for a non-zero effect, the seeds the observed effect would
need, or that it is impractical past `MAX_PRACTICAL_SEEDS`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import pandas as pd

from analysis.render import Block, format_number
from analysis.sections.base import Inputs, Page, Part, no_figures
from analysis.stats.power import MAX_PRACTICAL_SEEDS
from analysis.summary import row

Verdict = Literal["detected", "disagree", "not_detected", "untested"]
SECTION = "findings"
TESTS, EFFECT, P_HOLM = "tests_final_score", "mean_diff_paired", "paired_t_p_holm"
METHODS: list[str] = []
draw = no_figures


@dataclass(frozen=True)
class Evidence:
    """What the comparison tables hold on X vs Y at one lag, final score (X - Y)."""

    lag: int
    x: str
    y: str
    diff: float  # mean paired difference X - Y
    low: float  # its bootstrap interval
    high: float
    pairs: int  # matched seeds
    p_holm: float  # paired t-test, Holm-adjusted over every pair and lag
    p_note: str  # why the test has no p, if it has none
    seeds_needed: float  # per arm, for the target power at the observed effect (NaN: none)
    min_detectable: float  # smallest detectable difference at `pairs` seeds (score units)


def _cell(prior: pd.DataFrame, section: str, statistic: str) -> dict[tuple, pd.Series]:
    rows = prior[(prior["section"] == section) & (prior["statistic"] == statistic)]
    return {(int(r["lag"]), str(r["comparison"])): r for _, r in rows.iterrows()}


def evidence(prior: pd.DataFrame) -> list[Evidence]:
    """One `Evidence` per (lag, comparison) of the final-score tests, in lag, pair order."""
    diffs, adjusted = _cell(prior, TESTS, EFFECT), _cell(prior, TESTS, P_HOLM)
    tests = _cell(prior, TESTS, P_HOLM.removesuffix("_holm"))  # its note says why no p
    needed = _cell(prior, "power", "seeds_needed")
    detectable = _cell(prior, "power", "min_detectable_diff")
    out = []
    for key in sorted(diffs):
        d, x_vs_y = diffs[key], key[1].split(" vs ", 1)
        out.append(
            Evidence(
                lag=key[0],
                x=x_vs_y[0],
                y=x_vs_y[1],
                diff=float(d["value"]),
                low=float(d["ci_low"]),
                high=float(d["ci_high"]),
                pairs=0 if pd.isna(d["n"]) else int(d["n"]),
                p_holm=float(adjusted[key]["value"]),
                p_note="" if pd.isna(note := tests[key]["note"]) else str(note),
                seeds_needed=float(needed[key]["value"]),
                min_detectable=float(detectable[key]["value"]),
            )
        )
    return out


def verdict(e: Evidence, alpha: float) -> Verdict:
    """detected: Holm p < alpha and the interval excludes 0; disagree: only one of the two."""
    if e.pairs < 2 or not (math.isfinite(e.p_holm) and math.isfinite(e.low)):
        return "untested"
    significant, excludes = e.p_holm < alpha, e.low > 0 or e.high < 0
    if significant and excludes:
        return "detected"
    return "disagree" if significant or excludes else "not_detected"


def _signed(value: float) -> str:
    return ("-" if value < 0 else "+") + format_number(abs(value))


def _effect(diff: float, low: float, high: float) -> str:
    return f"{_signed(diff)} [{format_number(low)}, {format_number(high)}]"


def _p(e: Evidence) -> str:
    text = format_number(e.p_holm, P_HOLM)  # '<0.0001' below 1e-4
    return f"Holm p {text[0]} {text[1:]}" if text.startswith("<") else f"Holm p = {text}"


def seeds_clause(e: Evidence, power: float) -> str:
    """What the observed effect would need, or '' when there is no effect to plan for."""
    if e.diff == 0:
        return ""
    target = f"{power:.0%} power at the observed effect"
    if not math.isfinite(e.seeds_needed) or e.seeds_needed > MAX_PRACTICAL_SEEDS:
        about = "" if math.isnan(e.seeds_needed) else f" (about {int(e.seeds_needed):,})"
        return (
            f"; {target} would need more than {MAX_PRACTICAL_SEEDS} seeds per arm{about}: "
            "impractical at this effect size"
        )
    if e.seeds_needed > e.pairs:
        return f"; would need about {int(e.seeds_needed)} seeds per arm for {target}"
    return f"; {int(e.seeds_needed)} seeds would already give {target} before Holm's correction"


def sentence(e: Evidence, alpha: float, power: float) -> str:
    """The Findings line of one comparison (see the module docstring)."""
    kind, where = verdict(e, alpha), f"at lag {e.lag}"
    if kind == "untested":
        why = e.p_note or "paired t needs at least 2 matched seeds"
        seeds = f"{e.pairs} matched seed{'' if e.pairs == 1 else 's'}"
        return f"{e.x} vs {e.y} {where}: not tested ({seeds}; {why})"
    if kind == "detected":
        flip = e.diff < 0  # state the winner first, its lead positive
        win, lose = (e.y, e.x) if flip else (e.x, e.y)
        effect = _effect(-e.diff, -e.high, -e.low) if flip else _effect(e.diff, e.low, e.high)
        return (
            f"{win} beats {lose} {where} on the final score by {effect}, {_p(e)}, {e.pairs} seeds"
        )
    effect = _effect(e.diff, e.low, e.high)
    if kind == "disagree":
        if e.p_holm < alpha:
            split = f"{_p(e)} < {alpha:g} but the interval {effect} includes 0"
        else:
            split = f"the interval {effect} excludes 0 but {_p(e)} >= {alpha:g}"
        head = (
            f"{e.x} vs {e.y} {where}: no difference claimed, test and interval disagree ({split})"
        )
    else:
        head = f"{e.x} vs {e.y} {where}: no difference detected ({effect}, {_p(e)})"
    mde = ""
    if math.isfinite(e.min_detectable):
        mde = f"; at n = {e.pairs} the smallest detectable difference is "
        mde += format_number(e.min_detectable)
    return head + mde + seeds_clause(e, power)


def finding_rows(prior: pd.DataFrame, alpha: float, power: float) -> list[dict]:
    """Section `findings`: one row per comparison; statistic = verdict, value = X - Y."""
    return [
        row(
            SECTION,
            verdict(e, alpha),
            e.diff,
            lag=e.lag,
            comparison=f"{e.x} vs {e.y}",
            ci_low=e.low,
            ci_high=e.high,
            n=e.pairs,
            note=sentence(e, alpha, power),
        )
        for e in evidence(prior)
    ]


def analyse(inputs: Inputs, prior: pd.DataFrame) -> Part:
    """Findings from the rows of `comparisons` in `prior` (analysed after every other section)."""
    config = inputs.config
    return Part(finding_rows(prior, config.alpha, config.target_power))


def blocks(page: Page) -> list[Block]:
    """The Findings: a short explanation and one line per comparison."""
    if not page.has(SECTION):
        return []
    summary, config = page.summary, page.config
    rows = summary[summary["section"] == SECTION].sort_values(["lag", "comparison"])
    intro = (
        "One line per arm pair and lag, on the final score: the paired mean difference (X - Y "
        f"for 'X vs Y') with its {config.confidence:.0%} bootstrap interval, the matched seeds, "
        "and the paired t-test, Holm-adjusted over "
        "every pair and lag (see Comparisons). A difference counts as detected only when Holm p "
        f"< {config.alpha:g} and the interval excludes 0. Detectable differences and seeds "
        f"needed are for {config.target_power:.0%} power at alpha {config.alpha:g} before "
        "Holm's correction (see Power and What to do next)."
    )
    return [Block("h2", "Findings"), Block("p", intro), Block("list", items=list(rows["note"]))]
