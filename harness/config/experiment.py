"""The experiment configuration: one pydantic model per concern, loaded from YAML + overrides.

Arms are matched by construction: everything outside `arms` is shared, so the only difference
between two trials of one seed and lag is the objective (design section 1). The rules across
sections are `harness.config.checks`. A config is written, hashed and logged in its resolved
form (`resolved_dump`): its dump without the fields of one table, `OMITTED_AT_DEFAULT`, while
they hold the default that keeps older configs' hashes; `model_dump` is pydantic's own.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from analysis.config import ReportConfig
from buffer.config import BufferConfig, StalenessConfig
from contract.config_dump import OmitAtDefault, dump_without_defaults
from contract.tuning import SelectionStamp
from harness.config.checks import (
    check_arms_and_seeds,
    check_generator_cpu_sets,
    check_message_size,
    check_model_and_backends,
    check_path_component,
    check_staleness_and_depth,
    check_tuning,
)
from harness.config.evals import (
    EvalConfig,
    EvalSetConfig,
    TrainTaskConfig,
    resolve_eval_sets,
    resolve_train_tasks,
)
from harness.config.executor import ExecutorConfig
from harness.config.sections import (
    GenerationConfig,
    ModelConfig,
    TaskConfig,
)
from harness.config.tuning import TuningConfig
from harness.overrides import ConfigError, apply_overrides
from harness.seeds import SeedList
from harness.staleness_regimes import Regime, arm_regime, check_arm_regimes
from learner.config import (
    ArmConfig,
    LearnerConfig,
    warn_equivalent_arms,
    warn_single_update,
)
from learner.config.omitted import OMITTED_AT_DEFAULT as LEARNER_OMITTED_AT_DEFAULT
from learner.config.plugin_records import plugin_digests


class TrackingConfig(BaseModel):
    """MLflow tracking."""

    model_config = ConfigDict(extra="forbid")

    tracking_uri: str = Field(
        default="",
        description="MLflow tracking URI. Empty: $MLFLOW_TRACKING_URI, else a local SQLite store "
        "under the output dir.",
    )
    experiment_name: str | None = Field(
        default=None, description="MLflow experiment; default: the config's `name`."
    )
    enabled: bool = Field(default=True, description="Log to MLflow at all.")


# Top-level fields left out of the config hash: they choose where, which and how many trials
# run, never how one runs (ExperimentConfig.config_hash says why, field by field).
HASH_EXCLUDED = frozenset({"executor", "seeds", "max_parallel"})


class ExperimentConfig(BaseModel):
    """A whole matched comparison: arms x seeds x staleness lags."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(default="experiment", description="Experiment name (MLflow, output dir).")
    seeds: SeedList = Field(
        default_factory=lambda: [0],
        min_length=1,
        description="Seeds: integers, and `range(a,b)` for a to b - 1 as in Python, alone "
        "(`seeds=range(0,12)`) or as list items (`[3, 'range(5,12)']`).",
    )
    plugins: list[str] = Field(
        default_factory=list,
        description="Modules (`mypkg.losses`) or files (`examples/clipped_reinforce.py`, made "
        "absolute) imported before the arms are read; each registers objectives with "
        "`learner.plugins.register_objective`, which its arms then name (README, Plugins).",
    )
    arms: list[ArmConfig] = Field(min_length=1, description="The arms compared.")
    model: ModelConfig = Field(default_factory=ModelConfig)
    task: TaskConfig = Field(
        default_factory=TaskConfig,
        description="The task: warm start of the built-in model, the training stream unless "
        "train_tasks is set, and the eval set unless evals is set.",
    )
    train_tasks: list[TrainTaskConfig] = Field(
        default_factory=list,
        description="Optional weighted mixture that replaces `task` as the training stream. "
        "Prompt i of a seed comes from a component drawn from (seed, i) alone, so every arm "
        "sees the same stream.",
    )
    evals: list[EvalSetConfig] = Field(
        default_factory=list,
        description="Eval sets scored at every eval, the first one being the primary "
        "(eval/pass_rate). Empty: one set named `heldout`, task's held-out split.",
    )
    eval: EvalConfig = Field(default_factory=EvalConfig)
    generation: GenerationConfig = Field(default_factory=GenerationConfig)
    buffer: BufferConfig = Field(default_factory=BufferConfig)
    staleness: StalenessConfig = Field(default_factory=StalenessConfig)
    learner: LearnerConfig = Field(default_factory=LearnerConfig)
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)
    report: ReportConfig = Field(default_factory=ReportConfig)
    executor: ExecutorConfig = Field(default_factory=ExecutorConfig)
    output_dir: str = Field(
        default="runs",
        description="Root of experiment outputs: a path, or a pyarrow.fs URI (`s3://bucket/"
        "prefix`, `gs://...`, `hdfs://...`) synced from working copies (executor.scratch_dir).",
    )
    max_parallel: int = Field(
        default=1,
        gt=0,
        description="Trials run at once. Each trial already uses a generator and a learner "
        "process, so 1 suits 2 cores.",
    )
    tuning: TuningConfig | None = Field(
        default=None,
        description="A tuning stage before the comparison (harness.config.tuning): every arm "
        "gets the same budget of configurations on tuning seeds, one is selected per arm on "
        "a validation eval set, and the selected ones are compared on `seeds`.",
    )
    selection: SelectionStamp | None = Field(
        default=None,
        description="Written by `harness run`, not by hand: the final stage's record of what "
        "the tuning stage selected per arm and why (its configuration, settings and validation "
        "score). Part of the config hash of the final trials.",
    )

    @model_validator(mode="before")
    @classmethod
    def _load_plugins(cls, data: Any) -> Any:
        """Plugins register objectives, so they are imported before `arms` is validated."""
        entries = data.get("plugins") if isinstance(data, dict) else None
        if not entries:
            return data
        if not (isinstance(entries, list) and all(isinstance(e, str) for e in entries)):
            raise ValueError("plugins must be a list of module names or .py file paths")
        entries = [str(Path(e).resolve()) if e.endswith(".py") else e for e in entries]
        # Imported here, not at the top: plugins need torch, and a config without plugins is
        # validated without importing it (the CLI, the driver, config checks stay light).
        from learner.plugins import PluginError, load_plugins

        try:
            load_plugins(entries)
        except PluginError as exc:
            raise ValueError(str(exc)) from None
        return {**data, "plugins": entries}

    @field_validator("name")
    @classmethod
    def _safe_name(cls, value: str) -> str:
        return check_path_component("name", value)

    @model_validator(mode="before")
    @classmethod
    def _moved_fields(cls, data: Any) -> Any:
        learner = data.get("learner") if isinstance(data, dict) else None
        if isinstance(learner, dict) and "eval_size" in learner:
            raise ValueError(
                "learner.eval_size is now task.eval_size (one held-out eval set for the "
                "learner's evals and the warm-start report); move the value there"
            )
        return data

    @model_validator(mode="after")
    def _check(self) -> ExperimentConfig:
        """The rules across sections (`harness.config.checks`), the first broken one reported."""
        check_arms_and_seeds(self)
        check_arm_regimes(self.staleness, self.arms)
        check_model_and_backends(self)
        check_staleness_and_depth(self)
        check_generator_cpu_sets(self)
        if self.tuning is not None:
            check_tuning(self)
        warn_equivalent_arms(self.arms, self.learner)  # e.g. GSPO and GSPO-token (design 6)
        warn_single_update(self.arms, self.learner)  # ratio 1 at every update: no clipping
        return self

    @model_validator(mode="after")
    def _check_message_size(self) -> ExperimentConfig:
        check_message_size(self)
        return self

    def dynamic_sampling_rounds(self, arm: str | None = None) -> int:
        """Extra generation rounds per step of arm `arm` (0: no dynamic sampling), or the most
        of any arm when `arm` is None."""
        arms = self.arms if arm is None else [self.arm(arm)]
        return max((a.sampling_rounds() for a in arms), default=0)

    def regime(self, arm: str) -> Regime:
        """The staleness regime arm `arm`'s trials run under (`harness.staleness_regimes`)."""
        return arm_regime(self.staleness, self.arm(arm))

    def arm(self, name: str) -> ArmConfig:
        for arm in self.arms:
            if arm.name == name:
                return arm
        raise ConfigError(f"no arm named {name!r}; arms are {[a.name for a in self.arms]}")

    def eval_sets(self) -> list[tuple[str, TaskConfig]]:
        """(name, task) of every eval set, the primary one first."""
        return resolve_eval_sets(self.evals, self.task)

    def train_components(self) -> list[tuple[str, float, TaskConfig]]:
        """(name, weight, task) of the training stream's components (just `task` by default)."""
        return resolve_train_tasks(self.train_tasks, self.task)

    def hashed_fields(self) -> dict[str, Any]:
        """The resolved config as `config_hash` digests it (`resolved_dump` without
        HASH_EXCLUDED, and without an empty `plugins`); plugin sources come on top there."""
        exclude = {*HASH_EXCLUDED, *(() if self.plugins else ("plugins",))}
        return dump_without_defaults(self, OMITTED_AT_DEFAULT, exclude=exclude)

    def config_hash(self) -> str:
        """Short digest of the resolved config, recorded with every run."""
        # Without `executor`: where trials run changes no result, and a trial started by one
        # executor may be resumed by the other. Without `seeds` and `max_parallel`: they choose
        # which trials exist and how many run at once, never how one runs, so extending an
        # experiment with more seeds (the report's "what to do next") keeps the finished
        # trials' hash and `harness run` skips them without a config-mismatch warning.
        # With plugins, their source digests too: a finished trial of a changed plugin is not
        # the trial this config would run.
        # An empty `plugins` is left out so that configs without plugins keep their hash.
        resolved = self.hashed_fields()
        if self.plugins:
            resolved["plugin_sources"] = plugin_digests(self.plugins)
        canonical = json.dumps(resolved, sort_keys=True)
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]


OMITTED_AT_DEFAULT: tuple[OmitAtDefault, ...] = (
    *LEARNER_OMITTED_AT_DEFAULT,
    OmitAtDefault(TaskConfig, "eval_offset", 0),
    OmitAtDefault(EvalConfig, "engine", "auto"),
    OmitAtDefault(StalenessConfig, "sync_every", 1),
    OmitAtDefault(StalenessConfig, "partial_rollouts", False),
    OmitAtDefault(StalenessConfig, "partial_check_tokens", 1),
    OmitAtDefault(ExecutorConfig, "cpu_sets", None),
    OmitAtDefault(ExperimentConfig, "tuning", None),
    OmitAtDefault(ExperimentConfig, "selection", None),
)
"""The one table of fields left out of a resolved config while at their default: the learner's
(`learner.config.omitted`), the eval offset of a task, the tuning stage of an experiment
without one. Each came after configs had been written, so each keeps their hash."""


def resolved_dump(model: BaseModel) -> dict[str, Any]:
    """A config (or a section of one, an arm) as it is written, hashed and logged: its JSON
    dump without `OMITTED_AT_DEFAULT`'s fields. `model_dump` stays pydantic's own; this is
    what validates again to the same config (`resolved_config.yaml`, a stage's config)."""
    return dump_without_defaults(model, OMITTED_AT_DEFAULT)


def format_validation_error(exc: ValidationError) -> str:
    """One line per problem: `field.path: message (got value)`; a single problem stays on the
    first line, so the CLI's error is one line."""
    lines = []
    for error in exc.errors():
        where = ".".join(str(part) for part in error["loc"]) or "<config>"
        got = error.get("input")
        shown = "" if isinstance(got, dict) else f" (got {got!r})"
        lines.append(f"{where}: {error['msg']}{shown}")
    if len(lines) == 1:
        return f"invalid configuration: {lines[0]}"
    return "invalid configuration:\n  " + "\n  ".join(lines)


def load_config_data(path: Path | str, overrides: list[str] | None = None) -> dict[str, Any]:
    """Read YAML and apply overrides, without validating."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except FileNotFoundError as exc:
        raise ConfigError(f"config file {path} does not exist") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"config file {path} is not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at "
            f"offset {exc.start})"
        ) from None
    except OSError as exc:  # a directory, no permission
        raise ConfigError(f"config file {path} cannot be read: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping at the top level")
    return apply_overrides(data, list(overrides or []))


def validate_config(data: dict[str, Any]) -> ExperimentConfig:
    try:
        return ExperimentConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc)) from None


def load_config(path: Path | str, overrides: list[str] | None = None) -> ExperimentConfig:
    """Load, override and validate a config; raises ConfigError naming the bad field."""
    return validate_config(load_config_data(path, overrides))
