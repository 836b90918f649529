"""Analysis: metric tables, statistics, figures and the comparison report (design section 8).

Public API (what `harness report` and `harness run` call):

- `build_report(root, out_dir=None, config=None, *, experiment_dir=None) -> ReportResult`
    Report of an experiment output directory `root` (holding `trials/<name>/trial.json`,
    `trials/<name>/metrics.parquet/part-*.parquet` and, for trials with eval suites,
    `trials/<name>/evals.parquet/part-*.parquet`). Writes `report.md`, a self-contained
    `report.html`, `summary.parquet` (every number shown, long format) and `figures/*.png` to
    `out_dir` (default `root/report`). Broken, running, failed or diverged trials are listed in
    the report, never raised.
- `build_report_from_mlflow(tracking_uri, experiment_name, out_dir, config=None, *,
  log_to_parent=False) -> ReportResult`
    The same, from the child runs of the latest parent run of an MLflow experiment (their
    `trial/` artifacts); optionally logs the report back to that parent run.
- `log_report_to_mlflow(client, parent_run_id, report_dir, summary) -> dict[str, float]`
    Logs report files under artifact path `report/`, headline metrics
    (`report/final_iqm/<arm>/lag<k>`, ...) and the summary table, with explicit run ids.
- `ReportConfig`: every knob, documented per field. `ReportResult`: paths + summary frame.

Names are resolved lazily so `import analysis` does not import matplotlib or MLflow.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from analysis.config import ReportConfig
    from analysis.mlflow_report import build_report_from_mlflow, log_report_to_mlflow
    from analysis.report import ReportResult, build_report

__all__ = [
    "ReportConfig",
    "ReportResult",
    "build_report",
    "build_report_from_mlflow",
    "log_report_to_mlflow",
]

_HOMES = {
    "ReportConfig": "analysis.config",
    "ReportResult": "analysis.report",
    "build_report": "analysis.report",
    "build_report_from_mlflow": "analysis.mlflow_report",
    "log_report_to_mlflow": "analysis.mlflow_report",
}


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'analysis' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_HOMES[name]), name)
