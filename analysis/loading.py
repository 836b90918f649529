"""Read an experiment output directory into a tidy table of per-step metrics.

Layout (contract.layout, shared with the trial runner): `ROOT/trials/<trial_name>/trial.json`
plus `ROOT/trials/<trial_name>/metrics.parquet/part-*.parquet`, one row per learner step, read
through `contract.step_tables`. Problems (an invalid trial record, absent or partial metrics) are
collected as rows of `problems` rather than raised, so one broken trial never hides the others
from the report.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import pandas as pd
import yaml

from analysis.eval_tables import stack_evals, trial_evals
from contract import metrics as mn
from contract import step_tables
from contract.environment import mixed_line
from contract.layout import METRICS_DIR, TRIAL_JSON, TRIALS_DIR, ExperimentPaths, TrialPaths
from contract.record import TrialRecord, TrialRecordError, read_trial_record
from contract.regime import TrialRegime
from contract.trial import TrialStatus

KEY_COLUMNS = ["experiment", "trial_name", "arm", "seed", "lag", "mode", "status", "diverged"]
TRIAL_COLUMNS = [
    *KEY_COLUMNS,
    "objective",
    "diverged_reason",
    "steps_planned",
    "last_step",
    "started_s",  # trial.json `started_at` as epoch seconds (NaN if absent): start-up's origin
    "policy",  # the staleness policy the trial ran, in words (`TrialRegime.words`)
    "correction",  # the arm's off-policy correction (`arms[].correction`); "" when none
]
PROBLEM_COLUMNS = ["trial_name", "arm", "seed", "lag", "status", "problem"]


@dataclass(frozen=True)
class Experiment:
    """What was on disk: one row per readable trial, the tidy step table, the problems, and the
    per-eval-set table (analysis.eval_tables: one row per trial, step and eval set)."""

    trials: pd.DataFrame
    metrics: pd.DataFrame
    problems: pd.DataFrame
    evals: pd.DataFrame = field(default_factory=lambda: stack_evals({}))
    # The directory holding the trial directories (`trial_name`s): a section that reads a few
    # rows of a big per-trial table (the rollout log) reads them there, not all at load time.
    trials_root: Path | None = None
    # One line when the trials were made under different locks or package versions
    # (`contract.environment.mixed_line`), None when they agree.
    software_note: str | None = None


def trials_dir(root: Path) -> Path:
    """`root/trials` if it exists, else `root` itself when it directly holds trial dirs."""
    trials = ExperimentPaths(root).trials
    if trials.is_dir():
        return trials
    if root.is_dir() and any(TrialPaths(p).metadata.exists() for p in root.iterdir() if p.is_dir()):
        return root
    raise FileNotFoundError(
        f"no trials under {root}: expected {root}/{TRIALS_DIR}/<trial_name>/{TRIAL_JSON}; "
        "pass the experiment output directory that `harness run` wrote"
    )


def read_metrics(path: Path) -> tuple[pd.DataFrame, list[str]]:
    """Read all parquet parts of one trial; return (step-sorted frame, problems found).

    Parts are read under the union of their schemas because a metric may first appear in a
    later part; an unreadable part is skipped and reported (`contract.step_tables.read_steps`).
    A step written twice (a resumed learner re-appending) keeps its last row.
    """
    if not path.exists():
        return pd.DataFrame(columns=[mn.STEP, mn.TIMESTAMP]), [f"{METRICS_DIR} absent"]
    found = step_tables.read_steps(path, strict=False)  # sorted by step, stably
    problems = list(found.problems)
    if found.table is None:
        return pd.DataFrame(columns=[mn.STEP, mn.TIMESTAMP]), [*problems, "no metric rows yet"]
    frame = found.table.to_pandas()
    keep = [c for c in frame.columns if c in mn.ALL_METRICS or c in (mn.STEP, mn.TIMESTAMP)]
    frame = frame[keep]
    if mn.STEP not in frame.columns:
        return pd.DataFrame(columns=[mn.STEP, mn.TIMESTAMP]), [*problems, "no `step` column"]
    frame = frame.drop_duplicates(subset=mn.STEP, keep="last")
    if frame.empty:
        problems.append("no metric rows yet")
    return frame.reset_index(drop=True), problems


def _resolved_config(trial_dir: Path) -> dict:
    """The trial's resolved config (empty when absent or unreadable: written before it existed)."""
    try:
        data = yaml.safe_load(TrialPaths(trial_dir).resolved_config.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return {}
    return data if isinstance(data, dict) else {}


def _arm_entry(config: dict, arm: str) -> dict:
    """Arm `arm`'s entry of a resolved config's `arms` ({} when the config does not list it)."""
    arms = config.get("arms")
    for entry in arms if isinstance(arms, list) else []:
        if isinstance(entry, dict) and entry.get("name") == arm:
            return entry
    return {}


def _legacy_regime(record: TrialRecord, config: dict) -> TrialRegime:
    """The regime of a record written before trial.json recorded it (`TrialRecord.regime`),
    read from the trial's resolved config: the arm's own `staleness` fields where set, else the
    experiment's; sync every 1 step and no partial rollouts when absent (written before the
    options existed, or at their defaults, which the resolved config leaves out)."""
    sync_every, partial = _legacy_sync_and_partial(config, record.arm)
    return TrialRegime(
        mode=record.mode,
        lag=record.lag,
        partial_rollouts=partial,
        sync_every=sync_every,
        correction=_legacy_correction(config, record.arm),
    )


def _legacy_sync_and_partial(config: dict, arm: str) -> tuple[int, bool]:
    """(sync_every, partial_rollouts) of arm `arm`'s trials in a resolved config."""
    own = _arm_entry(config, arm).get("staleness")
    shared = config.get("staleness")
    layers = [part for part in (own, shared) if isinstance(part, dict)]
    sync = next((part["sync_every"] for part in layers if part.get("sync_every") is not None), 1)
    partial = next(
        (part["partial_rollouts"] for part in layers if part.get("partial_rollouts") is not None),
        False,
    )
    return (sync if isinstance(sync, int) and sync >= 1 else 1), partial is True


def _legacy_correction(config: dict, arm: str) -> str:
    """The off-policy correction arm `arm` of a resolved config applies ("" when none, or when
    the config does not list the arm): the report's corrections section needs one to show."""
    value = _arm_entry(config, arm).get("correction")
    return value if isinstance(value, str) else ""


def _trial_row(
    record: TrialRecord, name: str, last_step: float, config: dict | None = None
) -> dict:
    """One row of `Experiment.trials`; statuses and modes as plain strings. `config` is the
    trial's resolved config, read only for a record that predates `TrialRecord.regime`."""
    regime = record.regime or _legacy_regime(record, config or {})
    status = str(record.status)
    return {
        "experiment": record.experiment or "",
        # The directory name, which the runner makes equal to trial.json's `trial_name`; it is
        # unique by construction, and it keys the step table.
        "trial_name": name,
        "arm": record.arm,
        "seed": record.seed,
        "lag": record.lag,
        "mode": str(record.mode),
        "status": status,
        "diverged": record.diverged or status == TrialStatus.DIVERGED,
        "objective": record.objective or "",
        "diverged_reason": record.diverged_reason,
        "steps_planned": record.steps_planned,
        "last_step": last_step,
        "started_s": _epoch_s(record.started_at),
        "policy": regime.words(),
        "correction": regime.correction,
    }


def _epoch_s(stamp: str | None) -> float:
    """ISO 8601 time as epoch seconds; NaN when absent or unparsable."""
    try:
        return datetime.fromisoformat(stamp).timestamp() if stamp else math.nan
    except ValueError:
        return math.nan


def _status_problems(row: dict) -> list[str]:
    """Trial-level facts a reader of the report must see next to the numbers."""
    out = []
    if row["diverged"]:
        last = row["last_step"]
        where = f"after step {int(last)}" if not math.isnan(last) else "before logging a step"
        out.append(f"diverged {where}: {row['diverged_reason']}")
    elif row["status"] != TrialStatus.COMPLETED:
        out.append(f"status {row['status']!r}: excluded from scores")
    planned = row["steps_planned"]
    last = row["last_step"]
    # Steps may be numbered 0..N-1 or 0..N (step 0 carrying the initial eval): accept both.
    short = not math.isnan(last) and last < planned - 1 if planned else False
    if row["status"] == TrialStatus.COMPLETED and short:
        out.append(f"completed but logged only up to step {int(last)} of {planned}")
    return out


def load_experiment(root: Path) -> Experiment:
    """Load every trial under `root`; never raises for a single bad trial."""
    trial_rows, metric_frames, problems, evals = [], [], [], {}
    provenances = {}
    for trial_dir in sorted(p for p in trials_dir(root).iterdir() if p.is_dir()):
        blank = {"trial_name": trial_dir.name, "arm": None, "seed": None, "lag": None}
        try:
            stored = read_trial_record(trial_dir)
        except (OSError, TrialRecordError) as err:
            problems.append({**blank, "status": "unreadable", "problem": str(err)})
            continue
        if stored is None:
            problems.append({**blank, "status": "missing", "problem": f"{TRIAL_JSON} absent"})
            continue
        frame, metric_problems = read_metrics(TrialPaths(trial_dir).metrics)
        last = float(frame[mn.STEP].max()) if len(frame) else math.nan
        row = _trial_row(stored, trial_dir.name, last, _resolved_config(trial_dir))
        trial_rows.append(row)
        provenances[trial_dir.name] = stored.provenance
        keys = {k: row[k] for k in ("trial_name", "arm", "seed", "lag", "status")}
        no_evals = len(frame) and (
            mn.EVAL_PASS_RATE not in frame.columns or frame[mn.EVAL_PASS_RATE].isna().all()
        )
        if no_evals:
            metric_problems.append(f"no {mn.EVAL_PASS_RATE} values: not scored")
        evals[trial_dir.name], eval_problems = trial_evals(trial_dir, frame)
        for text in [*metric_problems, *eval_problems, *_status_problems(row)]:
            problems.append({**keys, "problem": text})
        if len(frame):
            metric_frames.append(frame.assign(**{k: row[k] for k in KEY_COLUMNS}))
    trials = pd.DataFrame(trial_rows, columns=TRIAL_COLUMNS)
    metrics = tidy_frame(metric_frames)
    problem_frame = pd.DataFrame(problems, columns=PROBLEM_COLUMNS)
    problem_frame = problem_frame.astype({"seed": "Int64", "lag": "Int64"})
    software = mixed_line(provenances, f"the {len(provenances)} trials")
    return Experiment(
        trials, metrics, problem_frame, stack_evals(evals), trials_dir(root), software
    )


def tidy_frame(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """Stack per-trial frames: key columns, `step`, `timestamp`, then metric columns (sorted)."""
    if not frames:
        return pd.DataFrame(columns=[*KEY_COLUMNS, mn.STEP, mn.TIMESTAMP])
    stacked = pd.concat(frames, ignore_index=True)
    metric_cols = sorted(c for c in stacked.columns if c in mn.ALL_METRICS)
    if mn.TIMESTAMP not in stacked.columns:
        stacked[mn.TIMESTAMP] = math.nan
    ordered = stacked[[*KEY_COLUMNS, mn.STEP, mn.TIMESTAMP, *metric_cols]]
    return ordered.astype({c: "float64" for c in metric_cols})
