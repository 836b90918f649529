"""The report of an experiment with two eval sets (evals.parquet), locally and through MLflow,
and of an old-style experiment whose trials have only `eval/pass_rate`."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import pyarrow.dataset as ds
import pytest
from scipy import stats

from analysis import ReportConfig, build_report, build_report_from_mlflow
from analysis.mlflow_report import OUT_DIR_TAG, PARENT_TAG
from analysis.synthetic import SyntheticSpec, write_experiment
from contract import evals as ev
from tests.analysis.experiments import TWO_ARMS

FAST = ReportConfig(n_resamples=300, curve_resamples=200, figure_dpi=50)
TABLES_ONLY = ReportConfig(n_resamples=300, curve_resamples=200, make_figures=False)
SPEC = replace(TWO_ARMS, eval_sets=("heldout", "hard"), tokens_per_step=1000.0)
NEW_SECTIONS = {
    "eval_set_scores",
    "eval_aggregate",
    "performance_profile",
    "poi_eval_sets",
    "compute_matched",
    "compute_curves",
    "next_steps",
}


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_experiment(tmp_path_factory.mktemp("exp"), SPEC)


@pytest.fixture(scope="module")
def report(root: Path, tmp_path_factory: pytest.TempPathFactory):
    return build_report(root, tmp_path_factory.mktemp("report"), FAST)


def _one(summary: pd.DataFrame, section: str, statistic: str, **keys: object) -> pd.Series:
    mask = (summary["section"] == section) & (summary["statistic"] == statistic)
    for column, value in keys.items():
        mask &= summary[column].isna() if value is None else summary[column] == value
    assert mask.sum() == 1, (section, statistic, keys)
    return summary[mask].iloc[0]


def _final_greedy(root: Path, arm: str, lag: int, eval_set: str, k: int = 3) -> dict[int, float]:
    """{seed: final greedy score} straight from evals.parquet (diverged seeds score 0)."""
    out = {}
    for seed in SPEC.seeds:
        if (arm, seed, lag) in {(a, s, g) for a, s, g, _ in SPEC.diverged}:
            out[seed] = 0.0
            continue
        path = root / "trials" / f"{arm}-s{seed}-lag{lag}" / "evals.parquet"
        table = ds.dataset(path, format="parquet").to_table().to_pandas()
        rows = table[table[ev.EVAL_SET] == eval_set].sort_values(ev.STEP)
        out[seed] = float(rows[ev.GREEDY_PASS_RATE].to_numpy()[-k:].mean())
    return out


@pytest.mark.parametrize(("arm", "lag", "eval_set"), [("gspo", 0, "hard"), ("grpo", 2, "heldout")])
def test_per_set_final_score_matches_the_table(report, root: Path, arm, lag, eval_set) -> None:
    expected = list(_final_greedy(root, arm, lag, eval_set).values())
    got = _one(
        report.summary, "eval_set_scores", "final_greedy", arm=arm, lag=lag, comparison=eval_set
    )
    assert got["value"] == pytest.approx(stats.trim_mean(expected, 0.25), abs=1e-12)
    assert got["n"] == 3 and got["ci_low"] <= got["value"] <= got["ci_high"]


def test_aggregate_across_sets_is_the_pooled_matrix(report, root: Path) -> None:
    heldout = _final_greedy(root, "gspo", 2, "heldout")
    hard = _final_greedy(root, "gspo", 2, "hard")
    pooled = np.array([*heldout.values(), *hard.values()])
    iqm = _one(
        report.summary, "eval_aggregate", "iqm", arm="gspo", lag=2, comparison="final_greedy"
    )
    assert iqm["value"] == pytest.approx(stats.trim_mean(pooled, 0.25), abs=1e-12)
    assert iqm["note"] == "strata: 2 eval sets (heldout, hard)"
    mean = _one(
        report.summary, "eval_aggregate", "mean", arm="gspo", lag=2, comparison="final_greedy"
    )
    set_means = [np.mean(list(heldout.values())), np.mean(list(hard.values()))]
    assert mean["value"] == pytest.approx(np.mean(set_means), abs=1e-12)
    gap = _one(
        report.summary,
        "eval_aggregate",
        "optimality_gap",
        arm="gspo",
        lag=2,
        comparison="final_greedy",
    )
    assert gap["value"] == pytest.approx(1 - np.minimum(pooled, 1).mean(), abs=1e-12)
    # sampled pass@1 and pass@4 are reported per set
    assert (
        _one(
            report.summary,
            "eval_set_scores",
            "final_pass_at_4",
            arm="gspo",
            lag=0,
            comparison="hard",
        )["value"]
        > 0
    )


def test_headline_is_the_aggregate_and_everything_is_written(report) -> None:
    md = report.markdown_path.read_text()
    assert md.index("## Scores across 2 eval sets (headline)") < md.index(
        "## Scores on the primary eval set"
    )
    assert "bootstrap stratified by eval set" in md and "## What to do next" in md
    assert "## Compute-matched comparison" in md and "Which arm leads at equal budget" in md
    on_disk = pd.read_parquet(report.summary_path)
    assert set(on_disk["section"]) >= NEW_SECTIONS
    assert {"eval_sets", "eval_aggregates", "performance_profiles", "compute_matched"} <= set(
        report.figure_paths
    )
    html = report.html_path.read_text()
    assert html.count("data:image/png;base64,") == len(report.figure_paths)
    # the tokens axis was measured, and the diverged grpo seed is left out of compute curves
    curves = on_disk[on_disk["section"] == "compute_curves"]
    assert curves["comparison"].str.startswith("tokens ").any()
    assert (curves[(curves["arm"] == "grpo") & (curves["lag"] == 2)]["n"] == 2).all()


def test_old_style_experiment_reports_one_heldout_set(tmp_path: Path) -> None:
    spec = SyntheticSpec(skill={"gspo": 0.7, "grpo": 0.6}, seeds=(0, 1), lags=(0,), steps=20)
    root = write_experiment(tmp_path / "exp", spec)
    result = build_report(root, tmp_path / "out", TABLES_ONLY)
    per_set = result.summary[result.summary["section"] == "eval_set_scores"]
    assert set(per_set["comparison"]) == {"heldout"} and set(per_set["statistic"]) == {
        "final_greedy",
        "auc_greedy",
    }
    final = _one(result.summary, "final_score", "iqm", arm="gspo", lag=0)
    same = _one(
        result.summary, "eval_set_scores", "final_greedy", arm="gspo", lag=0, comparison="heldout"
    )
    assert same["value"] == final["value"]  # the single set is eval/pass_rate
    md = result.markdown_path.read_text()
    assert "## Scores\n" in md and "eval sets (headline)" not in md
    across = {"eval_aggregate", "performance_profile", "poi_eval_sets"}
    assert not across & set(result.summary["section"])  # they would repeat final_score and PoI
    # no tokens logged: compute-matched curves on steps and seconds only
    axes = (
        result.summary[result.summary["section"] == "compute_curves"]["comparison"]
        .str.split()
        .str[0]
    )
    assert set(axes) == {"step", "seconds"}


def test_two_eval_sets_through_mlflow(root: Path, report, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = mlflow.MlflowClient(tracking_uri=uri)
    experiment_id = client.create_experiment("evals", artifact_location=(tmp_path / "art").as_uri())
    parent = client.create_run(experiment_id, run_name="parent", tags={OUT_DIR_TAG: str(root)})
    for trial in sorted((root / "trials").iterdir()):
        child = client.create_run(
            experiment_id, run_name=trial.name, tags={PARENT_TAG: parent.info.run_id}
        )
        client.log_artifacts(child.info.run_id, str(trial), artifact_path="trial")
        client.set_terminated(child.info.run_id)
    result = build_report_from_mlflow(uri, "evals", tmp_path / "remote", FAST, log_to_parent=True)
    sections = [
        "eval_set_scores",
        "eval_aggregate",
        "performance_profile",
        "poi_eval_sets",
        "compute_matched",
    ]
    pick = lambda s: s[s["section"].isin(sections)].reset_index(drop=True)  # noqa: E731
    pd.testing.assert_frame_equal(pick(result.summary), pick(report.summary))
    # the extension command names the original output directory, not the download
    note = result.summary[result.summary["section"] == "next_steps"]["note"]
    assert note.str.contains(f"--out {root}").any()
    figures = {f.path for f in client.list_artifacts(parent.info.run_id, "report/figures")}
    assert "report/figures/eval_aggregates.png" in figures
