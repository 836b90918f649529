"""Section "Findings": the report opens with one line per comparison and metric, stating only
what its statistics support.

Lines: per arm pair and lag (the comparisons of `comparisons`), and per arm and later lag against
the arm's smallest lag (`lag_effects`, when the experiment has a lag axis), each on the final
score and on the AUC (an arm that learns more slowly to the same ceiling shows only there).
Every number is read from those rows and from `claims`, which adjusts the tests over every line
of the Findings (Holm over every pair, lag and metric), so the Findings and the tables cannot
disagree; nothing is computed here.

A difference is *detected* only when the Holm-adjusted paired t-test p is below alpha and the
paired bootstrap interval excludes 0; when one says so and the other does not, the line says
they disagree and claims nothing. Otherwise the line says no difference was detected and adds
what the margin test (`report.equivalence_margin`) supports: two arms *equivalent* within the
margin (TOST), or a later lag *not worse* than the base lag by more than the margin
(non-inferiority), each only when its Holm-adjusted p is below alpha. Where neither holds, a
final-score line of two arms gives the smallest difference the current seeds detect with the
target power and, for a non-zero effect, the seeds the observed effect would need, or that it
is impractical past `MAX_PRACTICAL_SEEDS`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import pandas as pd

from analysis.render import Block, format_number
from analysis.sections.base import Inputs, Page, Part, no_figures
from analysis.sections.claims import adjusted_p_values, findings_lines
from analysis.stats.power import MAX_PRACTICAL_SEEDS
from analysis.summary import row

Verdict = Literal["detected", "disagree", "equivalent", "noninferior", "not_detected", "untested"]
# One section per metric: a line's keys (arm, lag, comparison) are its comparison's.
SECTIONS = {"final_score": "findings", "auc": "findings_auc"}
SECTION = SECTIONS["final_score"]
METRIC_TEXT = {"final_score": "the final score", "auc": "the AUC"}
P_HOLM = "paired_t_p_holm"  # how Holm p-values are formatted
METHODS: list[str] = []
draw = no_figures


@dataclass(frozen=True)
class Evidence:
    """What the tables hold on one Findings line: X vs Y on `metric` (X - Y).

    For two arms, X and Y are arms at `lag`; for a lag line, `arm` at lag `lag` (X) against
    the same arm at its smallest lag (Y), and `x`, `y` read 'lag k', 'lag b'.
    """

    lag: int
    x: str
    y: str
    diff: float  # mean paired difference X - Y
    low: float  # its bootstrap interval
    high: float
    pairs: int  # matched seeds
    p_holm: float  # paired t-test, Holm-adjusted over every Findings line
    p_note: str  # why the test has no p, if it has none
    seeds_needed: float  # per arm, for the target power at the observed effect (NaN: none)
    min_detectable: float  # smallest detectable difference at `pairs` seeds (score units)
    metric: str = "final_score"
    arm: str | None = None  # set on a lag line
    margin_p_holm: float = math.nan  # TOST (arms) or non-inferiority (lag), Holm over lines
    margin: float = math.nan  # report.equivalence_margin


def _power_cells(prior: pd.DataFrame, statistic: str) -> dict[tuple, float]:
    rows = prior[(prior["section"] == "power") & (prior["statistic"] == statistic)]
    return {(int(r["lag"]), str(r["comparison"])): float(r["value"]) for _, r in rows.iterrows()}


def evidence(prior: pd.DataFrame, margin: float = math.nan) -> list[Evidence]:
    """One `Evidence` per Findings line (`claims.findings_lines` order: arm pairs, then lags)."""
    adjusted = adjusted_p_values(prior)
    needed = _power_cells(prior, "seeds_needed")
    detectable = _power_cells(prior, "min_detectable_diff")
    out = []
    for line in findings_lines(prior):
        key, m = (line.arm, line.lag, line.comparison), line.metric
        x, y = line.comparison.split(" vs ", 1)
        power_key = (line.lag, line.comparison)
        planned = line.kind == "pair" and m == "final_score"  # the power rows' lines
        out.append(
            Evidence(
                lag=line.lag,
                x=x,
                y=y,
                diff=line.diff,
                low=line.low,
                high=line.high,
                pairs=line.pairs,
                p_holm=adjusted[(*key, f"{m}_diff_p_holm")],
                p_note=line.diff_note,
                seeds_needed=needed.get(power_key, math.nan) if planned else math.nan,
                min_detectable=detectable.get(power_key, math.nan) if planned else math.nan,
                metric=m,
                arm=line.arm,
                margin_p_holm=adjusted[(*key, f"{m}_margin_p_holm")],
                margin=margin,
            )
        )
    return out


def _margin_holds(e: Evidence, alpha: float) -> bool:
    return math.isfinite(e.margin_p_holm) and e.margin_p_holm < alpha


def verdict(e: Evidence, alpha: float) -> Verdict:
    """detected: Holm p < alpha and the interval excludes 0; disagree: only one of the two;
    equivalent / noninferior: no difference detected and the margin test holds."""
    if e.pairs < 2 or not math.isfinite(e.low):
        return "untested"
    significant = math.isfinite(e.p_holm) and e.p_holm < alpha
    excludes = e.low > 0 or e.high < 0
    if significant and excludes:
        return "detected"
    if significant or excludes:
        return "disagree"
    if _margin_holds(e, alpha):
        return "noninferior" if e.arm is not None else "equivalent"
    if not math.isfinite(e.p_holm):
        return "untested"
    return "not_detected"


def _signed(value: float) -> str:
    return ("-" if value < 0 else "+") + format_number(abs(value))


def _effect(diff: float, low: float, high: float) -> str:
    return f"{_signed(diff)} [{format_number(low)}, {format_number(high)}]"


def _p(p_holm: float, name: str = "Holm p") -> str:
    text = format_number(p_holm, P_HOLM)  # '<0.0001' below 1e-4
    return f"{name} {text[0]} {text[1:]}" if text.startswith("<") else f"{name} = {text}"


def seeds_clause(e: Evidence, power: float) -> str:
    """What the observed effect would need, or '' when there is no effect to plan for."""
    if e.diff == 0 or math.isnan(e.min_detectable):
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


def _subject(e: Evidence) -> str:
    """'X vs Y at lag k' for two arms; 'arm at lag k vs lag b' for a lag line."""
    if e.arm is None:
        return f"{e.x} vs {e.y} at lag {e.lag}"
    return f"{e.arm} at {e.x} vs {e.y}"


def _detected(e: Evidence) -> str:
    on, seeds = f"on {METRIC_TEXT[e.metric]}", f"{e.pairs} seeds"
    if e.arm is not None:  # the later lag against the base, in the later lag's direction
        worse = e.diff < 0
        effect = _effect(-e.diff, -e.high, -e.low) if worse else _effect(e.diff, e.low, e.high)
        how = "worse" if worse else "better"
        return f"{e.arm} at {e.x} is {how} than at {e.y} {on} by {effect}, {_p(e.p_holm)}, {seeds}"
    flip = e.diff < 0  # state the winner first, its lead positive
    win, lose = (e.y, e.x) if flip else (e.x, e.y)
    effect = _effect(-e.diff, -e.high, -e.low) if flip else _effect(e.diff, e.low, e.high)
    return f"{win} beats {lose} at lag {e.lag} {on} by {effect}, {_p(e.p_holm)}, {seeds}"


def _margin_clause(e: Evidence) -> str:
    delta = format_number(e.margin)
    if e.arm is not None:
        return (
            f"; not worse than at {e.y} by more than {delta} "
            f"({_p(e.margin_p_holm, 'non-inferiority Holm p')})"
        )
    return f"; equivalent within +-{delta} ({_p(e.margin_p_holm, 'TOST Holm p')})"


def sentence(e: Evidence, alpha: float, power: float) -> str:
    """The Findings line of one comparison (see the module docstring)."""
    kind, on = verdict(e, alpha), f"on {METRIC_TEXT[e.metric]}"
    if kind == "untested":
        why = e.p_note or "paired t needs at least 2 matched seeds"
        seeds = f"{e.pairs} matched seed{'' if e.pairs == 1 else 's'}"
        return f"{_subject(e)} {on}: not tested ({seeds}; {why})"
    if kind == "detected":
        return _detected(e)
    effect = _effect(e.diff, e.low, e.high)
    if kind == "disagree":
        if math.isfinite(e.p_holm) and e.p_holm < alpha:
            split = f"{_p(e.p_holm)} < {alpha:g} but the interval {effect} includes 0"
        else:
            split = f"the interval {effect} excludes 0 but {_p(e.p_holm)} >= {alpha:g}"
        head = f"{_subject(e)} {on}: no difference claimed, test and interval disagree ({split})"
    else:
        # No paired t (every matched difference equal, say): its note stands in for the p.
        test = _p(e.p_holm) if math.isfinite(e.p_holm) else e.p_note
        head = f"{_subject(e)} {on}: no difference detected ({effect}, {test})"
    if kind in ("equivalent", "noninferior"):
        return head + _margin_clause(e)
    mde = ""
    if math.isfinite(e.min_detectable):
        mde = f"; at n = {e.pairs} the smallest detectable difference is "
        mde += format_number(e.min_detectable)
    return head + mde + seeds_clause(e, power)


def finding_rows(prior: pd.DataFrame, alpha: float, power: float, margin: float) -> list[dict]:
    """Sections `findings` (final score) and `findings_auc`: one row per line; statistic =
    verdict, value = X - Y."""
    return [
        row(
            SECTIONS[e.metric],
            verdict(e, alpha),
            e.diff,
            arm=e.arm,
            lag=e.lag,
            comparison=f"{e.x} vs {e.y}",
            ci_low=e.low,
            ci_high=e.high,
            n=e.pairs,
            note=sentence(e, alpha, power),
        )
        for e in evidence(prior, margin)
    ]


def analyse(inputs: Inputs, prior: pd.DataFrame) -> Part:
    """Findings from the rows of `comparisons`, `lag_effects` and `claims` in `prior`
    (analysed after every other section)."""
    c = inputs.config
    return Part(finding_rows(prior, c.alpha, c.target_power, c.equivalence_margin))


def blocks(page: Page) -> list[Block]:
    """The Findings: a short explanation and one line per comparison and metric."""
    if not page.has(SECTION):
        return []
    summary, config = page.summary, page.config
    rows = summary[summary["section"].isin(SECTIONS.values())]
    order = rows.assign(
        kind=rows["arm"].notna(), metric=rows["section"].ne(SECTION), arm_=rows["arm"].fillna("")
    ).sort_values(["kind", "lag", "arm_", "comparison", "metric"])
    intro = (
        "One line per comparison (arm pairs at each lag; with a lag axis, each arm at each lag "
        "against its smallest lag) on the final score and on the AUC: the paired mean "
        f"difference (X - Y for 'X vs Y') with its {config.confidence:.0%} bootstrap interval, "
        "the matched seeds, and the paired t-test, Holm-adjusted over every line of these "
        "Findings (see Tests behind the Findings). A difference counts as detected only when Holm "
        f"p < {config.alpha:g} and the interval excludes 0. 'Equivalent' (two arms, TOST) and "
        "'not worse' (a lag against the smallest, one-sided) are stated only when that test, "
        "Holm-adjusted over every line, has p < "
        f"{config.alpha:g} at the margin {config.equivalence_margin:g} "
        "(report.equivalence_margin). Detectable differences and seeds needed are for "
        f"{config.target_power:.0%} power at alpha {config.alpha:g} before Holm's correction "
        "(see Power and What to do next)."
    )
    return [Block("h2", "Findings"), Block("p", intro), Block("list", items=list(order["note"]))]
