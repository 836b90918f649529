"""Optimisation settings shared by every arm, so arms differ only in their objective."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from learner.vocabulary import AdamWKernels, LRSchedule, OldLogprobs, OptimizerImpl


class RolloutLogConfig(BaseModel):
    """Which trained rollouts a trial writes to `rollouts.parquet/` (`contract.rollout_log`).

    Why an option: on CPU a step's rollouts are a few kB, so every one is kept (researchers look
    at samples first); at GPU scale (32 prompts x 8 responses x 1k tokens a step) that would be
    as much data as the rest of the trial, so a GPU config logs every N-th step, a share of it.
    Either choice changes no trained number: the log is written on the records thread."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    every: int = Field(
        default=1,
        ge=0,
        description="Log the trained rollouts of the first step, every this many steps after "
        "it, and the last step; 0: no rollout log.",
    )
    share: float = Field(
        default=1.0,
        gt=0,
        le=1,
        description="The share of a logged step's groups that are logged, chosen by a hash of "
        "the group id: a rerun, a resume and every arm of a seed log the same groups.",
    )


class LearnerConfig(BaseModel):
    """Optimisation settings shared by every arm, so arms differ only in their objective."""

    model_config = ConfigDict(extra="forbid")

    steps: int = Field(default=20, gt=0, description="Learner steps (policy versions) per trial.")
    prompts_per_step: int = Field(
        default=8, gt=0, description="Groups (prompts) consumed per learner step."
    )
    lr: float = Field(default=1e-4, gt=0, description="AdamW learning rate of the policy.")
    value_lr: float = Field(default=3e-4, gt=0, description="PPO value model learning rate.")
    weight_decay: float = Field(default=0.0, ge=0, description="AdamW weight decay.")
    betas: tuple[float, float] = Field(default=(0.9, 0.999), description="AdamW betas.")
    warmup_steps: int = Field(default=0, ge=0, description="Linear warm-up length, in updates.")
    schedule: LRSchedule = Field(default="constant", description="LR after warm-up.")
    grad_clip: float = Field(default=1.0, gt=0, description="Global gradient-norm clip.")
    ppo_epochs: int = Field(default=1, gt=0, description="Passes over each step's batch.")
    minibatches: int = Field(default=1, gt=0, description="Minibatches per pass (updates).")
    old_logprobs: OldLogprobs = Field(
        default="behavior",
        description="Correction of arms that set no `correction`: `behavior` = naive (the "
        "generator's logprobs are pi_old); `recompute` = tis_token (pi_old recomputed by the "
        "learner at step start, truncated IS weight with cap `is_cap`).",
    )
    is_cap: float = Field(
        default=2.0, gt=0, description="Truncation cap C of `recompute` (tis_token) arms."
    )
    gamma: float = Field(default=1.0, ge=0, le=1, description="PPO GAE discount.")
    lam: float = Field(default=0.95, ge=0, le=1, description="PPO GAE lambda.")
    value_clip: float = Field(default=0.2, gt=0, description="PPO value-loss clip range.")
    eval_every: int = Field(
        default=5,
        gt=0,
        description="Steps between evals (every eval set of `evals`, greedy and with "
        "eval.samples samples per prompt); also on the initial weights and after the last step.",
    )
    checkpoint_every: int = Field(default=10, gt=0, description="Steps between checkpoints.")
    rollout_log: RolloutLogConfig = Field(
        default_factory=RolloutLogConfig,
        description="The trained rollouts written to rollouts.parquet/ (tokens, decoded text, "
        "rewards, behaviour logprobs, per-token versions, lag): every step by default.",
    )
    grad_spike_factor: float = Field(
        default=5.0, gt=1, description="A grad norm over this x the rolling median is a spike."
    )
    keep_versions: int = Field(
        default=3, gt=0, description="Weight-store versions kept on disk (older are removed)."
    )
    threads: int = Field(
        default=1, gt=0, description="torch intra-op threads of the learner process (CPU)."
    )
    device: Literal["cpu", "cuda"] = Field(default="cpu", description="Learner device.")
    reward_range: tuple[float, float] = Field(
        default=(-1e4, 1e4),
        description="[low, high] a group's rewards must lie in: a group with a reward outside it "
        "is refused at intake and dead-lettered, never trained (buffer.intake). The "
        "default admits every shipped verifier (rewards 0 and 1) and any plausible reward "
        "function, and stops a reward such as 1e30 that would swamp the batch's advantages.",
    )
    micro_batch_tokens: int | None = Field(
        default=None,
        gt=0,
        description="Gradient accumulation: each minibatch is trained in micro-batches of at "
        "most this many padded tokens (rows x the micro-batch's longest prompt + response; "
        "rows sorted by length, so little is padding), one forward/backward each and one "
        "optimizer step per minibatch. A sequence longer than the budget is a micro-batch of "
        "its own, never split. Every loss divides by the whole minibatch's token and sequence "
        "counts, so the gradient and the logged stats equal the unsplit minibatch's up to "
        "float rounding (Clip-Cov's draw is seeded by the log-probs' bits, so it may draw "
        "other tokens when a micro-batch rounds one differently). Unset (default): each "
        "minibatch in one forward/backward. The passes without a gradient (pi_old, reference, "
        "the critic's old values) run over the step's batch in micro-batches of the same budget "
        "(but an MoE policy's pi_old pass, whose routing capture is of one forward). It bounds "
        "the activation memory of an update: set it to what one forward/backward fits.",
    )
    logprob_chunk_tokens: int | None = Field(
        default=None,
        gt=0,
        description="Log-probabilities in chunks of this many token positions: the output "
        "embedding is applied to the base model's hidden states chunk by chunk (checkpointed, "
        "so backward recomputes one chunk at a time), so float32 [tokens, vocabulary] logits "
        "never exist for more than one chunk. Same values and gradients as unchunked up to "
        "float rounding, at the cost of a second head projection in backward. Unset "
        "(default): the model's full logits. Worth it for large vocabularies: at Qwen2.5's "
        "151,936 entries a chunk of 1024 positions holds 0.62 GB of float32 logits.",
    )

    parallel: Literal["ddp", "fsdp"] = Field(
        default="ddp",
        description="How the learner's ranks share the models. `ddp`: every rank holds the "
        "whole policy, critic, reference and optimizer state (DistributedDataParallel). "
        "`fsdp`: FSDP2 (`fully_shard` on each decoder block and the root of policy, critic and "
        "reference): parameters, gradients and AdamW state are split over the ranks, so a rank "
        "holds 1/N of them; checkpoints are sharded (torch.distributed.checkpoint) and resume "
        "at another number of ranks. A single process under `fsdp` forms a group of one.",
    )
    dtype: Literal["float32", "bfloat16"] = Field(
        default="float32",
        description="Compute precision. `bfloat16` (needs parallel=fsdp): FSDP2's "
        "MixedPrecisionPolicy runs forward and backward in bf16 and keeps float32 master "
        "weights, optimizer state and gradient reductions; log-probabilities, ratios and losses "
        "are float32, and weight versions are published in bf16. The gap to the generators' "
        "log-probs this adds shows in mismatch/kl_behavior.",
    )
    activation_checkpointing: bool = Field(
        default=False,
        description="Recompute each decoder block's activations in backward instead of keeping "
        "them (policy and critic): activation memory of one block instead of all, for about "
        "one more forward's compute. Same gradients up to float rounding.",
    )
    cpu_offload: bool = Field(
        default=False,
        description="parallel=fsdp on cuda: keep the sharded parameters, gradients and "
        "optimizer state in CPU memory (FSDP2 CPUOffloadPolicy; the optimizer steps on the "
        "CPU). Trades step time for GPU memory.",
    )

    optimizer_impl: OptimizerImpl = Field(
        default="auto",
        description="How AdamW steps: `fused` (one kernel per step, no temporaries), "
        "`foreach` (a few ops over every tensor at once; one float32 temporary the size of the "
        "rank's parameters, the moments' square root), `for_loop` (tensor by tensor; "
        "temporaries of the largest tensor only, slowest). `auto`: fused on cuda, for the "
        "memory (foreach, torch's own default there, needs a parameter-sized temporary at the "
        "step: 14 GiB a GPU for Qwen3-30B-A3B on 8), torch's default elsewhere (for_loop on "
        "the CPU, and with cpu_offload). The update is the same up to float rounding.",
    )

    @property
    def resolved_optimizer_impl(self) -> AdamWKernels:
        """`optimizer_impl` with `auto` decided (its description)."""
        if self.optimizer_impl != "auto":
            return self.optimizer_impl
        on_gpu = self.device == "cuda" and not self.cpu_offload
        return "fused" if on_gpu else "for_loop"

    @model_validator(mode="after")
    def _check(self) -> LearnerConfig:
        low, high = self.reward_range
        if not (math.isfinite(low) and math.isfinite(high) and low < high):
            raise ValueError(
                f"learner.reward_range={list(self.reward_range)} must be two finite numbers "
                "[low, high] with low < high, e.g. [-1e4, 1e4]"
            )
        if self.dtype == "bfloat16" and self.parallel != "fsdp":
            raise ValueError(
                "learner.dtype=bfloat16 needs learner.parallel=fsdp: FSDP2's "
                "MixedPrecisionPolicy is what keeps float32 master weights and reductions"
            )
        if self.cpu_offload and (self.parallel != "fsdp" or self.device != "cuda"):
            raise ValueError(
                "learner.cpu_offload=true needs learner.parallel=fsdp and learner.device=cuda: "
                "it moves FSDP's shards from GPU memory to CPU memory (on the CPU they are there "
                "already)"
            )
        if self.minibatches > self.prompts_per_step:
            raise ValueError(
                f"learner.minibatches={self.minibatches} exceeds learner.prompts_per_step="
                f"{self.prompts_per_step}; each minibatch needs at least one group"
            )
        return self


def group_split_problem(n_groups: int, minibatches: int, world_size: int) -> str | None:
    """Why `world_size` data-parallel ranks cannot each train whole groups of every minibatch
    of `n_groups` groups in `minibatches` minibatches (sized as `torch.tensor_split` sizes
    them: the first n % m one larger), or None when they can."""
    base, extra = divmod(n_groups, minibatches)
    sizes = [base + (k < extra) for k in range(minibatches)]
    if not any(size % world_size for size in sizes):
        return None
    per_step = minibatches * world_size
    return (
        f"learner.prompts_per_step={n_groups} in learner.minibatches={minibatches} gives "
        f"minibatches of {sizes} groups, which {world_size} data-parallel ranks cannot split "
        f"into whole groups; make learner.prompts_per_step a multiple of learner.minibatches "
        f"x world size (e.g. {per_step * max(1, n_groups // per_step)}) "
        f"or change the number of learner ranks"
    )
