"""Bytes per GPU (learner rank) of one learner step: pure functions of a shape and a setup.

A step has two peaks (`learner.runtime.step.train_on_batch`), and the estimate is the larger:

- **scoring**: the forwards without a gradient, on every rank over the *whole step batch*
  (each rank scores every row). pi_old, the reference and the critic's old values run in
  micro-batches of `learner.micro_batch_tokens` (`step._no_grad_pass`; the whole batch in one
  forward when it is unset), their logits bounded by `learner.logprob_chunk_tokens`. A Qwen MoE
  policy (`ROUTED_MODEL_TYPES`) has two more, each one forward of the whole batch whatever the
  budget: pi_old itself, whose routing capture is of one forward, and the routing forward of
  the `moe/*` metrics after the updates (`learner.runtime.moe.StepRouting._own_routing`),
  which asks for `logits_to_keep=1` (`MOE_METRICS_LOGITS_TO_KEEP`): one position's logits a
  row, no [tokens, vocabulary] logits, but the batch's router logits recorded while pi_old's
  record is kept. The scoring column is the largest of these passes (`scoring_passes`).
- **update**: one micro-batch's forward and backward (the whole rank share of a minibatch when
  `learner.micro_batch_tokens` is unset), with the activations autograd saves for backward.

Both sit on the state that persists through the step: parameters, gradients (zeroed to None
only when the next update starts, `learner.runtime.update.accumulate`) and AdamW's moments, and
under FSDP, while the evals run (every `learner.eval_every` steps), rank 0's plain copy of the
policy in the published dtype (`eval_copy`, the `evals` pass of the scoring column; between
evals it waits in host memory). The estimate is of rank 0, the fullest.

Byte counts, per parameter: DDP holds everything in float32 on every rank (16 bytes a trained
parameter: weight, gradient, two moments; plus DDP's flat gradient buckets, another 4, when
there is more than one rank, as `gradient_as_bucket_view=False` keeps them apart). FSDP2
(`learner.runtime.sharding`) splits the float32 weights (the master weights under bf16), the
gradients and the moments over the N ranks, and gathers one unit at a time in the compute dtype:
the root (embedding, final norm, head), which FSDP2 keeps gathered from forward to backward,
plus the current and the prefetched decoder block; backward adds a unit's unsharded gradient
and its float32 reduce-scatter copy. Every micro-batch's backward reduce-scatters
(`learner.runtime.update._local_grads` leaves FSDP's gradient sync on), so only the sharded
gradient lasts from one micro-batch to the next. `cpu_offload` moves the shards to host memory.

Activations, per token and decoder block, are the tensors autograd saves (the accounting of
Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models",
sec. 4, redone for transformers' RMSNorm, GQA with SDPA and SwiGLU): see `block_saved`. The
log-prob copies are counted from `learner.runtime.forward` and
`learner.algorithms.sampling_dist` (`LOGIT_COPY_BYTES`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Literal

from harness.planning.architecture import ModelShape

F32 = 4
DTYPE_BYTES = {"float32": 4, "bfloat16": 2}
ADAM_MOMENT_BYTES = 2 * F32  # exp_avg, exp_avg_sq in float32
INDEX_BYTES = 8  # int64

LOGIT_COPY_BYTES = 13
"""float32 bytes per logit beside the model's own logits (in the compute dtype), at the
log-prob pass's peak (`learner.runtime.forward._score`): the log-softmax (4) that backward
keeps, and the entropy's `exp * log_p` (4), its `where` (4) and the finite mask (1). The
float32 cast and the division by the temperature are freed before that."""
TRUNCATED_LOGIT_COPY_BYTES = 24
"""With top-p (sampling_dist._dropped): the scaled logits (4), sorted values (4), sort order
(int64, 8), softmax (4) and cumulative sum (4) at once."""
ROUTED_MODEL_TYPES = frozenset({"qwen2_moe", "qwen3_moe"})
"""Model types whose routers `learner.runtime.moe.ROUTER_TYPES` hooks: for them every step
records the batch's router logits and runs the `moe/*` routing forward."""
MOE_METRICS_LOGITS_TO_KEEP = 1
"""Positions a row that the `moe/*` routing forward projects to logits
(`StepRouting._own_routing` calls the model with `logits_to_keep=1`): it needs the routers
only, so its logits are [rows, 1, vocabulary] in the compute dtype, not [tokens, vocabulary]."""


@dataclass(frozen=True)
class LearnerSetup:
    """What a step's memory depends on besides the model; `gpus` is the number of ranks."""

    gpus: int = 1
    parallel: Literal["ddp", "fsdp"] = "ddp"
    dtype: Literal["float32", "bfloat16"] = "float32"
    activation_checkpointing: bool = False
    cpu_offload: bool = False
    groups: int = 8  # prompts per step (learner.prompts_per_step)
    group_size: int = 8  # samples per prompt (generation.group_size)
    minibatches: int = 1
    seq_len: int = 64  # padded row width: prompt + response tokens
    micro_batch_tokens: int | None = None
    logprob_chunk_tokens: int | None = None
    critic: bool = False  # PPO's value model (a copy of the backbone, trained)
    reference: bool = False  # frozen reference policy (beta > 0)
    truncated_sampling: bool = False  # top-p < 1 or top-k > 0: sort copies of the logits

    @property
    def step_rows(self) -> int:
        return self.groups * self.group_size

    @property
    def share_rows(self) -> int:
        """Rows a rank trains per minibatch: its whole groups of the largest minibatch."""
        per_minibatch = math.ceil(self.groups / self.minibatches)
        return math.ceil(per_minibatch / self.gpus) * self.group_size

    @property
    def micro_rows(self) -> int:
        """Rows of the largest micro-batch, every row at full width (`update.micro_batches`:
        rows x width within the budget, at least one row)."""
        if self.micro_batch_tokens is None:
            return self.share_rows
        return min(self.share_rows, max(1, self.micro_batch_tokens // self.seq_len))

    @property
    def micro_batches(self) -> int:
        return math.ceil(self.share_rows / self.micro_rows)

    @property
    def scoring_rows(self) -> int:
        """Rows of the largest micro-batch of the passes without gradient, which split the
        whole step batch (every row, on every rank) by the same budget (`step._no_grad_pass`):
        the whole batch when `learner.micro_batch_tokens` is unset."""
        if self.micro_batch_tokens is None:
            return self.step_rows
        return min(self.step_rows, max(1, self.micro_batch_tokens // self.seq_len))

    @property
    def compute_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]


@dataclass(frozen=True)
class Phase:
    """Bytes per GPU at one of a step's two peaks, by component."""

    parameters: float = 0.0
    gradients: float = 0.0
    optimizer: float = 0.0
    gathered: float = 0.0  # FSDP units gathered for compute (and their unsharded gradients)
    eval_copy: float = 0.0  # FSDP, rank 0, during evals: the unsharded policy, published dtype
    activations: float = 0.0  # saved for backward (update) or one block's working set (scoring)
    logits: float = 0.0  # model logits and their float32 log-prob copies
    routing: float = 0.0  # MoE router logits and experts recorded for the batch

    @property
    def total(self) -> float:
        return sum(getattr(self, f.name) for f in fields(self))

    def largest(self) -> tuple[str, float]:
        return max(((f.name, getattr(self, f.name)) for f in fields(self)), key=lambda x: x[1])


ScoringPass = Literal["micro", "moe_pi_old", "moe_routing"]
"""The pass without gradient whose peak is the scoring column (`scoring_passes`)."""


@dataclass(frozen=True)
class MemoryEstimate:
    update: Phase
    scoring: Phase
    host: float  # bytes of host memory per rank that cpu_offload moves there
    scoring_pass: ScoringPass = "micro"  # which no-grad pass `scoring` is

    @property
    def peak(self) -> float:
        return max(self.update.total, self.scoring.total)

    @property
    def peak_phase(self) -> Literal["update", "scoring"]:
        return "update" if self.update.total >= self.scoring.total else "scoring"


# --- persistent state -------------------------------------------------------------------


def model_parameters(shape: ModelShape, setup: LearnerSetup) -> tuple[int, int]:
    """(trained parameters: policy + critic, frozen parameters: reference)."""
    policy = shape.parameters()
    # The critic is the policy's backbone (no output head; a tied head is the embedding, kept)
    # plus a scalar head [hidden] + bias (learner.runtime.value_model).
    critic = policy - shape.head_parameters() + shape.hidden + 1 if setup.critic else 0
    return policy + critic, policy if setup.reference else 0


def persistent(shape: ModelShape, setup: LearnerSetup) -> tuple[Phase, float]:
    """(parameters, gradients, optimizer state on the GPU; bytes moved to the host per rank)."""
    trained, frozen = model_parameters(shape, setup)
    shards = setup.gpus if setup.parallel == "fsdp" else 1
    buckets = 2 if setup.parallel == "ddp" and setup.gpus > 1 else 1
    state = Phase(
        parameters=F32 * (trained + frozen) / shards,  # float32: the master weights under bf16
        gradients=buckets * F32 * trained / shards,
        optimizer=ADAM_MOMENT_BYTES * trained / shards,
    )
    if setup.cpu_offload:
        return Phase(), state.total
    return state, 0.0


def gathered_units(shape: ModelShape, setup: LearnerSetup, *, backward: bool) -> float:
    """FSDP: the root and two blocks gathered in the compute dtype; in backward one unit's
    unsharded gradient (compute dtype) and its float32 reduce-scatter input as well."""
    if setup.parallel != "fsdp":
        return 0.0
    b, root, block = setup.compute_bytes, shape.root_parameters(), shape.largest_block()
    gathered = b * (root + 2 * block)
    return gathered + ((b + F32) * max(root, block) if backward else 0.0)


def eval_copy(shape: ModelShape, setup: LearnerSetup) -> float:
    """FSDP: rank 0 evaluates on a plain copy of the policy in the published (compute) dtype,
    on the learner device only while the evals run and in host memory between them
    (`learner.runtime.published.PublishedWeights.eval_model`). Generation's own memory during
    the evals is not counted."""
    return setup.compute_bytes * shape.parameters() if setup.parallel == "fsdp" else 0.0


# --- activations -----------------------------------------------------------------------


def rms_saved(width: int, b: int) -> int:
    """RMSNorm (transformers' `*RMSNorm.forward`): the float32 input and the normalised input in
    the compute dtype that the weight multiply keeps."""
    return (F32 + b) * width


def attention_saved(shape: ModelShape, b: int) -> int:
    """Bytes per token the attention half of a block saves: its RMSNorm and output (the q/k/v
    projections' input), q after RoPE, k and v repeated to every head (a padding mask makes
    transformers' SDPA path `repeat_kv`), SDPA's output, o_proj's contiguous input, and SDPA's
    float32 log-sum-exp per head; Qwen3's q/k norms save their inputs too."""
    q = shape.heads * shape.head_dim
    kv = shape.kv_heads * shape.head_dim
    qk_norm = rms_saved(q + kv, b) if shape.qk_norm else 0
    return rms_saved(shape.hidden, b) + b * shape.hidden + qk_norm + 5 * b * q + F32 * shape.heads


def mlp_saved(shape: ModelShape, b: int, sparse: bool) -> int:
    """Bytes per token the MLP half saves: its RMSNorm and output, then SwiGLU's gate, SiLU,
    up and product (4 x width). A sparse layer: the router's float32 softmax and top-k experts,
    per active expert its input copy, SwiGLU and output (2 x hidden + 4 x width), and the
    shared expert (with its gate's output)."""
    norm = rms_saved(shape.hidden, b) + b * shape.hidden
    if not sparse:
        return norm + 4 * b * shape.intermediate
    moe = shape.moe
    assert moe is not None
    router = F32 * moe.experts + INDEX_BYTES * moe.active
    routed = moe.active * b * (2 * shape.hidden + 4 * moe.expert_intermediate)
    shared = b * 4 * moe.shared_intermediate + (b * shape.hidden if moe.shared_gate else 0)
    return norm + router + routed + shared


def block_saved(shape: ModelShape, b: int, sparse: bool) -> int:
    """Bytes per token one decoder block keeps for backward."""
    return attention_saved(shape, b) + mlp_saved(shape, b, sparse)


def attention_mask_bytes(rows: int, width: int, b: int, saved_masks: int) -> float:
    """transformers' 4-D boolean padding mask [rows, 1, L, L], and SDPA's additive copy of it in
    the compute dtype, made (and kept for backward) in each of `saved_masks` blocks."""
    return rows * width * width * (1 + b * saved_masks)


def update_activations(shape: ModelShape, setup: LearnerSetup) -> float:
    """Saved activations of the largest micro-batch, plus one block's backward working set
    (about its saved activations again). Activation checkpointing keeps each block's input
    only, and recomputes one block at a time in backward."""
    b, rows, width = setup.compute_bytes, setup.micro_rows, setup.seq_len
    tokens = rows * width
    kinds = shape.block_kinds()
    one_block = max(block_saved(shape, b, sparse) for sparse, _ in kinds)
    if setup.activation_checkpointing:
        blocks = shape.layers * b * shape.hidden + 2 * one_block
        masks = 1
    else:
        blocks = sum(count * block_saved(shape, b, sparse) for sparse, count in kinds) + one_block
        masks = shape.layers
    final = rms_saved(shape.hidden, b) + b * shape.hidden  # final norm, the head's input
    rotary = 2 * F32 * shape.head_dim  # cos and sin, shared by the blocks
    per_token = blocks + final + rotary
    return tokens * per_token + attention_mask_bytes(rows, width, b, masks)


def scoring_block_bytes(shape: ModelShape, b: int, sparse: bool) -> int:
    """Bytes per token alive inside one block of a forward without gradient: the residual in
    and out, the RMSNorm's float32 temporaries and output, then the larger of attention
    (q, repeated k and v, output and its contiguous copy) and the MLP (SiLU, up, product at
    once; a sparse layer: the shared expert, the router's logits and softmax, and the
    one-hot expert mask [tokens, k, experts + 1] of int64 the expert loop builds)."""
    residual = 2 * b * shape.hidden + 2 * F32 * shape.hidden + b * shape.hidden
    attention = 5 * b * shape.heads * shape.head_dim
    if not sparse:
        return residual + max(attention, 3 * b * shape.intermediate)
    moe = shape.moe
    assert moe is not None
    dispatch = INDEX_BYTES * moe.active * (moe.experts + 1)
    mlp = 3 * b * moe.shared_intermediate + (b + F32) * moe.experts + dispatch
    return residual + max(attention, mlp)


def scoring_activations(
    shape: ModelShape, setup: LearnerSetup, rows: int, *, hidden_copy: bool
) -> float:
    """A no-grad forward of `rows` rows: one block's working set, the final hidden states (and,
    with `hidden_copy`, their copy at the scored positions that chunked log-probs make), the
    mask and one SDPA copy."""
    b, width = setup.compute_bytes, setup.seq_len
    block = max(scoring_block_bytes(shape, b, sparse) for sparse, _ in shape.block_kinds())
    hidden = b * shape.hidden * (2 if hidden_copy else 1)
    per_token = block + hidden + 2 * F32 * shape.head_dim
    return rows * width * per_token + attention_mask_bytes(rows, width, b, 1)


# --- logits and routing record ---------------------------------------------------------


def logit_bytes(shape: ModelShape, setup: LearnerSetup, tokens: int, *, chunked: bool) -> float:
    """The model's logits in the compute dtype and the float32 log-prob copies, for `tokens`
    positions, or for one chunk of `learner.logprob_chunk_tokens` when chunked."""
    chunk = setup.logprob_chunk_tokens
    positions = min(tokens, chunk) if chunked and chunk else tokens
    copies = TRUNCATED_LOGIT_COPY_BYTES if setup.truncated_sampling else LOGIT_COPY_BYTES
    return positions * shape.vocab * (setup.compute_bytes + copies)


def routes_recorded(shape: ModelShape) -> bool:
    return shape.moe is not None and shape.model_type in ROUTED_MODEL_TYPES


def routing_record(shape: ModelShape, setup: LearnerSetup) -> float:
    """One record of the batch's routing (`learner.runtime.moe.RoutingRecorder`): float32 router
    logits and int64 experts, every sparse layer, every token of the step batch."""
    if not routes_recorded(shape):
        return 0.0
    moe = shape.moe
    assert moe is not None
    per_token = moe.sparse_layers * (F32 * moe.experts + INDEX_BYTES * moe.active)
    return setup.step_rows * setup.seq_len * per_token


# --- the estimate ----------------------------------------------------------------------


def scoring_passes(
    shape: ModelShape, setup: LearnerSetup, state: Phase
) -> dict[ScoringPass, Phase]:
    """Each pass without gradient that the step runs, at its peak, on `state`:

    - `micro`: pi_old (dense policy), the reference and the critic's old values, one
      micro-batch of `setup.scoring_rows` rows at a time; a Qwen MoE policy runs it only for a
      reference or a critic, with pi_old's routing record kept (a critic has no logits);
    - `moe_pi_old` (Qwen MoE): pi_old on the whole batch, filling the routing record;
    - `moe_routing` (Qwen MoE): the `moe/*` routing forward on the whole batch, logits of
      `MOE_METRICS_LOGITS_TO_KEEP` position a row, filling a second record beside pi_old's;
      once it returns, `RoutingRecorder.routing` stacks the per-layer tensors into a third
      while the forward's activations are gone, whichever of the two moments is larger.
    """
    base = replace(state, gathered=gathered_units(shape, setup, backward=False))
    chunked = setup.logprob_chunk_tokens is not None
    record = routing_record(shape, setup)
    whole = setup.step_rows
    routed = routes_recorded(shape)
    passes: dict[ScoringPass, Phase] = {}
    if not routed or setup.reference or setup.critic:
        rows = setup.scoring_rows
        scores = not routed or setup.reference  # a policy's log-probs, not only values
        passes["micro"] = replace(
            base,
            activations=scoring_activations(shape, setup, rows, hidden_copy=chunked),
            logits=logit_bytes(shape, setup, rows * setup.seq_len, chunked=True) if scores else 0,
            routing=record,
        )
    if routed:
        passes["moe_pi_old"] = replace(
            base,
            activations=scoring_activations(shape, setup, whole, hidden_copy=chunked),
            logits=logit_bytes(shape, setup, whole * setup.seq_len, chunked=True),
            routing=record,
        )
        forward = replace(
            base,
            activations=scoring_activations(shape, setup, whole, hidden_copy=False),
            logits=whole * MOE_METRICS_LOGITS_TO_KEEP * shape.vocab * setup.compute_bytes,
            routing=2 * record,
        )
        stacked = replace(base, routing=3 * record)
        passes["moe_routing"] = max(forward, stacked, key=lambda phase: phase.total)
    return passes


def estimate(shape: ModelShape, setup: LearnerSetup) -> MemoryEstimate:
    """Both peaks of a step on one rank (module docstring)."""
    state, host = persistent(shape, setup)
    micro_tokens = setup.micro_rows * setup.seq_len
    update = replace(
        state,
        gathered=gathered_units(shape, setup, backward=True),
        activations=update_activations(shape, setup),
        logits=logit_bytes(shape, setup, micro_tokens, chunked=True),
        routing=routing_record(shape, setup),  # pi_old's routing, kept through the updates
    )
    passes = scoring_passes(shape, setup, state)
    if setup.parallel == "fsdp":  # rank 0 during the evals
        passes["evals"] = replace(state, eval_copy=eval_copy(shape, setup))
    name = max(passes, key=lambda key: passes[key].total)  # the first of equals
    return MemoryEstimate(update=update, scoring=passes[name], host=host, scoring_pass=name)
