"""Logging the report to a real MLflow store (sqlite) and building a report from MLflow runs."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import mlflow
import pandas as pd
import pytest

from analysis import ReportConfig, build_report, build_report_from_mlflow, log_report_to_mlflow
from analysis.mlflow_report import PARENT_TAG, headline_metrics, sanitize_key
from analysis.report import ReportResult
from analysis.synthetic import SyntheticSpec, write_experiment

FAST = ReportConfig(n_resamples=300, curve_resamples=200, figure_dpi=50)
TABLES_ONLY = ReportConfig(n_resamples=300, curve_resamples=200, make_figures=False)
SPEC = SyntheticSpec(skill={"gspo": 0.7, "grpo": 0.55}, seeds=(0, 1), lags=(0, 2), steps=20)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[mlflow.MlflowClient, str]]:
    """One sqlite store for the module (creating its schema takes seconds); tests use their
    own experiments in it."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
        path = tmp_path_factory.mktemp("mlflow")
        uri = f"sqlite:///{path}/mlflow.db"
        yield mlflow.MlflowClient(tracking_uri=uri), uri


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, ReportResult]:
    root = write_experiment(tmp_path_factory.mktemp("exp"), SPEC)
    return root, build_report(root, tmp_path_factory.mktemp("report"), FAST)


def _experiment(store: tuple[mlflow.MlflowClient, str], tmp_path: Path, name: str) -> str:
    client, _ = store
    return client.create_experiment(name, artifact_location=(tmp_path / "art").as_uri())


def test_sanitize_key() -> None:
    assert (
        sanitize_key("report/final_iqm/gspo (fixed)/lag0") == "report/final_iqm/gspo _fixed_/lag0"
    )
    assert sanitize_key("report//a:b/../c") == "report/a_b/c"
    assert len(sanitize_key("x" * 400)) == 250


def test_log_report_and_read_back(store, local, tmp_path: Path) -> None:
    client, _ = store
    _, result = local
    experiment_id = _experiment(store, tmp_path, "log-report")
    parent = client.create_run(experiment_id, run_name="parent").info.run_id

    logged = log_report_to_mlflow(client, parent, result.out_dir, result.summary)

    files = {f.path for f in client.list_artifacts(parent, "report")}
    assert {"report/report.md", "report/report.html", "report/summary.parquet"} <= files
    assert "report/summary_table.json" in files
    figures = {f.path for f in client.list_artifacts(parent, "report/figures")}
    assert "report/figures/learning_curves.png" in figures

    metrics = client.get_run(parent).data.metrics
    iqm = result.summary[
        (result.summary["section"] == "final_score")
        & (result.summary["statistic"] == "iqm")
        & (result.summary["arm"] == "gspo")
        & (result.summary["lag"] == 0)
    ]["value"].item()
    assert metrics["report/final_iqm/gspo/lag0"] == pytest.approx(iqm)
    assert metrics["report/diverged_frac/grpo/all"] == 0.0
    assert "report/poi_final/grpo_vs_gspo/lag2" in metrics
    assert set(logged) == set(headline_metrics(result.summary)) and set(logged) <= set(metrics)

    table_path = client.download_artifacts(
        parent, "report/summary_table.json", str(tmp_path / "dl")
    )
    table = json.loads(Path(table_path).read_text())
    assert table["columns"] == list(result.summary.columns)
    assert len(table["data"]) == len(result.summary)

    # Logging again must not append to the first table (log_table appends to existing files).
    log_report_to_mlflow(client, parent, result.out_dir, result.summary)
    files = {f.path for f in client.list_artifacts(parent, "report")}
    assert "report/summary_table_2.json" in files


def _trial_runs(client: mlflow.MlflowClient, experiment_id: str, parent: str, root: Path) -> None:
    for trial in sorted((root / "trials").iterdir()):
        child = client.create_run(
            experiment_id, run_name=trial.name, tags={PARENT_TAG: parent}
        ).info.run_id
        client.log_artifacts(child, str(trial), artifact_path="trial")
        client.set_terminated(child)


def test_build_report_from_mlflow_matches_local(store, local, tmp_path: Path) -> None:
    client, uri = store
    root, local_result = local
    experiment_id = _experiment(store, tmp_path, "from-mlflow")
    old = client.create_run(
        experiment_id, run_name="old", start_time=int(time.time() * 1000) - 10**6
    )
    client.create_run(experiment_id, run_name="orphan", tags={PARENT_TAG: old.info.run_id})
    parent = client.create_run(experiment_id, run_name="parent").info.run_id
    _trial_runs(client, experiment_id, parent, root)
    client.create_run(experiment_id, run_name="never-started", tags={PARENT_TAG: parent})

    result = build_report_from_mlflow(
        uri, "from-mlflow", tmp_path / "remote", TABLES_ONLY, log_to_parent=True
    )

    assert result.parent_run_id == parent
    assert "never-started" in set(result.problems["trial_name"])
    numbers = ["final_score", "auc", "probability_of_improvement", "tests_final_score"]
    pick = lambda s: s[s["section"].isin(numbers)].reset_index(drop=True)  # noqa: E731
    pd.testing.assert_frame_equal(pick(result.summary), pick(local_result.summary))
    assert "report/final_iqm/gspo/lag0" in client.get_run(parent).data.metrics
    assert "report/final_iqm/gspo/lag0" not in client.get_run(old.info.run_id).data.metrics


def test_build_report_from_mlflow_errors(store, tmp_path: Path) -> None:
    client, uri = store
    with pytest.raises(ValueError, match="not found"):
        build_report_from_mlflow(uri, "no-such-experiment", tmp_path / "out")
    experiment_id = _experiment(store, tmp_path, "empty")
    with pytest.raises(ValueError, match="no parent run"):
        build_report_from_mlflow(uri, "empty", tmp_path / "out")
    client.create_run(experiment_id, run_name="lonely-parent")
    with pytest.raises(ValueError, match="no child trial runs"):
        build_report_from_mlflow(uri, "empty", tmp_path / "out")
