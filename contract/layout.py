"""Where an experiment and its trials keep their files: the one place these names are spelled.

The trial runner writes a trial directory, `harness run` classifies and tracks it, the learner
appends metrics to it and analysis reads it back, possibly after a round trip through MLflow
(the artifact path `trial/` mirrors the directory). Every path is built from the names below,
so a renamed file is one edit here instead of a silently empty report.

    <experiment dir>/                  ExperimentPaths
        resolved_config.yaml
        trials/<trial name>/           TrialPaths
            trial.json                 the trial record (contract.record.TrialRecord)
            trial.log                  the trial runner's output (written by `harness run`)
            resolved_config.yaml
            prompts.parquet
            metrics.parquet/part-NNNNNN.parquet  one per step (contract.step_tables)
            evals.parquet/part-NNNNNN.parquet    per-eval-set scores (contract.evals)
            rollouts.parquet/part-NNNNNN.parquet the trained samples (contract.rollout_log)
            trained_groups/step-NNNNNN.json
            checkpoints/  weights/  redis/  logs/<component>.log
            learner_outcome.json
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Final

# Files and directories of a trial directory.
TRIAL_JSON: Final = "trial.json"
TRIAL_LOG: Final = "trial.log"
RESOLVED_CONFIG: Final = "resolved_config.yaml"
PROMPTS_FILE: Final = "prompts.parquet"
METRICS_DIR: Final = "metrics.parquet"
EVALS_DIR: Final = "evals.parquet"
ROLLOUTS_DIR: Final = "rollouts.parquet"
TRAINED_GROUPS_DIR: Final = "trained_groups"
CHECKPOINTS_DIR: Final = "checkpoints"
WEIGHTS_DIR: Final = "weights"
REDIS_DIR: Final = "redis"
LOGS_DIR: Final = "logs"
LEARNER_OUTCOME: Final = "learner_outcome.json"

# The experiment directory holds one directory per trial under this name.
TRIALS_DIR: Final = "trials"
# The logs of the warm component processes of `harness run` (executor.warm_components): what
# they print between trials (their imports, a vLLM engine's start); each trial's part goes to
# that trial's component logs.
WARM_LOGS_DIR: Final = "warm_components"

# An experiment with a tuning stage (harness.experiment.tuning) runs it under this directory of
# the experiment directory (an experiment of its own), and writes there what it selected and the
# validation score of every tuning trial; the report's Tuning section reads both.
TUNING_DIR: Final = "tuning"
TUNING_SELECTION: Final = "selection.json"
TUNING_SCORES: Final = "tuning_scores.parquet"

# MLflow: a child run's trial files go under this artifact path, laid out as the trial directory;
# the tag that links a child run to its parent (MLflow's own key, so its UI nests the runs).
TRIAL_ARTIFACTS: Final = "trial"
PARENT_TAG: Final = "mlflow.parentRunId"


@dataclass(frozen=True)
class TrialPaths:
    """Where a trial keeps its outputs; everything a report or a resume needs is here."""

    root: Path

    @property
    def metadata(self) -> Path:
        """`trial.json`: the trial record, rewritten atomically as the trial progresses."""
        return self.root / TRIAL_JSON

    @property
    def supervisor_lock(self) -> Path:
        """Locked (fcntl) by the trial's supervisor while it runs: one supervisor per trial."""
        return self.root / ".supervisor.lock"

    @property
    def trial_log(self) -> Path:
        """The trial runner's stdout and stderr, appended by `harness run` at each launch."""
        return self.root / TRIAL_LOG

    @property
    def resolved_config(self) -> Path:
        return self.root / RESOLVED_CONFIG

    @property
    def prompts(self) -> Path:
        return self.root / PROMPTS_FILE

    @property
    def metrics(self) -> Path:
        """A directory of one Parquet part per learner step (contract.step_tables; appended by
        learner.runtime.metrics_log)."""
        return self.root / METRICS_DIR

    @property
    def evals(self) -> Path:
        """A directory of one Parquet part per eval step, a row per eval set (contract.step_tables;
        appended by learner.runtime.evals_log)."""
        return self.root / EVALS_DIR

    @property
    def rollouts(self) -> Path:
        """A directory of one Parquet part per logged step, a row per trained sample
        (contract.step_tables; columns in contract.rollout_log; written by
        learner.runtime.records)."""
        return self.root / ROLLOUTS_DIR

    @property
    def trained_groups(self) -> Path:
        """One JSON file per step naming the groups it trained (the exactly-once audit trail)."""
        return self.root / TRAINED_GROUPS_DIR

    @property
    def checkpoints(self) -> Path:
        return self.root / CHECKPOINTS_DIR

    @property
    def weights(self) -> Path:
        return self.root / WEIGHTS_DIR

    @property
    def redis_dir(self) -> Path:
        return self.root / REDIS_DIR

    @property
    def logs(self) -> Path:
        return self.root / LOGS_DIR

    def component_log(self, component: str) -> Path:
        """`logs/<component>.log` of one supervised process (`learner`, `generator-0`, ...)."""
        return self.logs / f"{component}.log"

    @property
    def learner_outcome(self) -> Path:
        return self.root / LEARNER_OUTCOME


@dataclass(frozen=True)
class ExperimentPaths:
    """The experiment output directory (`<output_dir>/<name>`) and its trial directories."""

    root: Path

    @property
    def trials(self) -> Path:
        return self.root / TRIALS_DIR

    def trial(self, name: str) -> TrialPaths:
        return TrialPaths(self.trials / name)

    @property
    def warm_logs(self) -> Path:
        return self.root / WARM_LOGS_DIR

    @property
    def resolved_config(self) -> Path:
        return self.root / RESOLVED_CONFIG
