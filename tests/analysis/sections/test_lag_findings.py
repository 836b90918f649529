"""A staleness study's report finds a planted staleness cost, says "not worse" only where the
non-inferiority test supports it, names each arm's max safe lag, and adjusts every Findings line
in one Holm family (final score and AUC, arm pairs and lags)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from statsmodels.stats.multitest import multipletests

from analysis import ReportConfig, build_report
from analysis.render import format_number
from analysis.report import ReportResult
from analysis.sections.lag_effects import max_safe_lag
from analysis.synthetic import SyntheticSpec, write_experiment

MARGIN = 0.04
CONFIG = ReportConfig(
    n_resamples=400, curve_resamples=200, make_figures=False, equivalence_margin=MARGIN
)
# AReaL's ablation in miniature: `naive` loses 0.05 of pass rate per version of staleness,
# `decoupled` nothing; 6 seeds, lags 0, 2 and 4, eval noise SD 0.01.
SPEC = SyntheticSpec(
    skill={"naive": 0.7, "decoupled": 0.7},
    lag_penalties={"naive": 0.05, "decoupled": 0.0},
    seeds=(0, 1, 2, 3, 4, 5),
    lags=(0, 2, 4),
    steps=30,
    eval_every=5,
    rows_per_part=8,
    noise_sd=0.01,
    corrections=True,
)


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> ReportResult:
    tmp = tmp_path_factory.mktemp("lags")
    return build_report(write_experiment(tmp / "exp", SPEC), tmp / "report", CONFIG)


def _rows(summary: pd.DataFrame, section: str, **keys: object) -> pd.DataFrame:
    rows = summary[summary["section"] == section]
    for column, value in keys.items():
        rows = rows[rows[column] == value]
    return rows


def _holm_p(name: str, p: float) -> str:
    """How a line writes a Holm p: 'Holm p = 0.0123', or 'Holm p < 0.0001'."""
    text = format_number(p, "paired_t_p_holm")
    return f"{name} < 0.0001" if text.startswith("<") else f"{name} = {text}"


def _one(summary: pd.DataFrame, section: str, **keys: object) -> pd.Series:
    rows = _rows(summary, section, **keys)
    assert len(rows) == 1, (section, keys, rows)
    return rows.iloc[0]


def test_a_planted_staleness_cost_is_found_in_the_direction_it_has(report: ReportResult) -> None:
    summary = report.summary
    for lag in (2, 4):
        where = {"arm": "naive", "lag": lag, "comparison": f"lag {lag} vs lag 0"}
        line = _one(summary, "findings", **where)
        diff = _one(summary, "lag_tests_final_score", statistic="mean_diff_paired", **where)
        p = _one(summary, "claims", statistic="final_score_diff_p_holm", **where)["value"]
        assert line["statistic"] == "detected" and line["value"] == diff["value"] < -0.05
        loss = [format_number(-diff[c]) for c in ("value", "ci_high", "ci_low")]
        assert line["note"] == (
            f"naive at lag {lag} is worse than at lag 0 on the final score by +{loss[0]} "
            f"[{loss[1]}, {loss[2]}], {_holm_p('Holm p', p)}, 6 seeds"
        )


def test_not_worse_is_said_only_where_the_non_inferiority_test_holds(
    report: ReportResult,
) -> None:
    summary = report.summary
    for lag in (2, 4):
        where = {"arm": "decoupled", "lag": lag, "comparison": f"lag {lag} vs lag 0"}
        line = _one(summary, "findings", **where)
        p = _one(summary, "claims", statistic="final_score_margin_p_holm", **where)["value"]
        assert p < 0.05 and line["statistic"] == "noninferior"
        assert line["note"].startswith(
            f"decoupled at lag {lag} vs lag 0 on the final score: no difference detected ("
        )
        assert line["note"].endswith(
            f"; not worse than at lag 0 by more than {format_number(MARGIN)} "
            f"({_holm_p('non-inferiority Holm p', p)})"
        )
    # naive's lines never claim it: its loss is far beyond the margin.
    assert not _rows(summary, "findings", arm="naive")["note"].str.contains("not worse").any()


def test_every_findings_line_is_in_one_holm_family_per_test(report: ReportResult) -> None:
    summary = report.summary
    claims = _rows(summary, "claims")
    lines = summary[summary["section"].isin(["findings", "findings_auc"])]
    # 1 arm pair x 3 lags + 2 arms x 2 later lags, on the final score and on the AUC
    assert len(lines) == 2 * (3 + 4) == len(claims) // 4
    for kind in ("diff", "margin"):
        raw = claims[claims["statistic"].str.endswith(f"_{kind}_p")].sort_values(
            ["statistic", "lag", "comparison", "arm"]
        )
        adjusted = claims[claims["statistic"].str.endswith(f"_{kind}_p_holm")].sort_values(
            ["statistic", "lag", "comparison", "arm"]
        )
        ok = np.isfinite(raw["value"].to_numpy())
        expected = multipletests(raw["value"].to_numpy()[ok], method="holm")[1]
        np.testing.assert_allclose(adjusted["value"].to_numpy()[ok], expected, rtol=1e-12)
    # The raw p-values are the tables': a lag line's test is lag_effects' paired t.
    where = {"arm": "naive", "lag": 4, "comparison": "lag 4 vs lag 0"}
    table_p = _one(summary, "lag_tests_auc", statistic="paired_t_p", **where)["value"]
    assert _one(summary, "claims", statistic="auc_diff_p", **where)["value"] == table_p


def test_auc_lines_accompany_the_final_score_lines(report: ReportResult) -> None:
    final = _rows(report.summary, "findings")
    auc = _rows(report.summary, "findings_auc")
    keys = ["arm", "lag", "comparison"]
    assert final[keys].fillna("").values.tolist() == auc[keys].fillna("").values.tolist()
    assert auc["note"].str.contains("on the AUC").all()
    md = report.markdown_path.read_text()
    for note in [*final["note"], *auc["note"]]:
        assert f"- {note}" in md


def test_each_arm_names_its_max_safe_lag_with_its_throughput(report: ReportResult) -> None:
    summary = report.summary
    safe = {
        arm: _one(summary, "max_safe_lag", arm=arm, statistic="max_safe_lag")
        for arm in ("naive", "decoupled")
    }
    assert safe["naive"]["value"] == 0 and safe["decoupled"]["value"] == 4
    speedup = _one(summary, "max_safe_lag", arm="decoupled", statistic="speedup")["value"]
    fast = _one(summary, "staleness", arm="decoupled", lag=4, statistic="steps_per_s")["value"]
    slow = _one(summary, "staleness", arm="decoupled", lag=0, statistic="steps_per_s")["value"]
    assert speedup == pytest.approx(fast / slow) and speedup > 2
    assert "Max safe lag per arm" in report.markdown_path.read_text()


def test_max_safe_lag_is_contiguous() -> None:
    assert max_safe_lag({1: 0.01, 2: 0.02, 4: 0.3, 8: 0.01}, 0, 0.05) == 2
    assert max_safe_lag({1: 0.2, 2: 0.01}, 0, 0.05) == 0
    assert max_safe_lag({2: float("nan")}, 0, 0.05) == 0


def test_behaviour_kl_is_shown_per_arm_and_lag(report: ReportResult) -> None:
    kl = _rows(report.summary, "staleness", statistic="kl_behavior_mean")
    assert sorted(zip(kl["arm"], kl["lag"], strict=True)) == [
        (arm, lag) for arm in ("decoupled", "naive") for lag in (2, 4)
    ]  # lag 0 has no stale rows: no KL to show
    by_lag = kl.groupby("lag")["value"].mean()
    assert by_lag[4] > by_lag[2] > 0
    assert "kl_behavior_mean" in report.markdown_path.read_text()


def test_a_report_without_a_lag_axis_has_no_lag_lines(tmp_path: Path) -> None:
    spec = SyntheticSpec(skill={"a": 0.6, "b": 0.5}, seeds=(0, 1, 2), lags=(0,), steps=20)
    result = build_report(write_experiment(tmp_path / "exp", spec), tmp_path / "r", CONFIG)
    sections = set(result.summary["section"])
    assert {"findings", "findings_auc", "claims"} <= sections
    assert not {"lag_tests_final_score", "max_safe_lag"} & sections
