"""The full report from synthetic on-disk trial directories: several arms, seeds and lags,
a single seed, and diverged, failed, running or missing trials."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.dataset as ds
import pytest
from scipy import stats

from analysis import ReportConfig, build_report
from analysis.render import format_number
from analysis.summary import SUMMARY_COLUMNS
from analysis.synthetic import SyntheticSpec, write_experiment
from contract import metrics as mn
from tests.analysis.experiments import TWO_ARMS

FAST = ReportConfig(n_resamples=400, curve_resamples=200, figure_dpi=50)
TABLES_ONLY = ReportConfig(n_resamples=400, curve_resamples=200, make_figures=False)
FIGURES = {
    "learning_curves",
    "final_scores",
    "probability_of_improvement",
    "staleness_tradeoff",
    "clip_kl",
    "time_to_threshold",
    "compute_matched",
}
SPEC = replace(TWO_ARMS, rows_per_part=8, failed=(("gspo", 2, 0),))


@pytest.fixture(scope="module")
def experiment_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = write_experiment(tmp_path_factory.mktemp("exp"), SPEC)
    (root / "trials" / "lost-trial").mkdir()  # a trial dir whose trial.json never got written
    running = root / "trials" / "gspo-s9-lag0"
    running.mkdir()
    info = {"experiment": "synthetic", "arm": "gspo", "seed": 9, "lag": 0, "mode": "fixed"}
    info["status"] = "running"
    (running / "trial.json").write_text(json.dumps(info))
    return root


@pytest.fixture(scope="module")
def report(experiment_root: Path, tmp_path_factory: pytest.TempPathFactory):
    return build_report(experiment_root, tmp_path_factory.mktemp("report"), FAST)


def _reference_final_scores(root: Path, arm: str, lag: int, k: int = 3) -> np.ndarray:
    """Final scores recomputed straight from the parquet parts, independent of analysis code."""
    out = []
    for seed in SPEC.seeds:
        trial = root / "trials" / f"{arm}-s{seed}-lag{lag}"
        status = json.loads((trial / "trial.json").read_text())["status"]
        if status == "failed":
            continue
        if status == "diverged":  # its final policy is the diverged one: pass rate 0
            out.append(0.0)
            continue
        table = ds.dataset(trial / "metrics.parquet", format="parquet").to_table().to_pandas()
        evals = table.sort_values(mn.STEP)[mn.EVAL_PASS_RATE].dropna().to_numpy()
        out.append(evals[-k:].mean())
    return np.array(out)


def _value(summary: pd.DataFrame, section: str, statistic: str, **keys: object) -> pd.Series:
    mask = (summary["section"] == section) & (summary["statistic"] == statistic)
    for column, value in keys.items():
        mask &= summary[column].isna() if value is None else summary[column] == value
    rows = summary[mask]
    assert len(rows) == 1, (section, statistic, keys, rows)
    return rows.iloc[0]


def test_outputs_exist_and_html_is_self_contained(report) -> None:
    assert report.markdown_path.exists() and report.summary_path.exists()
    assert set(report.figure_paths) == FIGURES
    for path in report.figure_paths.values():
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    html = report.html_path.read_text()
    assert html.count("data:image/png;base64,") == len(FIGURES)
    assert 'src="figures/' not in html and "<table" in html


def test_summary_parquet_roundtrip_and_schema(report) -> None:
    on_disk = pd.read_parquet(report.summary_path)
    assert list(on_disk.columns) == SUMMARY_COLUMNS
    assert len(on_disk) == len(report.summary)
    pd.testing.assert_series_equal(
        on_disk["value"], report.summary["value"], check_dtype=False, check_names=False
    )


@pytest.mark.parametrize(("arm", "lag"), [("gspo", 0), ("gspo", 2), ("grpo", 0), ("grpo", 2)])
def test_final_score_iqm_matches_reference(
    report, experiment_root: Path, arm: str, lag: int
) -> None:
    expected = _reference_final_scores(experiment_root, arm, lag)
    got = _value(report.summary, "final_score", "iqm", arm=arm, lag=lag)
    assert got["value"] == pytest.approx(stats.trim_mean(expected, 0.25), abs=1e-12)
    assert got["n"] == len(expected)  # the failed gspo seed 2 at lag 0 is not scored
    assert got["ci_low"] <= got["value"] <= got["ci_high"]


def test_numbers_shown_are_the_summary(report) -> None:
    md = report.markdown_path.read_text()
    row = _value(report.summary, "final_score", "iqm", arm="gspo", lag=2)
    cell = (
        f"{format_number(row['value'])} "
        f"[{format_number(row['ci_low'])}, {format_number(row['ci_high'])}]"
    )
    assert cell in md
    p = _value(report.summary, "tests_final_score", "wilcoxon_p", lag=0, comparison="grpo vs gspo")
    assert format_number(p["value"], "wilcoxon_p") in md


def test_problem_trials_are_listed(report) -> None:
    md = report.markdown_path.read_text()
    assert "grpo-s1-lag2" in md and "non-finite grad norm" in md  # diverged
    assert "gspo-s2-lag0" in md and "status 'failed'" in md
    assert "lost-trial" in md and "trial.json absent" in md
    assert "gspo-s9-lag0" in md and "status 'running'" in md
    problems = report.summary[report.summary["section"] == "problems"]
    assert set(problems["comparison"]) >= {"grpo-s1-lag2", "gspo-s2-lag0", "lost-trial"}


def test_divergence_counts_and_small_n_notes(report) -> None:
    grpo = _value(report.summary, "divergence", "diverged_frac", arm="grpo", lag=None)
    assert grpo["value"] == pytest.approx(1 / 6) and grpo["note"] == "1/6"
    # 3 matched seeds: Wilcoxon cannot go below 2 / 2^3 = 0.25; the note says so.
    note = _value(
        report.summary, "tests_final_score", "wilcoxon_p", lag=2, comparison="grpo vs gspo"
    )
    assert "cannot reach significance" in note["note"]


def test_single_seed_report_states_interval_requirement(tmp_path: Path) -> None:
    spec = SyntheticSpec(skill={"gspo": 0.7, "grpo": 0.6}, seeds=(0,), lags=(0, 1), steps=20)
    root = write_experiment(tmp_path / "exp", spec)
    result = build_report(root, tmp_path / "out", FAST)
    md = result.markdown_path.read_text()
    assert "intervals need at least 2 seeds" in md
    finals = result.summary[result.summary["section"] == "final_score"]
    assert finals["ci_low"].isna().all() and finals["value"].notna().all()
    assert "learning_curves" in result.figure_paths


def test_report_without_any_scores(tmp_path: Path) -> None:
    (tmp_path / "trials" / "empty").mkdir(parents=True)
    result = build_report(tmp_path, None, TABLES_ONLY)
    assert result.out_dir == tmp_path / "report"
    md = result.markdown_path.read_text()
    assert "No trial has eval scores yet" in md and "empty" in md
    assert result.figure_paths == {}


def test_missing_root_raises_with_fix(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="harness run"):
        build_report(tmp_path / "nope", None, FAST)


def test_excluding_diverged_and_mixed_modes(tmp_path: Path) -> None:
    spec = SyntheticSpec(
        skill={"gspo": 0.7}, seeds=(0, 1), lags=(0,), steps=20, diverged=(("gspo", 1, 0, 12),)
    )
    root = write_experiment(tmp_path / "exp", spec)
    bounded = write_experiment(
        tmp_path / "b",
        SyntheticSpec(skill={"gspo": 0.7}, seeds=(0, 1), lags=(0,), steps=20, mode="bounded"),
    )
    for trial in (bounded / "trials").iterdir():
        shutil.copytree(trial, root / "trials" / f"bounded-{trial.name}")
    config = TABLES_ONLY.model_copy(update={"diverged_scores": "exclude"})
    result = build_report(root, tmp_path / "out", config)
    fixed = _value(result.summary, "final_score", "mean", arm="gspo (fixed)", lag=0)
    assert fixed["n"] == 1  # the diverged seed is excluded from scores ...
    rate = _value(result.summary, "divergence", "diverged_frac", arm="gspo (fixed)", lag=None)
    assert rate["value"] == 0.5  # ... but still counts as a divergence
    assert _value(result.summary, "final_score", "mean", arm="gspo (bounded)", lag=0)["n"] == 2
    assert "survivors only" in result.markdown_path.read_text()
