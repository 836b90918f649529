"""The experiment config's rules across sections, each refused in one line naming the fields.

Kept apart from the models (`harness.config.experiment`): each rule reads several sections (arms
and learner, model and generation, staleness and buffer, tuning and evals), so it is a function
of the whole config, called by `ExperimentConfig`'s validators in a fixed order (the first broken
rule is the one reported). The rules see the config as `CheckedConfig`, the sections and
questions they read, so this module stays below the model it checks (no import circle).
"""

from __future__ import annotations

import unicodedata
from typing import Protocol

from pydantic import ValidationError

from buffer.config import BufferConfig, StalenessConfig
from buffer.staleness import POLICIES
from contract.config_dump import dump_without_defaults
from harness.config.evals import EvalSetConfig, TrainTaskConfig, check_unique_names
from harness.config.executor import ExecutorConfig
from harness.config.sections import GenerationConfig, GeneratorBackend, ModelConfig, TaskConfig
from harness.config.tuning import TuningConfig
from harness.staleness_regimes import Regime
from learner.config import ArmConfig, LearnerConfig, group_split_problem, validate_arm
from learner.config.omitted import OMITTED_AT_DEFAULT as LEARNER_OMITTED


class CheckedConfig(Protocol):
    """What the rules read of an `ExperimentConfig` (whose fields these are): its sections, an
    arm's resolved regime, its dynamic-sampling rounds and its eval sets."""

    arms: list[ArmConfig]
    seeds: list[int]
    model: ModelConfig
    task: TaskConfig
    train_tasks: list[TrainTaskConfig]
    evals: list[EvalSetConfig]
    generation: GenerationConfig
    buffer: BufferConfig
    staleness: StalenessConfig
    learner: LearnerConfig
    executor: ExecutorConfig
    tuning: TuningConfig | None

    def dynamic_sampling_rounds(self, arm: str | None = None) -> int: ...
    def regime(self, arm: str) -> Regime: ...
    def eval_sets(self) -> list[tuple[str, TaskConfig]]: ...


def check_arms_and_seeds(cfg: CheckedConfig) -> None:
    """Unique arm names, every arm's minibatches split over the learner's ranks, unique seeds,
    unique eval set and training task names."""
    names = [arm.name for arm in cfg.arms]
    if len(set(names)) != len(names):
        raise ValueError(f"arm names must be unique, got {names}")
    for arm in cfg.arms:
        settings = arm.training_settings(cfg.learner)  # an arm's own settings must fit too
        _check_learner_ranks(arm.name, settings, cfg.executor.learner_ranks)
    if len(set(cfg.seeds)) != len(cfg.seeds):
        raise ValueError(f"seeds has duplicates: {cfg.seeds}")
    check_unique_names(cfg.evals, cfg.train_tasks)


def check_model_and_backends(cfg: CheckedConfig) -> None:
    """What the model, the generator backend and the executor must support: routing replay,
    the learner's GPUs in its Ray bundle, the near-miss warm start, the context, vLLM-CPU."""
    replaying = [arm.name for arm in cfg.arms if arm.routing_replay != "off"]
    if replaying and cfg.model.path == "builtin" and cfg.model.arch != "qwen3_moe":
        raise ValueError(
            f"arms {replaying} set routing_replay (old or rollout), but the built-in model is "
            f"dense (model.arch={cfg.model.arch}); routing replay needs model.arch=qwen3_moe"
        )
    _check_rollout_routing(cfg.arms, cfg.generation.backend)
    ranks, bundle = cfg.executor.learner_ranks, cfg.executor.learner
    if cfg.executor.kind == "ray" and cfg.learner.device == "cuda" and bundle.gpus < ranks:
        raise ValueError(
            f"executor.learner_ranks={ranks} with learner.device=cuda runs {ranks} ranks in "
            f"the learner's Ray bundle, which asks for executor.learner.gpus={bundle.gpus}; "
            f"set executor.learner.gpus={ranks} (a bundle is one node: the ranks share it)"
        )
    _check_near_miss(cfg.model, cfg.task)
    if cfg.model.path == "builtin":  # a model directory's context is checked by the CLI
        check_response_fits(
            cfg.generation.max_new_tokens,
            cfg.model.max_seq_len,
            f"model.max_seq_len={cfg.model.max_seq_len}",
            "lower generation.max_new_tokens or raise model.max_seq_len",
        )
    head_dim = cfg.model.hidden_size // cfg.model.num_heads
    if (
        cfg.model.path == "builtin"
        and cfg.generation.backend == "vllm"
        and cfg.generation.device == "cpu"
        and head_dim < 32
    ):
        raise ValueError(
            f"model.hidden_size / model.num_heads = {head_dim}, but vLLM's CPU attention "
            "needs a head size of at least 32: lower model.num_heads or use "
            "generation.backend=torch"
        )


def check_generator_cpu_sets(cfg: CheckedConfig) -> None:
    """executor.cpu_sets names one CPU set per generator, or one they all share (whether the
    machine lends those CPUs is checked where the trial starts: `harness.launch.affinity`)."""
    if cfg.executor.cpu_sets is not None:
        cfg.executor.cpu_sets.generator_cpus(cfg.generation.num_generators)


def check_staleness_and_depth(cfg: CheckedConfig) -> None:
    """Dynamic sampling needs fixed staleness, and the buffer must hold every group that waits
    unacked for the next checkpoint."""
    rounds = cfg.dynamic_sampling_rounds()
    names = [arm.name for arm in cfg.arms if arm.sampling_rounds()]
    problem = POLICIES[cfg.staleness.mode].refusal("dynamic_sampling_rounds", f"arms {names}")
    if rounds and problem:
        raise ValueError(problem)
    # every draw of a step stays unacked until the checkpoint (extra rounds included); a sync
    # interval lets groups be sync_every - 1 versions staler
    draws = cfg.learner.checkpoint_every * (1 + rounds)
    oldest = max(cfg.regime(arm.name).oldest for arm in cfg.arms)
    depth_needed = (draws + oldest + 2) * cfg.learner.prompts_per_step
    if cfg.buffer.max_depth < depth_needed:
        extra = " x (1 + max dynamic_sampling_rounds)" if rounds else ""
        raise ValueError(
            f"buffer.max_depth={cfg.buffer.max_depth} is too small: groups stay unacked "
            f"until the next checkpoint, so up to (learner.checkpoint_every{extra} + max lag "
            f"+ 2) * learner.prompts_per_step = {depth_needed} may wait; raise "
            "buffer.max_depth or lower learner.checkpoint_every"
        )


def check_message_size(cfg: CheckedConfig) -> None:
    """A group whose responses all reach max_new_tokens must fit one buffer message. Its
    token columns alone take group_size * max_new_tokens * 8 bytes (an int32 id and a
    float32 behaviour logprob per token), a lower bound: prompts and the Arrow framing come
    on top, which the generator checks per group (harness.trial.generator_main.push_round)."""
    floor = cfg.generation.group_size * cfg.generation.max_new_tokens * 8
    if cfg.buffer.max_message_bytes < floor:
        raise ValueError(
            f"buffer.max_message_bytes={cfg.buffer.max_message_bytes} cannot hold a group "
            f"with full-length responses: generation.group_size={cfg.generation.group_size}"
            f" x generation.max_new_tokens={cfg.generation.max_new_tokens} x 8 bytes = "
            f"{floor} before prompts and Arrow framing (a few KiB); raise "
            f"buffer.max_message_bytes well above {floor} (the default is 64 MiB)"
        )


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


NEAR_MISS_TASKS = ("addition", "multiplication", "repeat")
"""Tasks with a near miss (`harness.models.near_miss.NEAR_MISSES`: answer + 1 for the integer
tasks, one repetition too many for `repeat`)."""


def check_tuning(cfg: CheckedConfig) -> None:
    """The tuning protocol's rules (harness.config.tuning), each refused naming its field:
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
                validate_arm({**dump_without_defaults(arm, LEARNER_OMITTED), **settings})
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
    """The near-miss warm start needs a task with a near miss and the answer-only warm start."""
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
