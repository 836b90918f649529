"""Fresh, real MLflow SQLite stores for tests, without paying for the migrations each time.

Creating an MLflow SQLite store runs its alembic migrations (3-8 s on a small machine). Tests
need several independent stores, so one fully migrated empty store is made per mlflow version
(kept in pytest's cache dir, else in the session's temp dir) and copied: each copy is a real,
independent MLflow store (nothing is mocked).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import mlflow
import pytest
from mlflow import MlflowClient


def template_store(config: pytest.Config, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Path of an empty, migrated MLflow SQLite store to copy (made on first use)."""
    cache = getattr(config, "cache", None)
    folder = cache.mkdir("mlflow-template") if cache is not None else tmp_path_factory.getbasetemp()
    template = Path(folder) / f"mlflow-{mlflow.__version__}.db"
    if not template.exists():
        building = template.with_name(f".{template.name}.{os.getpid()}.tmp")
        MlflowClient(tracking_uri=f"sqlite:///{building}").search_experiments()
        building.replace(template)  # atomic: a concurrent session sees all or nothing
    return template


def fresh_sqlite_store(target_dir: Path, template: Path) -> str:
    """Put an empty migrated store at `target_dir/mlflow.db`; return its tracking URI."""
    target_dir.mkdir(parents=True, exist_ok=True)
    target = target_dir / "mlflow.db"
    shutil.copyfile(template, target)
    return f"sqlite:///{target}"
