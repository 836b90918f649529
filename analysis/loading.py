"""Read an experiment output directory into a tidy table of per-step metrics.

Layout (the contract with the trial runner): `ROOT/trials/<trial_name>/trial.json` plus
`ROOT/trials/<trial_name>/metrics.parquet/part-*.parquet`, one row per learner step. Problems
(unreadable JSON, absent or partial metrics) are collected as rows of `problems` rather than
raised, so one broken trial never hides the others from the report.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from contract import metrics as mn

TRIAL_JSON = "trial.json"
METRICS_DIR = "metrics.parquet"
REQUIRED_KEYS = ("arm", "seed", "lag")
KEY_COLUMNS = ["experiment", "trial_name", "arm", "seed", "lag", "mode", "status", "diverged"]
TRIAL_COLUMNS = [*KEY_COLUMNS, "objective", "diverged_reason", "steps_planned", "last_step"]
PROBLEM_COLUMNS = ["trial_name", "arm", "seed", "lag", "status", "problem"]

# Every per-step metric the repo defines (design section 7); analysis reads nothing else.
KNOWN_METRICS: frozenset[str] = frozenset(
    value
    for name, value in vars(mn).items()
    if name.isupper() and isinstance(value, str) and "/" in value and not value.endswith("/")
)


@dataclass(frozen=True)
class Experiment:
    """What was on disk: one row per readable trial, the tidy step table, and the problems."""

    trials: pd.DataFrame
    metrics: pd.DataFrame
    problems: pd.DataFrame


def trials_dir(root: Path) -> Path:
    """`root/trials` if it exists, else `root` itself when it directly holds trial dirs."""
    if (root / "trials").is_dir():
        return root / "trials"
    if root.is_dir() and any((p / TRIAL_JSON).exists() for p in root.iterdir() if p.is_dir()):
        return root
    raise FileNotFoundError(
        f"no trials under {root}: expected {root}/trials/<trial_name>/{TRIAL_JSON}; "
        "pass the experiment output directory that `harness run` wrote"
    )


def read_trial_json(path: Path) -> dict:
    """Parse `trial.json`; raise ValueError naming the file and the missing keys."""
    info = json.loads(path.read_text())
    if not isinstance(info, dict):
        raise ValueError(f"{path} holds {type(info).__name__}, expected a JSON object")
    missing = [k for k in REQUIRED_KEYS if k not in info]
    if missing:
        raise ValueError(f"{path} lacks keys {missing}; the trial runner must write them")
    return info


def read_metrics(path: Path) -> tuple[pd.DataFrame, list[str]]:
    """Read all parquet parts of one trial; return (step-sorted frame, problems found).

    Parts are read under the union of their schemas because a metric may first appear in a
    later part. A step written twice (a resumed learner re-appending) keeps its last row.
    """
    if not path.exists():
        return pd.DataFrame(columns=[mn.STEP, mn.TIMESTAMP]), [f"{METRICS_DIR} absent"]
    parts = [path] if path.is_file() else sorted(path.glob("*.parquet"))
    parts = [p for p in parts if not p.name.startswith((".", "_"))]
    readable, schemas, problems = [], [], []
    for part in parts:
        try:
            schemas.append(pq.read_schema(part))
            readable.append(str(part))
        except (OSError, pa.ArrowException) as err:
            problems.append(f"unreadable part {part.name}: {err}")
    if not readable:
        return pd.DataFrame(columns=[mn.STEP, mn.TIMESTAMP]), [*problems, "no metric rows yet"]
    schema = pa.unify_schemas(schemas, promote_options="permissive")
    frame, read_problems = _read_parts(readable, schema)
    problems.extend(read_problems)
    keep = [c for c in frame.columns if c in KNOWN_METRICS or c in (mn.STEP, mn.TIMESTAMP)]
    frame = frame[keep]
    if mn.STEP not in frame.columns:
        return pd.DataFrame(columns=[mn.STEP, mn.TIMESTAMP]), [*problems, "no `step` column"]
    frame = frame.drop_duplicates(subset=mn.STEP, keep="last").sort_values(mn.STEP)
    if frame.empty:
        problems.append("no metric rows yet")
    return frame.reset_index(drop=True), problems


def _read_parts(files: list[str], schema: pa.Schema) -> tuple[pd.DataFrame, list[str]]:
    """Read parts as one dataset; if one is corrupt past its footer, read the rest one by one."""
    try:
        return ds.dataset(files, schema=schema, format="parquet").to_table().to_pandas(), []
    except (OSError, pa.ArrowException):
        pass
    tables, problems = [], []
    for file in files:
        try:
            tables.append(ds.dataset(file, schema=schema, format="parquet").to_table())
        except (OSError, pa.ArrowException) as err:
            problems.append(f"unreadable part {Path(file).name}: {err}")
    if not tables:
        return pd.DataFrame(columns=[mn.STEP, mn.TIMESTAMP]), problems
    return pa.concat_tables(tables).to_pandas(), problems


def _trial_record(info: dict, name: str, last_step: float) -> dict:
    status = str(info.get("status", "unknown"))
    return {
        "experiment": str(info.get("experiment", "")),
        # The directory name, which the runner makes equal to trial.json's `trial_name`; it is
        # unique by construction, and it keys the step table.
        "trial_name": name,
        "arm": str(info["arm"]),
        "seed": int(info["seed"]),
        "lag": int(info["lag"]),
        "mode": str(info.get("mode", "fixed")),
        "status": status,
        "diverged": bool(info.get("diverged", False)) or status == "diverged",
        "objective": str(info.get("objective", "")),
        "diverged_reason": info.get("diverged_reason"),
        "steps_planned": info.get("steps_planned"),
        "last_step": last_step,
    }


def _status_problems(record: dict) -> list[str]:
    """Trial-level facts a reader of the report must see next to the numbers."""
    out = []
    if record["diverged"]:
        last = record["last_step"]
        where = f"after step {int(last)}" if not math.isnan(last) else "before logging a step"
        out.append(f"diverged {where}: {record['diverged_reason']}")
    elif record["status"] != "completed":
        out.append(f"status {record['status']!r}: excluded from scores")
    planned = record["steps_planned"]
    last = record["last_step"]
    # Steps may be numbered 0..N-1 or 0..N (step 0 carrying the initial eval): accept both.
    short = not math.isnan(last) and last < planned - 1 if planned else False
    if record["status"] == "completed" and short:
        out.append(f"completed but logged only up to step {int(last)} of {planned}")
    return out


def load_experiment(root: Path) -> Experiment:
    """Load every trial under `root`; never raises for a single bad trial."""
    trial_rows, metric_frames, problems = [], [], []
    for trial_dir in sorted(p for p in trials_dir(root).iterdir() if p.is_dir()):
        blank = {"trial_name": trial_dir.name, "arm": None, "seed": None, "lag": None}
        if not (trial_dir / TRIAL_JSON).exists():
            problems.append({**blank, "status": "missing", "problem": f"{TRIAL_JSON} absent"})
            continue
        try:
            info = read_trial_json(trial_dir / TRIAL_JSON)
        except (OSError, ValueError, TypeError) as err:
            problems.append({**blank, "status": "unreadable", "problem": str(err)})
            continue
        frame, metric_problems = read_metrics(trial_dir / METRICS_DIR)
        last = float(frame[mn.STEP].max()) if len(frame) else math.nan
        record = _trial_record(info, trial_dir.name, last)
        trial_rows.append(record)
        keys = {k: record[k] for k in ("trial_name", "arm", "seed", "lag", "status")}
        no_evals = len(frame) and (
            mn.EVAL_PASS_RATE not in frame.columns or frame[mn.EVAL_PASS_RATE].isna().all()
        )
        if no_evals:
            metric_problems.append(f"no {mn.EVAL_PASS_RATE} values: not scored")
        for text in [*metric_problems, *_status_problems(record)]:
            problems.append({**keys, "problem": text})
        if len(frame):
            metric_frames.append(frame.assign(**{k: record[k] for k in KEY_COLUMNS}))
    trials = pd.DataFrame(trial_rows, columns=TRIAL_COLUMNS)
    metrics = tidy_frame(metric_frames)
    problem_frame = pd.DataFrame(problems, columns=PROBLEM_COLUMNS)
    return Experiment(trials, metrics, problem_frame.astype({"seed": "Int64", "lag": "Int64"}))


def tidy_frame(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """Stack per-trial frames: key columns, `step`, `timestamp`, then metric columns (sorted)."""
    if not frames:
        return pd.DataFrame(columns=[*KEY_COLUMNS, mn.STEP, mn.TIMESTAMP])
    stacked = pd.concat(frames, ignore_index=True)
    metric_cols = sorted(c for c in stacked.columns if c in KNOWN_METRICS)
    if mn.TIMESTAMP not in stacked.columns:
        stacked[mn.TIMESTAMP] = math.nan
    ordered = stacked[[*KEY_COLUMNS, mn.STEP, mn.TIMESTAMP, *metric_cols]]
    return ordered.astype({c: "float64" for c in metric_cols})
