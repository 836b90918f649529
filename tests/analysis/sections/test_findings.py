"""Findings: the report opens with one line per comparison and metric that states only what the
comparison tables support: a planted effect with its direction, no difference with the smallest
detectable one, the seeds an effect would need, or that it is impractical to resolve with seeds.
(Lag lines, non-inferiority and the one Holm family: test_lag_findings.py.)"""

from __future__ import annotations

import html
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from statsmodels.stats.power import TTestPower

from analysis import ReportConfig, build_report
from analysis.loading import load_experiment
from analysis.render import format_number
from analysis.report import ReportResult
from analysis.sections.findings import Evidence, seeds_clause, sentence, verdict
from analysis.synthetic import SyntheticSpec, write_experiment
from analysis.trial_scores import matched, score_trials

CONFIG = ReportConfig(n_resamples=400, curve_resamples=200, make_figures=False)
SHAPE = {"lags": (0, 2), "steps": 30, "eval_every": 10, "rows_per_part": 8}
# GSPO 0.1 above GRPO, 5 seeds: the paired differences' SD is about 0.02 (eval noise only).
PLANTED = SyntheticSpec(skill={"gspo": 0.7, "grpo": 0.6}, seeds=(0, 1, 2, 3, 4), **SHAPE)
# No effect, 3 seeds: what remains is eval noise.
NULL = SyntheticSpec(skill={"gspo": 0.6, "grpo": 0.6}, seeds=(0, 1, 2), **SHAPE)
PAIR = "grpo vs gspo"  # the comparisons' label: X before Y alphabetically, differences X - Y


def _build(tmp: Path, spec: SyntheticSpec) -> tuple[Path, ReportResult]:
    root = write_experiment(tmp / "exp", spec)
    return root, build_report(root, tmp / "report", CONFIG)


@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory) -> ReportResult:
    return _build(tmp_path_factory.mktemp("planted"), PLANTED)[1]


@pytest.fixture(scope="module")
def null(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, ReportResult]:
    return _build(tmp_path_factory.mktemp("null"), NULL)


def _one(summary: pd.DataFrame, section: str, statistic: str | None, lag: int) -> pd.Series:
    rows = summary[
        (summary["section"] == section)
        & (summary["lag"] == lag)
        & (summary["comparison"] == PAIR)
        & summary["arm"].isna()  # the arm pair's line, not a lag line
    ]
    if statistic is not None:
        rows = rows[rows["statistic"] == statistic]
    assert len(rows) == 1, (section, statistic, lag)
    return rows.iloc[0]


@pytest.mark.parametrize("lag", [0, 2])
def test_a_planted_effect_is_stated_with_its_direction(planted: ReportResult, lag: int) -> None:
    summary = planted.summary
    finding = _one(summary, "findings", None, lag)
    diff = _one(summary, "tests_final_score", "mean_diff_paired", lag)
    p = _one(summary, "claims", "final_score_diff_p_holm", lag)  # Holm over every line
    # The numbers are the comparison table's: grpo - gspo < 0, so the line names gspo first and
    # states its lead as gspo - grpo, the interval flipped with it.
    assert finding["statistic"] == "detected" and finding["value"] == diff["value"] < 0
    assert diff["ci_high"] < 0 and p["value"] < 0.05
    lead, low, high = (format_number(-diff[c]) for c in ("value", "ci_high", "ci_low"))
    assert finding["note"] == (
        f"gspo beats grpo at lag {lag} on the final score by +{lead} [{low}, {high}], "
        f"Holm p = {format_number(p['value'], 'paired_t_p_holm')}, 5 seeds"
    )


def test_findings_open_the_report(planted: ReportResult) -> None:
    md = planted.markdown_path.read_text()
    headings = [line for line in md.splitlines() if line.startswith("## ")]
    assert headings[0] == "## Findings"
    overview = md.index("trials, 20 scored")
    sections = planted.summary["section"]
    finding_lines = planted.summary[sections.isin(["findings", "findings_auc"])]["note"]
    for note in finding_lines:
        assert md.index(f"- {note}") < overview  # above the overview paragraph
    page = planted.html_path.read_text()
    assert page.index("<h2>") == page.index("<h2>Findings</h2>")  # the first h2
    assert all(html.escape(note) in page for note in finding_lines)
    on_disk = pd.read_parquet(planted.summary_path)
    assert set(on_disk["section"][: len(finding_lines)]) == {"findings", "findings_auc"}


def _paired_sd(root: Path, lag: int) -> float:
    """SD of the per-seed final-score differences, straight from the trial scores."""
    scores = score_trials(load_experiment(root), CONFIG)
    pairs = matched(scores[scores["scored"]], "final_score", "grpo", "gspo", lag)
    return float(np.std(pairs["x"] - pairs["y"], ddof=1))


@pytest.mark.parametrize("lag", [0, 2])
def test_no_effect_says_no_difference_detected_and_the_detectable_one(
    null: tuple[Path, ReportResult], lag: int
) -> None:
    root, report = null
    finding = _one(report.summary, "findings", None, lag)
    assert finding["statistic"] == "not_detected"
    assert finding["note"].startswith(
        f"grpo vs gspo at lag {lag} on the final score: no difference detected ("
    )
    mdd = _one(report.summary, "power", "min_detectable_diff", lag)["value"]
    assert f"at n = 3 the smallest detectable difference is {format_number(mdd)}" in finding["note"]
    # That difference is statsmodels' 80%-power effect at 3 pairs (d_z = 3.26) times the SD of
    # the 3 paired differences.
    d_z = TTestPower().solve_power(effect_size=None, nobs=3, alpha=0.05, power=0.8)
    assert mdd == pytest.approx(d_z * _paired_sd(root, lag), rel=1e-3)


def test_too_few_seeds_say_how_many_and_past_fifty_that_it_is_impractical(
    null: tuple[Path, ReportResult],
) -> None:
    kinds = set()
    for lag in (0, 2):
        note = _one(null[1].summary, "findings", None, lag)["note"]
        needed = _one(null[1].summary, "power", "seeds_needed", lag)["value"]
        assert needed > 3  # the 3 seeds run are not enough for the observed effect
        if needed <= 50:
            kinds.add("seeds")
            assert note.endswith(
                f"; would need about {int(needed)} seeds per arm for 80% power at the observed "
                "effect"
            )
        else:
            kinds.add("impractical")
            assert note.endswith(
                f"; 80% power at the observed effect would need more than 50 seeds per arm "
                f"(about {int(needed):,}): impractical at this effect size"
            )
    assert kinds == {"seeds", "impractical"}  # this noise draw has one of each


def _evidence(**changes: object) -> Evidence:
    """X vs Y at lag 1, 4 pairs: +0.05 [0.01, 0.09], Holm p 0.02: detected unless changed."""
    base = {
        "lag": 1,
        "x": "gspo",
        "y": "grpo",
        "diff": 0.05,
        "low": 0.01,
        "high": 0.09,
        "pairs": 4,
        "p_holm": 0.02,
        "p_note": "",
        "seeds_needed": 14.0,
        "min_detectable": 0.07,
    }
    return Evidence(**(base | changes))


def test_detected_needs_both_the_test_and_the_interval() -> None:
    assert verdict(_evidence(), 0.05) == "detected"
    assert verdict(_evidence(p_holm=0.2, low=-0.01), 0.05) == "not_detected"
    test_only = _evidence(low=-0.01)  # Holm p 0.02 but the interval includes 0
    interval_only = _evidence(p_holm=0.08)  # the interval excludes 0 but Holm p 0.08
    assert verdict(test_only, 0.05) == verdict(interval_only, 0.05) == "disagree"
    assert sentence(test_only, 0.05, 0.8) == (
        "gspo vs grpo at lag 1 on the final score: no difference claimed, test and interval "
        "disagree (Holm p = "
        "0.0200 < 0.05 but the interval +0.050 [-0.010, 0.090] includes 0); at n = 4 the "
        "smallest detectable difference is 0.070; would need about 14 seeds per arm for 80% "
        "power at the observed effect"
    )
    assert "beats" not in sentence(interval_only, 0.05, 0.8)
    assert "excludes 0 but Holm p = 0.0800 >= 0.05" in sentence(interval_only, 0.05, 0.8)


def test_a_win_of_y_is_stated_as_y_beating_x() -> None:
    # X - Y = -0.05 [-0.09, -0.01]: grpo leads by +0.05 [0.01, 0.09].
    e = _evidence(diff=-0.05, low=-0.09, high=-0.01, p_holm=0.00001)
    assert sentence(e, 0.05, 0.8) == (
        "grpo beats gspo at lag 1 on the final score by +0.050 [0.010, 0.090], Holm p < 0.0001, "
        "4 seeds"
    )


def test_seeds_clause() -> None:
    assert seeds_clause(_evidence(), 0.8) == (
        "; would need about 14 seeds per arm for 80% power at the observed effect"
    )
    assert seeds_clause(_evidence(seeds_needed=216.0), 0.8) == (
        "; 80% power at the observed effect would need more than 50 seeds per arm (about 216): "
        "impractical at this effect size"
    )
    no_count = seeds_clause(_evidence(seeds_needed=math.nan), 0.8)  # beyond 10^6 seeds
    assert no_count.endswith("more than 50 seeds per arm: impractical at this effect size")
    assert seeds_clause(_evidence(seeds_needed=3.0), 0.8) == (
        "; 3 seeds would already give 80% power at the observed effect before Holm's correction"
    )
    assert seeds_clause(_evidence(diff=0.0), 0.8) == ""  # no effect to plan for


def test_identical_arms_are_equivalent_without_a_difference_test() -> None:
    """Bitwise-equal trials: every difference 0, no paired t, the margin test at its limit."""
    note = "paired t undefined: every matched difference is equal"
    e = _evidence(diff=0.0, low=0.0, high=0.0, p_holm=math.nan, p_note=note, margin_p_holm=0.0)
    e = Evidence(**{**e.__dict__, "margin": 0.02})
    assert verdict(e, 0.05) == "equivalent"
    assert sentence(e, 0.05, 0.8) == (
        "gspo vs grpo at lag 1 on the final score: no difference detected (+0.000 [0.000, 0.000], "
        "paired t undefined: every matched difference is equal); equivalent within +-0.020 "
        "(TOST Holm p < 0.0001)"
    )


def test_fewer_than_two_matched_seeds_are_not_tested() -> None:
    e = _evidence(pairs=1, p_holm=math.nan, low=math.nan, high=math.nan)
    assert verdict(e, 0.05) == "untested"
    assert sentence(e, 0.05, 0.8) == (
        "gspo vs grpo at lag 1 on the final score: not tested (1 matched seed; paired t needs at "
        "least 2 matched seeds)"
    )
