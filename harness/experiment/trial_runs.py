"""Turn one trial directory into MLflow entities: params, tags, metric batches, dataset, files.

Pure conversions plus `log_trial_files`, which pushes a finished trial into its child run. Only
the `harness run` process calls these (SQLite allows one writer; trials never talk to MLflow).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil
import tempfile
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mlflow.data
import pandas as pd
import pyarrow as pa
from mlflow import MlflowClient
from mlflow.entities import DatasetInput, InputTag, Metric, Param, RunTag
from mlflow.utils.validation import (
    MAX_METRICS_PER_BATCH,
    MAX_PARAM_VAL_LENGTH,
    MAX_PARAMS_TAGS_PER_BATCH,
    MAX_TAG_VAL_LENGTH,
)

from contract import evals as E
from contract import metrics as M
from contract import step_tables
from contract.layout import (
    EVALS_DIR,
    LOGS_DIR,
    METRICS_DIR,
    PROMPTS_FILE,
    RESOLVED_CONFIG,
    ROLLOUTS_DIR,
    TRIAL_ARTIFACTS,
    TRIAL_JSON,
    TRIAL_LOG,
    TrialPaths,
)
from harness.launch.trials import PlannedTrial

DATASET_CONTEXT = "train"
TRUNCATED = "...[truncated]"
# `scheme://user:password@` in any string (Redis URLs with a password, tracking URIs with basic
# auth): the password is replaced before the text goes to MLflow, which anyone with UI access
# can read.
_URL_PASSWORD = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^/@\s:]*):(?P<secret>[^/@\s]+)@")
REDACTED = "***"
# trial.json fields copied onto the child run as tags (besides the grid keys).
INFO_TAGS = (
    "objective",
    "status",
    "diverged_reason",
    "failure_reason",
    "steps_planned",
    "steps_completed",
    "config_hash",
    "initial_weights_digest",
    "prompt_set_digest",
    "started_at",
    "finished_at",
)


def redact(text: str) -> str:
    """`redis://:hunter2@host` -> `redis://:***@host`; text without URL passwords unchanged."""
    return _URL_PASSWORD.sub(lambda m: f"{m.group('head')}:{REDACTED}@", text)


def clip_text(text: str, limit: int) -> str:
    """`text` cut to `limit` characters, marking the cut (MLflow rejects longer values)."""
    return text if len(text) <= limit else text[: limit - len(TRUNCATED)] + TRUNCATED


def _as_text(value: Any) -> str:
    return redact(value if isinstance(value, str) else json.dumps(value))


def flatten_params(data: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested config -> `section.field` strings; lists of named items key by name.

    `arms: [{name: gspo, ...}]` becomes `arms.gspo.objective`, so the MLflow compare view lines
    up the same arm across runs however the list was ordered. Values longer than MLflow's param
    limit (6000 characters in mlflow 3) are cut; the full config is the run's artifact.
    """
    flat: dict[str, str] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flatten_params(value, f"{name}."))
        elif _is_named_list(value):
            for item in value:
                flat.update(flatten_params(item, f"{name}.{item['name']}."))
        else:
            flat[name] = clip_text(_as_text(value), MAX_PARAM_VAL_LENGTH)
    return flat


def _is_named_list(value: Any) -> bool:
    if not isinstance(value, list) or not value:
        return False
    names = [item.get("name") if isinstance(item, dict) else None for item in value]
    return all(isinstance(n, str) for n in names) and len(set(names)) == len(names)


def log_params(client: MlflowClient, run_id: str, params: dict[str, str]) -> None:
    """Params in batches of MLflow's per-request limit (100)."""
    items = [Param(key, value) for key, value in params.items()]
    for start in range(0, len(items), MAX_PARAMS_TAGS_PER_BATCH):
        client.log_batch(
            run_id, params=items[start : start + MAX_PARAMS_TAGS_PER_BATCH], synchronous=True
        )


def log_tags(client: MlflowClient, run_id: str, tags: dict[str, Any]) -> None:
    """Tags (values stringified, cut to MLflow's 8000 characters) in batches of 100."""
    items = [RunTag(key, clip_text(_as_text(v), MAX_TAG_VAL_LENGTH)) for key, v in tags.items()]
    for start in range(0, len(items), MAX_PARAMS_TAGS_PER_BATCH):
        client.log_batch(
            run_id, tags=items[start : start + MAX_PARAMS_TAGS_PER_BATCH], synchronous=True
        )


def trial_tags(spec: PlannedTrial, info: dict[str, Any]) -> dict[str, Any]:
    """Tags of a child run: grid keys, trial.json facts and the trial's own provenance."""
    tags: dict[str, Any] = {
        "trial_name": spec.trial_name,
        "arm": spec.arm,
        "seed": spec.seed,
        "lag": spec.lag,
        "mode": spec.mode,
        "diverged": bool(info.get("diverged", False)) or info.get("status") == "diverged",
    }
    for key in INFO_TAGS:
        if info.get(key) is not None:
            tags[key] = info[key]
    provenance = info.get("provenance") or {}
    git = provenance.get("git") or {}
    if git.get("commit"):
        tags["git.commit"] = git["commit"]
        tags["mlflow.source.git.commit"] = git["commit"]
    if git.get("dirty") is not None:
        tags["git.dirty"] = git["dirty"]
    return tags


def metric_batches(table: pa.Table, now_ms: int) -> Iterator[list[Metric]]:
    """One Metric per (row, non-NaN metric column), in chunks of MLflow's limit (1000).

    NaN means "not measured at this step" (e.g. eval/pass_rate between evals) and is skipped;
    +-inf is kept (MLflow stores it clamped to +-float max) because it marks a divergence.
    """
    steps = table.column(M.STEP).to_pylist()
    stamps = table.column(M.TIMESTAMP).to_pylist() if M.TIMESTAMP in table.column_names else []
    times = [now_ms] * len(steps)
    for row, stamp in enumerate(stamps):
        if stamp is not None and math.isfinite(stamp):
            times[row] = int(stamp * 1000)
    batch: list[Metric] = []
    for key in table.column_names:
        kind = table.schema.field(key).type
        if key in (M.STEP, M.TIMESTAMP) or not (
            pa.types.is_floating(kind) or pa.types.is_integer(kind)
        ):
            continue
        for row, value in enumerate(table.column(key).to_pylist()):
            if value is None or math.isnan(float(value)) or steps[row] is None:
                continue
            batch.append(Metric(key, float(value), times[row], int(steps[row])))
            if len(batch) == MAX_METRICS_PER_BATCH:
                yield batch
                batch = []
    if batch:
        yield batch


def eval_metric_batches(table: pa.Table, now_ms: int) -> Iterator[list[Metric]]:
    """The evals table (one row per step and eval set) as MLflow metrics `eval/<set>/<score>`
    at their step (contract.evals), NaN (not measured) left out, in chunks of MLflow's limit."""
    batch: list[Metric] = []
    for row in table.to_pylist():
        ks = {k: row[c] for c in row if (k := E.k_of_column(c)) is not None}
        score = E.EvalSetScore(
            row[E.EVAL_SET],
            row[E.N_PROMPTS],
            row[E.GREEDY_PASS_RATE],
            row[E.SAMPLES],
            row[E.PASS1_SAMPLED],
            {k: value for k, value in ks.items() if value is not None},
        )
        for key, value in score.mlflow_metrics().items():
            batch.append(Metric(key, float(value), now_ms, int(row[E.STEP])))
            if len(batch) == MAX_METRICS_PER_BATCH:
                yield batch
                batch = []
    if batch:
        yield batch


def read_evals(trial_dir: Path) -> pa.Table | None:
    """Every eval row of a trial sorted by step, sets in file order (None if it wrote none: older
    trials have no evals table). A damaged part raises `contract.step_tables.DamagedPartError`."""
    return _rows(TrialPaths(Path(trial_dir)).evals)


def read_rollouts(trial_dir: Path) -> pa.Table | None:
    """Every row of a trial's rollout log (`contract.rollout_log`: the trained samples of the
    logged steps) sorted by step, groups and samples in the order trained; None if it logged
    none (a trial older than the log, or `learner.rollout_log.every: 0`). A damaged part raises
    `contract.step_tables.DamagedPartError`."""
    return _rows(TrialPaths(Path(trial_dir)).rollouts)


def read_metrics(trial_dir: Path) -> pa.Table | None:
    """All metric rows of a trial sorted by step (None if it wrote none), read by the learner's
    writer's reader (`contract.step_tables`; a damaged part raises its `DamagedPartError`)."""
    return _rows(TrialPaths(Path(trial_dir)).metrics)


def _rows(root: Path) -> pa.Table | None:
    """A step table's rows sorted by step (`contract.step_tables.read_steps`, strict), or None
    when it has none."""
    table = step_tables.read_steps(root).table
    return table if table is not None and table.num_rows else None


def prompt_set_digest(frame: pd.DataFrame) -> str:
    """sha256 (first 32 hex digits) of the column names and every row, in file order.

    Why not MLflow's own pandas digest: it hashes only the first 10,000 rows, so two prompt
    sets differing further down would look identical. Order counts: matched arms need the same
    prompt stream, not just the same set. 32 characters fit MLflow's 36-character limit.
    """
    digest = hashlib.sha256(json.dumps([str(c) for c in frame.columns]).encode())
    for row in frame.itertuples(index=False, name=None):
        digest.update(json.dumps(list(row), default=str).encode())
        digest.update(b"\n")
    return digest.hexdigest()[:32]


def prompt_dataset(prompts_path: Path, seed: int) -> DatasetInput:
    """The trial's prompt set as an MLflow dataset input `prompts-seed<N>` (context `train`).

    MLflow's SQL store keeps one dataset per (experiment, name, digest), so every child with
    the same prompts points at the same dataset row, whichever trial logged it first.
    """
    frame = pd.read_parquet(prompts_path)
    with warnings.catch_warnings():  # schema-inference hints about int columns; not actionable
        warnings.simplefilter("ignore", UserWarning)
        dataset = mlflow.data.from_pandas(
            frame,
            source=str(prompts_path),
            name=f"prompts-seed{seed}",
            digest=prompt_set_digest(frame),
        )
        entity = dataset._to_mlflow_entity()
    return DatasetInput(entity, tags=[InputTag(key="mlflow.data.context", value=DATASET_CONTEXT)])


def _place(source: Path, target: Path) -> None:
    """Hard-link (free, same filesystem) or copy a file into the staging tree."""
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def stage_trial_files(trial_dir: Path, staging: Path) -> int:
    """Lay out what goes under the artifact path `trial/`; returns the number of files.

    Only whole metric, eval and rollout-log parts (`contract.step_tables.list_parts`) are taken,
    never a writer's `.tmp` file, and never checkpoints (large, and only useful next to the
    trial dir that can resume them).
    The resolved config is copied with URL passwords redacted.
    """
    count = 0
    for name in (TRIAL_JSON, TRIAL_LOG, PROMPTS_FILE):
        if (trial_dir / name).is_file():
            _place(trial_dir / name, staging / name)
            count += 1
    if (trial_dir / RESOLVED_CONFIG).is_file():  # may hold a Redis URL with its password
        (staging / RESOLVED_CONFIG).write_text(redact((trial_dir / RESOLVED_CONFIG).read_text()))
        count += 1
    logs = trial_dir / LOGS_DIR  # the runner's per-component logs (learner, generators)
    if logs.is_dir():
        for log in sorted(logs.glob("*.log")):
            _place(log, staging / LOGS_DIR / log.name)
            count += 1
    for directory in (METRICS_DIR, EVALS_DIR, ROLLOUTS_DIR):  # the report reads all three
        if (trial_dir / directory).is_dir():
            for part in step_tables.list_parts(trial_dir / directory):
                _place(part, staging / directory / part.name)
                count += 1
    return count


def log_trial_files(
    client: MlflowClient, run_id: str, spec: PlannedTrial, info: dict[str, Any], staging_root: Path
) -> int:
    """Log a trial's metrics, prompt dataset and files to its run; returns metrics logged."""
    logged = 0
    table = read_metrics(spec.trial_dir)
    if table is not None:
        for batch in metric_batches(table, int(time.time() * 1000)):
            client.log_batch(run_id, metrics=batch, synchronous=True)
            logged += len(batch)
    evals = read_evals(spec.trial_dir)
    if evals is not None:
        for batch in eval_metric_batches(evals, int(time.time() * 1000)):
            client.log_batch(run_id, metrics=batch, synchronous=True)
            logged += len(batch)
    prompts = spec.paths.prompts
    if prompts.is_file():
        client.log_inputs(run_id, datasets=[prompt_dataset(prompts, spec.seed)])
    staging_root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".mlflow-stage-", dir=staging_root) as tmp:
        if stage_trial_files(spec.trial_dir, Path(tmp)):
            client.log_artifacts(run_id, tmp, artifact_path=TRIAL_ARTIFACTS)
    log_tags(client, run_id, trial_tags(spec, info))
    return logged
