"""The experiment configuration: one pydantic model per concern, loaded from YAML + overrides.

Arms are matched by construction: everything outside `arms` is shared, so the only difference
between two trials of one seed and lag is the objective (design section 1).
"""

from __future__ import annotations

import hashlib
import json
import unicodedata
from pathlib import Path
from typing import Any

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)

from analysis.config import ReportConfig
from buffer.config import BufferConfig, StalenessConfig
from harness.config_evals import (
    EvalConfig,
    EvalSetConfig,
    TrainTaskConfig,
    check_unique_names,
    resolve_eval_sets,
    resolve_train_tasks,
)
from harness.config_sections import (
    UNREPRODUCIBLE_SAMPLING,
    BuiltinTokenizer,
    ExecutorConfig,
    GenerationConfig,
    GeneratorBackend,
    Gsm8kMode,
    ModelArch,
    ModelConfig,
    PromptFormat,
    TaskConfig,
    TaskName,
    VerifierName,
)
from harness.config_tuning import TuningConfig
from harness.overrides import ConfigError, apply_overrides
from harness.seeds import SeedList
from learner.config import (
    ArmConfig,
    LearnerConfig,
    group_split_problem,
    validate_arm,
    warn_equivalent_arms,
    warn_single_update,
)
from learner.config.plugin_records import plugin_digests

__all__ = [
    "HASH_EXCLUDED",
    "UNREPRODUCIBLE_SAMPLING",
    "BuiltinTokenizer",
    "ConfigError",
    "EvalConfig",
    "EvalSetConfig",
    "ExecutorConfig",
    "ExperimentConfig",
    "GenerationConfig",
    "GeneratorBackend",
    "Gsm8kMode",
    "ModelArch",
    "ModelConfig",
    "PromptFormat",
    "TaskConfig",
    "TaskName",
    "TrackingConfig",
    "TrainTaskConfig",
    "VerifierName",
    "check_path_component",
    "check_response_fits",
    "format_validation_error",
    "load_config",
    "load_config_data",
    "validate_config",
]


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
        description="A tuning stage before the comparison (harness.config_tuning): every arm "
        "gets the same budget of configurations on tuning seeds, one is selected per arm on "
        "a validation eval set, and the selected ones are compared on `seeds`.",
    )
    selection: dict[str, Any] | None = Field(
        default=None,
        description="Written by `harness run`, not by hand: the final stage's record of what "
        "the tuning stage selected per arm and why (its configuration, settings and validation "
        "score). Part of the config hash of the final trials.",
    )

    @model_serializer(mode="wrap")
    def _omit_unused_stages(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """`tuning` and `selection` unset are left out of the dump, so configs without a tuning
        stage keep their dump, hence their config hash."""
        data = handler(self)
        for name in ("tuning", "selection"):
            if getattr(self, name) is None:
                data.pop(name, None)
        return data

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
        names = [arm.name for arm in self.arms]
        if len(set(names)) != len(names):
            raise ValueError(f"arm names must be unique, got {names}")
        for arm in self.arms:
            settings = arm.training_settings(self.learner)  # an arm's own settings must fit too
            _check_learner_ranks(arm.name, settings, self.executor.learner_ranks)
        if len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds has duplicates: {self.seeds}")
        check_unique_names(self.evals, self.train_tasks)
        replaying = [arm.name for arm in self.arms if arm.routing_replay != "off"]
        if replaying and self.model.path == "builtin" and self.model.arch != "qwen3_moe":
            raise ValueError(
                f"arms {replaying} set routing_replay (old or rollout), but the built-in model is "
                f"dense (model.arch={self.model.arch}); routing replay needs model.arch=qwen3_moe"
            )
        _check_rollout_routing(self.arms, self.generation.backend)
        ranks, bundle = self.executor.learner_ranks, self.executor.learner
        if self.executor.kind == "ray" and self.learner.device == "cuda" and bundle.gpus < ranks:
            raise ValueError(
                f"executor.learner_ranks={ranks} with learner.device=cuda runs {ranks} ranks in "
                f"the learner's Ray bundle, which asks for executor.learner.gpus={bundle.gpus}; "
                f"set executor.learner.gpus={ranks} (a bundle is one node: the ranks share it)"
            )
        _check_near_miss(self.model, self.task)
        if self.model.path == "builtin":  # a model directory's context is checked by the CLI
            check_response_fits(
                self.generation.max_new_tokens,
                self.model.max_seq_len,
                f"model.max_seq_len={self.model.max_seq_len}",
                "lower generation.max_new_tokens or raise model.max_seq_len",
            )
        head_dim = self.model.hidden_size // self.model.num_heads
        if (
            self.model.path == "builtin"
            and self.generation.backend == "vllm"
            and self.generation.device == "cpu"
            and head_dim < 32
        ):
            raise ValueError(
                f"model.hidden_size / model.num_heads = {head_dim}, but vLLM's CPU attention "
                "needs a head size of at least 32: lower model.num_heads or use "
                "generation.backend=torch"
            )
        rounds = self.dynamic_sampling_rounds()
        if rounds and self.staleness.mode != "fixed":
            names = [arm.name for arm in self.arms if arm.sampling_rounds()]
            raise ValueError(
                f"arms {names} set dynamic_sampling_rounds, which needs staleness.mode: fixed "
                f"(got {self.staleness.mode}): extra rounds are generated for one batch by its "
                "fixed policy version; set staleness.mode: fixed or remove "
                "dynamic_sampling_rounds"
            )
        # every draw of a step stays unacked until the checkpoint (extra rounds included)
        draws = self.learner.checkpoint_every * (1 + rounds)
        depth_needed = (draws + max(self.staleness.lags) + 2) * self.learner.prompts_per_step
        if self.buffer.max_depth < depth_needed:
            extra = " x (1 + max dynamic_sampling_rounds)" if rounds else ""
            raise ValueError(
                f"buffer.max_depth={self.buffer.max_depth} is too small: groups stay unacked "
                f"until the next checkpoint, so up to (learner.checkpoint_every{extra} + max lag "
                f"+ 2) * learner.prompts_per_step = {depth_needed} may wait; raise "
                "buffer.max_depth or lower learner.checkpoint_every"
            )
        if self.tuning is not None:
            _check_tuning(self)
        warn_equivalent_arms(self.arms, self.learner)  # e.g. GSPO and GSPO-token (design 6)
        warn_single_update(self.arms, self.learner)  # ratio 1 at every update: no clipping
        return self

    @model_validator(mode="after")
    def _check_message_size(self) -> ExperimentConfig:
        """A group whose responses all reach max_new_tokens must fit one buffer message. Its
        token columns alone take group_size * max_new_tokens * 8 bytes (an int32 id and a
        float32 behaviour logprob per token), a lower bound: prompts and the Arrow framing come
        on top, which the generator checks per group (harness.trial.generator_main.push_round)."""
        floor = self.generation.group_size * self.generation.max_new_tokens * 8
        if self.buffer.max_message_bytes < floor:
            raise ValueError(
                f"buffer.max_message_bytes={self.buffer.max_message_bytes} cannot hold a group "
                f"with full-length responses: generation.group_size={self.generation.group_size}"
                f" x generation.max_new_tokens={self.generation.max_new_tokens} x 8 bytes = "
                f"{floor} before prompts and Arrow framing (a few KiB); raise "
                f"buffer.max_message_bytes well above {floor} (the default is 64 MiB)"
            )
        return self

    def dynamic_sampling_rounds(self, arm: str | None = None) -> int:
        """Extra generation rounds per step of arm `arm` (0: no dynamic sampling), or the most
        of any arm when `arm` is None."""
        arms = self.arms if arm is None else [self.arm(arm)]
        return max((a.sampling_rounds() for a in arms), default=0)

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
        """The resolved config as `config_hash` digests it (without HASH_EXCLUDED, and without
        an empty `plugins`); plugin sources come on top there."""
        exclude = {*HASH_EXCLUDED, *(() if self.plugins else ("plugins",))}
        return self.model_dump(mode="json", exclude=exclude)

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


def check_response_fits(max_new_tokens: int, context: int, source: str, advice: str) -> None:
    """A prompt of at least one token and a full-length response must fit the model's context
    (`source` says where it is set); otherwise generators and learner fail minutes into the run."""
    if max_new_tokens >= context:
        raise ValueError(
            f"generation.max_new_tokens={max_new_tokens} must be below the model's context, "
            f"{source} (prompt + response); {advice}"
        )


def check_path_component(field: str, value: str) -> str:
    """`value` names a directory under an output dir (`<output_dir>/<name>`): it must be one
    path component that stays there and prints as what it is."""
    if value in ("", ".", ".."):
        problem = "is not a directory name"
    elif "/" in value or "\\" in value:
        problem = "holds a path separator"
    elif any(unicodedata.category(char).startswith("C") for char in value):
        problem = "holds a control character"
    elif value != value.strip():
        problem = "starts or ends with a space"
    else:
        return value
    raise ValueError(
        f"{field}={value!r} {problem}: it names a directory under output_dir, so it must be a "
        "single path component (no `/` or `\\`, no control characters or surrounding spaces, "
        "not empty, `.` or `..`)"
    )


NEAR_MISS_TASKS = ("addition", "multiplication")  # integer answers: the near miss is answer + 1


def _check_tuning(cfg: ExperimentConfig) -> None:
    """The tuning protocol's rules (harness.config_tuning), each refused naming its field:
    disjoint seeds, a validation set that is not the test set, one search space per arm and
    the same budget for all, every configuration a valid arm."""
    tuning = cfg.tuning
    assert tuning is not None
    shared = sorted(set(tuning.seeds) & set(cfg.seeds))
    if shared:
        raise ValueError(
            f"tuning.seeds and seeds share {shared}: a configuration selected on a seed would "
            "be scored on it again; use disjoint seeds (e.g. tuning.seeds: range(100,103))"
        )
    names = [name for name, _ in cfg.eval_sets()]
    if tuning.validation not in names:
        raise ValueError(
            f"tuning.validation={tuning.validation!r} is not an eval set; the eval sets are "
            f"{names} (add one to `evals`, with task.eval_offset past the test set's prompts)"
        )
    if tuning.validation == names[0]:
        raise ValueError(
            f"tuning.validation={tuning.validation!r} is the first eval set, the test set the "
            "final scores come from; select on another set (validation and test must differ)"
        )
    arms = [arm.name for arm in cfg.arms]
    missing = [arm for arm in arms if arm not in tuning.space]
    unknown = [arm for arm in tuning.space if arm not in arms]
    if missing or unknown:
        raise ValueError(
            f"tuning.space must hold one search space per arm: missing {missing}, not arms "
            f"{unknown} (arms are {arms}); an arm left at its defaults would get a budget of "
            "1 against the others' tuning.budget"
        )
    for arm in cfg.arms:
        space = tuning.space[arm.name]
        size = space.size(tuning.budget)
        if size != tuning.budget:
            raise ValueError(
                f"tuning.space.{arm.name}: its grid has {size} configurations, but "
                f"tuning.budget is {tuning.budget}; every arm gets the same budget (change "
                "the grid or the budget)"
            )
        for index, settings in enumerate(tuning.configurations(arm.name)):
            try:
                validate_arm({**arm.model_dump(mode="json"), **settings})
            except (ValueError, ValidationError) as exc:
                problem = _error_messages(exc)
                raise ValueError(
                    f"tuning.space.{arm.name} configuration {index} {settings}: {problem}"
                ) from None


def _error_messages(exc: Exception) -> str:
    """A validation error's messages, joined, without pydantic's header and URL lines."""
    if isinstance(exc, ValidationError):
        return "; ".join(str(e["msg"]) for e in exc.errors())
    return str(exc)


def _check_learner_ranks(arm: str, learner: LearnerConfig, ranks: int) -> None:
    """Every minibatch's groups split evenly over the learner's ranks (whole groups each)."""
    if ranks == 1:
        return
    problem = group_split_problem(learner.prompts_per_step, learner.minibatches, ranks)
    if problem is not None:
        raise ValueError(f"executor.learner_ranks={ranks}, arm {arm!r}: {problem}")


def _check_near_miss(model: ModelConfig, task: TaskConfig) -> None:
    """The near-miss warm start needs an integer answer to miss and the answer-only warm start."""
    if model.warm_start_near_miss == 0.0:
        return
    if model.path != "builtin" or model.tokenizer != "char" or task.name not in NEAR_MISS_TASKS:
        raise ValueError(
            f"model.warm_start_near_miss={model.warm_start_near_miss} needs the built-in model "
            f"with tokenizer=char on a task in {list(NEAR_MISS_TASKS)}; got model.path="
            f"{model.path!r}, model.tokenizer={model.tokenizer!r}, task.name={task.name!r}"
        )


def _check_rollout_routing(arms: list[ArmConfig], backend: GeneratorBackend) -> None:
    """R3 replays the generator's recorded experts; only the torch backend records them.

    The vLLM generator does not ask its engine for routing: on CUDA that could be wired, on CPU
    it cannot be. vLLM 0.32 has `enable_return_routed_experts`, but only in its V2 model runner,
    which on CPU needs Triton with a CPU backend (triton-cpu); this build's Triton has none, so
    engine config fails with "Model Runner V2 requires Triton"
    (`VllmConfig._validate_v2_model_runner`), and the V1 runner refuses the option ("AuxOutput
    Connector requires Model Runner V2").
    """
    rollout = [arm.name for arm in arms if arm.routing_replay == "rollout"]
    if rollout and backend == "vllm":
        raise ValueError(
            f"arms {rollout} set routing_replay=rollout, which replays the experts the generator "
            "recorded, but the generation.backend=vllm generator does not return them (on CPU "
            "vLLM's enable_return_routed_experts needs its Triton-based V2 model runner, which "
            "this build cannot run; the CUDA path is not wired); set generation.backend=torch "
            "or routing_replay=old"
        )


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
