"""Section "Tests behind the Findings": one Holm family for every claim the Findings make.

Each Findings line is a comparison on one metric: two arms at one lag (`comparisons`), or one
arm at a lag against its smallest lag (`lag_effects`), on the final score or the AUC. A report
with many lines makes many claims, so the multiplicity correction runs over all of them, not per
table: Holm over every line's two-sided paired t-test (a difference), and Holm over every line's
margin test (TOST equivalence for two arms, non-inferiority for a later lag), each family on
its own. Nothing new is tested here: the raw p-values are the tables' rows, restated with the
family's adjustment, so a Findings line and this table cannot disagree.

Rows (section `claims`, keyed like their source rows): `<metric>_diff_p`, `<metric>_diff_p_holm`,
`<metric>_margin_p`, `<metric>_margin_p_holm` for metric in final_score, auc.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import pandas as pd

from analysis.render import Block
from analysis.sections.base import Inputs, Page, Part, no_figures, table
from analysis.stats.significance import holm
from analysis.summary import row

SECTION = "claims"
METRICS = ("final_score", "auc")
Kind = Literal["pair", "lag"]
# Where each kind's rows come from, and which of its tests is the margin test.
SOURCES: dict[Kind, tuple[str, str]] = {
    "pair": ("tests_{metric}", "tost_p"),
    "lag": ("lag_tests_{metric}", "noninferiority_p"),
}
METHODS: list[str] = []
draw = no_figures


@dataclass(frozen=True)
class Line:
    """One claim's raw numbers: X vs Y (two arms at `lag`, or `arm` at `lag` vs its base)."""

    kind: Kind
    metric: str
    lag: int
    comparison: str
    arm: str | None
    diff: float  # mean paired difference X - Y
    low: float  # its paired-bootstrap interval
    high: float
    pairs: int
    diff_p: float  # two-sided paired t
    diff_note: str
    margin_p: float  # TOST (pair) or non-inferiority (lag)
    margin_note: str


def _key(r: pd.Series) -> tuple:
    arm = None if pd.isna(r["arm"]) else str(r["arm"])
    return arm, int(r["lag"]), str(r["comparison"])


def _cells(prior: pd.DataFrame, section: str, statistic: str) -> dict[tuple, pd.Series]:
    rows = prior[(prior["section"] == section) & (prior["statistic"] == statistic)]
    return {_key(r): r for _, r in rows.iterrows()}


def _note(r: pd.Series) -> str:
    return "" if pd.isna(r["note"]) else str(r["note"])


def findings_lines(prior: pd.DataFrame) -> list[Line]:
    """Every Findings line's raw numbers, pairs before lags, each in (metric, lag, key) order."""
    out = []
    for kind, (template, margin_test) in SOURCES.items():
        for metric in METRICS:
            section = template.format(metric=metric)
            diffs = _cells(prior, section, "mean_diff_paired")
            tests = _cells(prior, section, "paired_t_p")
            margins = _cells(prior, section, margin_test)
            for key in sorted(diffs, key=lambda k: (k[1], k[2], k[0] or "")):
                d, t, m = diffs[key], tests[key], margins[key]
                out.append(
                    Line(
                        kind=kind,
                        metric=metric,
                        lag=key[1],
                        comparison=key[2],
                        arm=key[0],
                        diff=float(d["value"]),
                        low=float(d["ci_low"]),
                        high=float(d["ci_high"]),
                        pairs=0 if pd.isna(t["n"]) else int(t["n"]),
                        diff_p=float(t["value"]),
                        diff_note=_note(t),
                        margin_p=float(m["value"]),
                        margin_note=_note(m),
                    )
                )
    return out


def claim_rows(found: list[Line]) -> list[dict]:
    """Section `claims`: each line's raw p-values and their Holm adjustment over all lines."""
    diff_holm = holm(np.array([line.diff_p for line in found]))
    margin_holm = holm(np.array([line.margin_p for line in found]))
    n_diff, n_margin = int(np.isfinite(diff_holm).sum()), int(np.isfinite(margin_holm).sum())
    rows = []
    for line, dh, mh in zip(found, diff_holm, margin_holm, strict=True):
        keys = {"arm": line.arm, "lag": line.lag, "comparison": line.comparison, "n": line.pairs}
        m = line.metric
        rows += [
            row(SECTION, f"{m}_diff_p", line.diff_p, note=line.diff_note, **keys),
            row(SECTION, f"{m}_diff_p_holm", dh, note=f"Holm over {n_diff} lines", **keys),
            row(SECTION, f"{m}_margin_p", line.margin_p, note=line.margin_note, **keys),
            row(SECTION, f"{m}_margin_p_holm", mh, note=f"Holm over {n_margin} lines", **keys),
        ]
    return rows


def analyse(inputs: Inputs, prior: pd.DataFrame) -> Part:
    return Part(claim_rows(findings_lines(prior)))


def adjusted_p_values(summary: pd.DataFrame) -> dict[tuple, float]:
    """{(arm, lag, comparison, statistic): value} of the `claims` rows, for the readers."""
    rows = summary[summary["section"] == SECTION]
    return {(*_key(r), str(r["statistic"])): float(r["value"]) for _, r in rows.iterrows()}


def blocks(page: Page) -> list[Block]:
    if not page.has(SECTION):
        return []
    text = (
        "Every Findings line is one comparison on one metric; these are its tests, adjusted "
        "over every line of the Findings (final score and AUC, arm pairs and lags alike). "
        "*_diff_p: two-sided paired t-test. *_margin_p: for two arms, the paired equivalence "
        "test (TOST) within the margin; for a lag, the one-sided non-inferiority test against the "
        f"arm's smallest lag; margin {page.config.equivalence_margin:g} "
        "(report.equivalence_margin). *_holm: Holm over every line, one family per kind of test. "
        "n = matched seeds."
    )
    return [
        Block("h2", "Tests behind the Findings"),
        *table(page.summary, SECTION, "Holm over every Findings line", text),
    ]
