"""MLflow side of the report: log a built report to the parent run, or build one from MLflow.

Everything goes through an explicit `MlflowClient` and explicit run ids, never the fluent
active run, so several trials or reports in one process cannot log into each other's runs.
Trial runs are children of the experiment's parent run (tag `mlflow.parentRunId`) and hold
their metrics under the artifact path `trial/` (`trial/trial.json`, `trial/metrics.parquet/`).
"""

from __future__ import annotations

import dataclasses
import math
import re
import shutil
import tempfile
import time
from pathlib import Path

import mlflow
import pandas as pd
from mlflow.entities import Metric, Run

from analysis.config import ReportConfig
from analysis.report import ReportResult, build_report
from contract.layout import PARENT_TAG, TRIAL_ARTIFACTS, TRIALS_DIR

REPORT_ARTIFACTS = "report"
OUT_DIR_TAG = "harness.out_dir"  # the parent run's experiment output directory (harness run)
PLACEHOLDER_OUT_DIR = "OUT_DIR"
MAX_KEY = 250  # MLflow's limit on metric key length
BATCH = 1000  # MLflow's limit on metrics per log_batch call

# (summary section, statistic, metric family) logged as headline metrics.
HEADLINES = [
    ("final_score", "iqm", "final_iqm"),
    ("final_score", "mean", "final_mean"),
    ("auc", "iqm", "auc_iqm"),
    ("divergence", "diverged_frac", "diverged_frac"),
    ("collapse", "collapsed_frac", "collapsed_frac"),
    ("staleness", "steps_per_s", "steps_per_s"),
    ("probability_of_improvement", "final_score", "poi_final"),
    ("tests_final_score", "wilcoxon_p_holm", "wilcoxon_p_holm"),
]


def sanitize_key(key: str) -> str:
    """Map a metric key onto MLflow's allowed characters (ASCII letters, digits, `_-. /`)."""
    key = re.sub(r"[^A-Za-z0-9_\-. /]", "_", key)
    parts = [p for p in key.split("/") if p not in ("", ".", "..")]
    return "/".join(parts)[:MAX_KEY]


def headline_metrics(summary: pd.DataFrame) -> dict[str, float]:
    """`report/<family>/<arm or X_vs_Y>/lag<k>` (or `/all`) -> value, finite values only."""
    out = {}
    for section, statistic, family in HEADLINES:
        part = summary[(summary["section"] == section) & (summary["statistic"] == statistic)]
        for r in part.itertuples(index=False):
            if not math.isfinite(r.value):
                continue
            subject = r.arm if not pd.isna(r.arm) else str(r.comparison).replace(" vs ", "_vs_")
            if pd.isna(subject):
                continue
            where = f"lag{int(r.lag)}" if not pd.isna(r.lag) else "all"
            out[sanitize_key(f"report/{family}/{subject}/{where}")] = float(r.value)
    return out


def _json_safe(summary: pd.DataFrame) -> pd.DataFrame:
    """Plain Python objects with None for missing, which `log_table` serialises to JSON null."""
    plain = summary.astype(object)
    return plain.where(summary.notna(), None)


def _free_table_name(client: mlflow.MlflowClient, run_id: str) -> str:
    """`log_table` appends to an existing file, so a re-logged report gets a fresh name."""
    taken = {f.path for f in client.list_artifacts(run_id, REPORT_ARTIFACTS)}
    name, k = f"{REPORT_ARTIFACTS}/summary_table.json", 1
    while name in taken:
        k += 1
        name = f"{REPORT_ARTIFACTS}/summary_table_{k}.json"
    return name


def log_report_to_mlflow(
    client: mlflow.MlflowClient, parent_run_id: str, report_dir: Path, summary: pd.DataFrame
) -> dict[str, float]:
    """Log report files as artifacts under `report/`, headline metrics, and the summary table.

    Uses `client.log_table` (the same call `mlflow.log_table(run_id=...)` makes, but bound to
    this client's tracking URI instead of the global one). Returns the logged metrics.
    """
    table_name = _free_table_name(client, parent_run_id)
    client.log_artifacts(parent_run_id, str(report_dir), artifact_path=REPORT_ARTIFACTS)
    metrics = headline_metrics(summary)
    now = int(time.time() * 1000)
    batch = [Metric(key, value, now, 0) for key, value in metrics.items()]
    for start in range(0, len(batch), BATCH):
        client.log_batch(parent_run_id, metrics=batch[start : start + BATCH])
    client.log_table(parent_run_id, data=_json_safe(summary), artifact_file=table_name)
    return metrics


def _all_runs(client: mlflow.MlflowClient, experiment_id: str, filter_string: str) -> list[Run]:
    runs, token = [], None
    while True:
        page = client.search_runs(
            [experiment_id],
            filter_string=filter_string,
            order_by=["attributes.start_time DESC"],
            page_token=token,
        )
        runs += list(page)
        token = page.token
        if not token:
            return runs


def latest_parent_run(client: mlflow.MlflowClient, experiment_name: str) -> Run:
    """The most recently started run of the experiment that is not a child run."""
    experiment = client.get_experiment_by_name(experiment_name)
    if experiment is None:
        raise ValueError(
            f"MLflow experiment {experiment_name!r} not found at "
            f"{client.tracking_uri}; check the name and the tracking URI"
        )
    parents = [
        r for r in _all_runs(client, experiment.experiment_id, "") if PARENT_TAG not in r.data.tags
    ]
    if not parents:
        raise ValueError(
            f"experiment {experiment_name!r} has no parent run; was it created by `harness run`?"
        )
    return max(parents, key=lambda r: r.info.start_time or 0)


def _trial_dir_name(run: Run, used: set[str]) -> str:
    base = re.sub(r"[^A-Za-z0-9_.-]", "_", run.info.run_name or run.info.run_id) or run.info.run_id
    return base if base not in used else f"{base}_{run.info.run_id[:8]}"


def download_trials(client: mlflow.MlflowClient, parent: Run, root: Path) -> int:
    """Download each child's `trial/` artifacts to `root/trials/<run name>/`; returns the count.

    A child without trial artifacts still gets an (empty) directory so the report lists it.
    """
    children = _all_runs(
        client, parent.info.experiment_id, f"tags.{PARENT_TAG} = '{parent.info.run_id}'"
    )
    used: set[str] = set()
    for child in children:
        name = _trial_dir_name(child, used)
        used.add(name)
        target = root / TRIALS_DIR / name
        target.mkdir(parents=True)
        if not client.list_artifacts(child.info.run_id, TRIAL_ARTIFACTS):
            continue
        with tempfile.TemporaryDirectory() as tmp:
            local = Path(client.download_artifacts(child.info.run_id, TRIAL_ARTIFACTS, tmp))
            for item in local.iterdir():
                shutil.move(str(item), target / item.name)
    return len(children)


def build_report_from_mlflow(
    tracking_uri: str,
    experiment_name: str,
    out_dir: Path,
    config: ReportConfig | None = None,
    *,
    log_to_parent: bool = False,
) -> ReportResult:
    """Build the report of the latest parent run of `experiment_name` from its child runs.

    Trial artifacts are downloaded to a temporary directory (removed afterwards); the report
    goes to `out_dir`. With `log_to_parent`, the report is also logged to that parent run.
    `result.parent_run_id` says which run was reported.
    """
    client = mlflow.MlflowClient(tracking_uri=tracking_uri)
    parent = latest_parent_run(client, experiment_name)
    with tempfile.TemporaryDirectory(prefix="harness-report-") as tmp:
        root = Path(tmp) / experiment_name.replace("/", "_")
        (root / TRIALS_DIR).mkdir(parents=True)
        count = download_trials(client, parent, root)
        if count == 0:
            raise ValueError(
                f"parent run {parent.info.run_id} of {experiment_name!r} has no "
                "child trial runs to report on"
            )
        # The extension command of "what to do next" names the original output directory.
        origin = parent.data.tags.get(OUT_DIR_TAG) or PLACEHOLDER_OUT_DIR
        result = build_report(root, Path(out_dir), config, experiment_dir=Path(origin))
    if log_to_parent:
        log_report_to_mlflow(client, parent.info.run_id, result.out_dir, result.summary)
    return dataclasses.replace(result, parent_run_id=parent.info.run_id)
