"""Section "Lag effects within each arm": what each lag costs an arm, paired by seed.

The arm comparisons (`comparisons`) set arms side by side at one lag; a staleness study asks the
other question: does *this* arm lose score when its data is k versions old? Per arm with more
than one lag, each lag k is compared with the arm's smallest lag (lag 0 in a staleness study),
paired by seed (matched trials share the seed's prompts, initial weights and sampling noise):

- the paired mean difference (lag k - base) with its paired-bootstrap interval;
- the two-sided paired t-test (is there a cost or a gain?);
- the one-sided non-inferiority test at `report.equivalence_margin` (is lag k no worse than the
  base by more than the margin?), `analysis.stats.equivalence`.

Holm adjusts each test over every row of its table (all arms and lags). The Findings restate
these rows with Holm over every Findings line instead (section `claims`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.render import Block
from analysis.sections.base import Inputs, Page, Part, no_figures, table
from analysis.sections.comparisons import add_holm
from analysis.stats import BootstrapSpec, paired_mean_difference
from analysis.stats.equivalence import noninferiority_paired
from analysis.stats.significance import paired_t
from analysis.summary import interval_row, row
from analysis.trial_scores import paired_by_seed, seed_values

METRICS = ("final_score", "auc")
SECTIONS = tuple(f"lag_tests_{metric}" for metric in METRICS)
HOLM_TESTS = ("paired_t_p", "noninferiority_p")
METHODS = [
    "Lag effects within an arm: each lag against the arm's smallest lag, paired by seed (paired "
    "bootstrap of the mean difference, paired t-test) and a one-sided paired non-inferiority "
    "t-test at the margin report.equivalence_margin (H0: the later lag is worse by the margin or "
    "more; Schuirmann 1987); Holm over every arm and lag per test.",
]
draw = no_figures


def lag_label(lag: int, base: int) -> str:
    """The comparison key of a lag row: 'lag k vs lag b' (X - Y = lag k - base)."""
    return f"lag {lag} vs lag {base}"


def lag_pairs(scored: pd.DataFrame) -> list[tuple[str, int, int]]:
    """(arm, lag, base lag) for every lag of an arm other than its smallest, in arm, lag order."""
    out = []
    for arm, group in scored.groupby("arm", sort=True):
        lags = sorted(int(lag) for lag in group["lag"].unique())
        out += [(str(arm), lag, lags[0]) for lag in lags[1:]]
    return out


def seed_pairs(scored: pd.DataFrame, column: str, arm: str, lag: int, base: int) -> pd.DataFrame:
    """Per-seed values of one arm at `lag` (x) and at `base` (y), inner-joined on seed."""
    return paired_by_seed(
        seed_values(scored, column, arm, lag), seed_values(scored, column, arm, base)
    )


def _rows(
    scored: pd.DataFrame, metric: str, cell: tuple[str, int, int], spec: BootstrapSpec, margin
) -> list[dict]:
    """One arm's lag against its base lag on one metric (section lag_tests_<metric>)."""
    arm, lag, base = cell
    pairs = seed_pairs(scored, metric, arm, lag, base)
    x, y = pairs["x"].to_numpy(), pairs["y"].to_numpy()
    keys = {"arm": arm, "lag": lag, "comparison": lag_label(lag, base)}
    section = f"lag_tests_{metric}"
    t = paired_t(x, y)
    worse = noninferiority_paired(x, y, margin)
    return [
        interval_row(section, "mean_diff_paired", paired_mean_difference(x, y, spec), **keys),
        row(section, "paired_t_p", t.p_value, n=len(pairs), note=t.note, **keys),
        row(section, "noninferiority_p", worse.p_value, n=len(pairs), note=worse.note, **keys),
    ]


def lag_test_rows(scored: pd.DataFrame, spec: BootstrapSpec, margin: float) -> list[dict]:
    """Sections `lag_tests_final_score` and `lag_tests_auc`, with Holm-adjusted p-values."""
    rows = []
    for metric in METRICS:
        for cell in lag_pairs(scored):
            rows += _rows(scored, metric, cell, spec, margin)
    return add_holm(rows, HOLM_TESTS)


def analyse(inputs: Inputs, prior: pd.DataFrame) -> Part:
    scored = inputs.scored
    if scored.empty or scored["lag"].nunique() < 2:
        return Part()
    return Part(lag_test_rows(scored, inputs.spec, inputs.config.equivalence_margin))


def blocks(page: Page) -> list[Block]:
    if not any(page.has(section) for section in SECTIONS):
        return []
    margin = page.config.equivalence_margin
    explained = (
        "Each lag of an arm against the arm's smallest lag, over the seeds both ran: "
        "mean_diff_paired = later lag - base lag with its paired-bootstrap CI; n = matched "
        "seeds. paired_t_p: two-sided paired t-test. noninferiority_p: one-sided paired t-test of "
        f"H0 'the later lag is worse by {margin:g} or more' (report.equivalence_margin); a small "
        "p supports 'not worse by more than the margin'. *_holm: Holm over every row of this "
        "table, per test."
    )
    return [
        Block("h2", "Lag effects within each arm"),
        *table(page.summary, SECTIONS[0], "Final score", explained, skip_empty=True),
        *table(page.summary, SECTIONS[1], "AUC", "As above, on the AUC.", skip_empty=True),
    ]


def max_safe_lag(p_holm: dict[int, float], base: int, alpha: float) -> int:
    """The largest lag L such that every lag in (base, L] is non-inferior to the base lag
    (Holm-adjusted non-inferiority p < alpha); `base` when the first later lag is not.

    Contiguous on purpose: a lag that passes beyond one that fails is read as noise, not as a
    safe setting past an unsafe one.
    """
    safe = base
    for lag in sorted(p_holm):
        if not (np.isfinite(p_holm[lag]) and p_holm[lag] < alpha):
            break
        safe = lag
    return safe
