"""Bytes per GPU (learner rank) of one learner step: pure functions of a shape and a setup.

A step has two peaks (`learner.runtime.step.train_on_batch`), and the estimate is the larger:

- **scoring**: the forwards without a gradient, on every rank over the *whole step batch*
  (each rank scores every row), in micro-batches of `learner.micro_batch_tokens`
  (`step._score`'s `every_row` parts; the whole batch in one forward when it is unset), their
  logits bounded by `learner.logprob_chunk_tokens`: pi_old, the reference and the critic's old
  values. A Qwen MoE policy (`ROUTED_MODEL_TYPES`) captures its routing around each of pi_old's
  parts (`learner.runtime.moe.StepRouting.capture_old`) and, after the updates, runs the
  routing forward of the `moe/*` metrics in the same parts (`StepRouting._own_routing`, with
  `logits_to_keep=1`, `MOE_METRICS_LOGITS_TO_KEEP`: one position's logits a row, no
  [tokens, vocabulary] logits). So a routing pass holds one micro-batch's activations, as a
  dense pass does, beside the batch's routing records (`routing_record`: each token's experts
  and router entropy, every sparse layer; never the router logits, which the capture's hook
  reduces at once). The scoring column is the largest of these passes (`scoring_passes`).
- **update**: one micro-batch's forward and backward (the whole rank share of a minibatch when
  `learner.micro_batch_tokens` is unset), with the activations autograd saves for backward,
  and an MoE policy's pi_old routing record, kept for replay and the metrics.

Both sit on the state that persists through the step: parameters, gradients (zeroed to None
only when the next update starts, `learner.runtime.update.accumulate`) and AdamW's moments.
Nothing else of the policy is ever whole on a learner GPU: the evals run on the generators
(`buffer.eval_requests`), and the published versions are gathered into host memory one tensor
at a time (`learner.runtime.sharding.gather_full_weights`). The estimate is of rank 0, which
holds what every rank holds.

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
sec. 4, redone for transformers' RMSNorm, GQA with SDPA and SwiGLU): see
`activations.block_saved`. The log-prob copies are counted from `learner.runtime.forward` and
`learner.algorithms.sampling_dist` (`LOGIT_COPY_BYTES`).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Literal

from harness.planning.activations import scoring_activations, update_activations
from harness.planning.architecture import ModelShape
from harness.planning.setup import ADAM_MOMENT_BYTES, F32, INDEX_BYTES, LearnerSetup

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
records the batch's routing and runs the `moe/*` routing forward."""
ROUTER_ENTROPY_BYTES = F32
"""What a routing capture keeps of a token's router logits in a sparse layer: their entropy in
float32 (`learner.runtime.moe.RoutingRecorder.record`), beside the top-k experts (int64)."""
MOE_METRICS_LOGITS_TO_KEEP = 1
"""Positions a row that the `moe/*` routing forward projects to logits
(`StepRouting._own_routing` calls the model with `logits_to_keep=1`): it needs the routers
only, so its logits are [rows, 1, vocabulary] in the compute dtype, not [tokens, vocabulary]."""


@dataclass(frozen=True)
class Phase:
    """Bytes per GPU at one of a step's two peaks, by component."""

    parameters: float = 0.0
    gradients: float = 0.0
    optimizer: float = 0.0
    gathered: float = 0.0  # FSDP units gathered for compute (and their unsharded gradients)
    activations: float = 0.0  # saved for backward (update) or one block's working set (scoring)
    logits: float = 0.0  # model logits and their float32 log-prob copies
    routing: float = 0.0  # MoE experts and router entropies recorded (batch and micro-batch)

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


def routing_bytes(shape: ModelShape, tokens: int) -> float:
    """The routing of `tokens` tokens as a capture keeps it (`learner.runtime.moe.Routing`):
    int64 top-k experts and a float32 router entropy, every sparse layer. The router logits
    (4 x experts bytes a token a layer) are reduced in the hook and never kept."""
    if not routes_recorded(shape):
        return 0.0
    moe = shape.moe
    assert moe is not None
    return tokens * moe.sparse_layers * (INDEX_BYTES * moe.active + ROUTER_ENTROPY_BYTES)


def routing_record(shape: ModelShape, setup: LearnerSetup) -> float:
    """One record of the step batch's routing, every token of every row: pi_old's (`old`, kept
    from the start of the step to the `moe/*` metrics) or the routing forward's (`new`)."""
    return routing_bytes(shape, setup.step_rows * setup.seq_len)


def selected_experts(shape: ModelShape, setup: LearnerSetup) -> float:
    """`moe.load_imbalance_per_layer`'s copy of pi_old's experts at the positions that score a
    response token (`indices[:, mask]`, on the device until it is counted on the host), at
    most every token's: the planner does not know the response share of a row."""
    if not routes_recorded(shape):
        return 0.0
    moe = shape.moe
    assert moe is not None
    return setup.step_rows * setup.seq_len * moe.sparse_layers * INDEX_BYTES * moe.active


# --- the estimate ----------------------------------------------------------------------


def scoring_passes(
    shape: ModelShape, setup: LearnerSetup, state: Phase
) -> dict[ScoringPass, Phase]:
    """Each pass without gradient that the step runs, at its peak, on `state`. Every one runs
    in micro-batches of `setup.scoring_rows` rows (the whole batch without a budget):

    - `micro`: pi_old (dense policy), the reference and the critic's old values; a Qwen MoE
      policy runs it only for a reference or a critic, with pi_old's routing record kept (a
      critic has no logits);
    - `moe_pi_old` (Qwen MoE): pi_old with its routing captured part by part;
    - `moe_routing` (Qwen MoE): the `moe/*` routing forward after the updates, logits of
      `MOE_METRICS_LOGITS_TO_KEEP` position a row, beside pi_old's record.

    The routing of a part (`_routing_moments`) is kept layer by layer during its forward and
    stacked once it returns, while the forward's activations are gone. With a budget each
    stacked part is written into the batch's record (`moe.blank_routing` and `moe.place`), made
    after the first part; without one, the one part's stacked capture is the record, so it is
    briefly there twice. Each MoE pass is the larger of its moments.
    """
    base = replace(state, gathered=gathered_units(shape, setup, backward=False))
    chunked = setup.logprob_chunk_tokens is not None
    rows = setup.scoring_rows
    tokens = rows * setup.seq_len
    record = routing_record(shape, setup)
    routed = routes_recorded(shape)
    passes: dict[ScoringPass, Phase] = {}
    if not routed or setup.reference or setup.critic:
        scores = not routed or setup.reference  # a policy's log-probs, not only values
        passes["micro"] = replace(
            base,
            activations=scoring_activations(shape, setup, rows, hidden_copy=chunked),
            logits=logit_bytes(shape, setup, tokens, chunked=True) if scores else 0,
            routing=record,
        )
    if routed:
        forward, stacked = _routing_moments(shape, setup)
        pi_old = replace(
            base,
            activations=scoring_activations(shape, setup, rows, hidden_copy=chunked, captured=True),
            logits=logit_bytes(shape, setup, tokens, chunked=True),
            routing=forward,
        )
        passes["moe_pi_old"] = _largest(pi_old, replace(base, routing=stacked))
        routing = replace(
            base,
            activations=scoring_activations(shape, setup, rows, hidden_copy=False, captured=True),
            logits=rows * MOE_METRICS_LOGITS_TO_KEEP * shape.vocab * setup.compute_bytes,
            routing=record + forward,
        )
        # `moe.routing_metrics` on both records: load imbalance copies pi_old's chosen experts.
        metrics = replace(base, routing=2 * record + selected_experts(shape, setup))
        passes["moe_routing"] = _largest(routing, replace(base, routing=record + stacked), metrics)
    return passes


def _routing_moments(shape: ModelShape, setup: LearnerSetup) -> tuple[float, float]:
    """Routing bytes of one capture pass (`moe._PartCaptures`): (during a part's forward, when
    it is stacked). During a forward the recorder holds the part's layers so far (at most all
    of them) and, with a budget, the batch's record the earlier parts were placed into; once
    the forward returns, `RoutingRecorder.routing` stacks the layers into a second copy of the
    part, placed into the batch's record (with a budget) or kept as the record (without)."""
    capture = routing_bytes(shape, setup.scoring_rows * setup.seq_len)
    placed = routing_record(shape, setup) if setup.micro_batch_tokens is not None else 0.0
    return placed + capture, placed + 2 * capture


def _largest(*phases: Phase) -> Phase:
    return max(phases, key=lambda phase: phase.total)  # the first of equals


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
    name = max(passes, key=lambda key: passes[key].total)  # the first of equals
    return MemoryEstimate(update=update, scoring=passes[name], host=host, scoring_pass=name)
