"""Bytes per GPU (learner rank) of one learner step: pure functions of a shape and a setup.

A step has two peaks (`learner.runtime.step.train_on_batch`), and the estimate is the larger:

- **scoring**: the forwards without a gradient, on every rank over the *whole step batch*
  (each rank scores every row), in micro-batches of `learner.micro_batch_tokens`
  (`step._score`'s `every_row` parts; the whole batch in one forward when it is unset), their
  logits bounded by `learner.logprob_chunk_tokens`: pi_old, the reference and the critic's old
  values. A Qwen MoE policy (`routing.ROUTED_MODEL_TYPES`) captures its routing around each of
  pi_old's parts (`learner.runtime.moe.routing.StepRouting.capture_old`) and, after the updates,
  runs the forwards of the `moe/*` metrics in the same parts (`StepRouting._log_ratios`): each part
  scored with its routing captured, then on pi_old's experts, their logits bounded by
  `learner.logprob_chunk_tokens` as pi_old's are (`learner.runtime.moe.logratio`: routing's
  share of the log-ratio's variance). pi_old's record of the batch (`routing.routing_record`:
  each token's experts and router entropy, every sparse layer; never the router logits, which the
  capture's hook reduces at once) is kept in host memory (`learner.runtime.moe.record`), and
  the metrics compare each part with its slice of it (`moe.RoutingTally`). So a routing pass
  holds one micro-batch's activations and routing on the device, as a dense pass holds its
  activations. The scoring column is the largest of these passes (`scoring_passes`).
- **update**: one micro-batch's forward and backward (the whole rank share of a minibatch when
  `learner.micro_batch_tokens` is unset), with the activations autograd saves for backward,
  and an MoE policy's pi_old experts of that micro-batch, moved to the device for replay
  (`routing_replay: old`), then AdamW's step: the largest of its moments (`update_moments`).

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
the root (final norm and head, and the embedding when it is tied to the head), which FSDP2
keeps gathered from forward to backward, plus the current and the prefetched unit (decoder
blocks; an untied model's input embedding is a unit of its own, gathered for its forward and
its backward only); backward adds a unit's unsharded gradient and its float32 reduce-scatter
copy. Every micro-batch's backward reduce-scatters (`learner.runtime.update._local_grads`
leaves FSDP's gradient sync on), so only the sharded gradient lasts from one micro-batch to the
next. `cpu_offload` moves the shards to host memory.

Activations, per token and decoder block, are the tensors autograd saves (the accounting of
Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models",
sec. 4, redone for transformers' RMSNorm, GQA with SDPA and SwiGLU): see
`activations.block_saved`. The log-prob copies are counted from `learner.runtime.forward` and
`learner.algorithms.sampling_dist` (`logits.logit_bytes`).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Literal

from harness.planning.activations import scoring_activations, update_activations
from harness.planning.architecture import ModelShape
from harness.planning.logits import logit_bytes
from harness.planning.routing import routes_recorded, routing_bytes
from harness.planning.setup import ADAM_MOMENT_BYTES, F32, LearnerSetup


@dataclass(frozen=True)
class Phase:
    """Bytes per GPU at one of a step's two peaks, by component."""

    parameters: float = 0.0
    gradients: float = 0.0
    optimizer: float = 0.0
    gathered: float = 0.0  # FSDP units gathered for compute (and their unsharded gradients)
    activations: float = 0.0  # saved for backward (update) or one block's working set (scoring)
    logits: float = 0.0  # model logits and their float32 log-prob copies
    routing: float = 0.0  # MoE routing on the device: one micro-batch's capture or slice
    step: float = 0.0  # AdamW's step: the temporaries of its implementation

    @property
    def total(self) -> float:
        return sum(getattr(self, f.name) for f in fields(self))

    def largest(self) -> tuple[str, float]:
        return max(((f.name, getattr(self, f.name)) for f in fields(self)), key=lambda x: x[1])


ScoringPass = Literal["micro", "moe_pi_old", "moe_routing"]
"""The pass without gradient whose peak is the scoring column (`scoring_passes`)."""
UpdateMoment = Literal["backward", "log_probs", "optimizer_step"]
"""The moment of the update whose peak is the update column (`update_moments`)."""


@dataclass(frozen=True)
class MemoryEstimate:
    update: Phase
    scoring: Phase
    host: float  # bytes of host memory per rank that cpu_offload moves there
    scoring_pass: ScoringPass = "micro"  # which no-grad pass `scoring` is
    update_moment: UpdateMoment = "backward"  # which moment of the update `update` is

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
    buckets = gradient_copies(setup)
    state = Phase(
        parameters=F32 * (trained + frozen) / shards,  # float32: the master weights under bf16
        gradients=buckets * F32 * trained / shards,
        optimizer=ADAM_MOMENT_BYTES * trained / shards,
    )
    if setup.cpu_offload:
        return Phase(), state.total
    return state, 0.0


def gradient_copies(setup: LearnerSetup) -> int:
    """Float32 gradients a rank keeps per trained parameter: 2 under DDP at 2+ ranks (the
    gradients and DDP's flat buckets, `gradient_as_bucket_view=False`), else 1."""
    return 2 if setup.parallel == "ddp" and setup.gpus > 1 else 1


def fsdp_units(shape: ModelShape) -> tuple[int, int]:
    """(the FSDP root's parameters, the input embedding unit's) of `learner.runtime.sharding
    .shard`: the root holds the final norm and the output head, and the embedding too when it
    is tied to the head (then there is no embedding unit, 0); untied, the embedding is a unit
    of its own."""
    embedding = shape.vocab * shape.hidden
    if shape.tied_embeddings:
        return shape.root_parameters(), 0
    return shape.root_parameters() - embedding, embedding


def gathered_units(shape: ModelShape, setup: LearnerSetup, *, backward: bool) -> float:
    """FSDP: the root (`fsdp_units`) and two more units gathered in the compute dtype: two
    blocks, or the embedding unit and the first block. In backward, the root's unsharded
    gradient (compute dtype) as well, held from the head's backward, the first, to the end:
    the root's inputs (token ids) take no gradient, so FSDP2 reduce-scatters it only in its
    final callback; beside it, the unit in backward's unsharded gradient and its float32
    reduce-scatter input; at the end, the root's own float32 copy."""
    if setup.parallel != "fsdp":
        return 0.0
    b, block = setup.compute_bytes, shape.largest_block()
    root, embedding = fsdp_units(shape)
    gathered = b * (root + max(2 * block, embedding + block))
    if not backward:
        return gathered
    return gathered + max(b * root + (b + F32) * max(embedding, block), (b + F32) * root)


# --- the estimate ----------------------------------------------------------------------


def scoring_passes(
    shape: ModelShape, setup: LearnerSetup, state: Phase
) -> dict[ScoringPass, Phase]:
    """Each pass without gradient that the step runs, at its peak, on `state`. Every one runs
    in micro-batches of `setup.scoring_rows` rows (the whole batch without a budget):

    - `micro`: pi_old (dense policy), the reference and the critic's old values; a Qwen MoE
      policy runs it only for a reference or a critic (a critic has no logits);
    - `moe_pi_old` (Qwen MoE): pi_old with its routing captured part by part;
    - `moe_routing` (Qwen MoE): the `moe/*` forwards after the updates, per part: scored with
      its routing captured (pi_old's moment), then scored again on pi_old's experts (its
      slice moved to the device, beside the part's own experts and free log-probs; the
      replay hook's float32 copies are counted as the capture's, which are no fewer), then
      the part's experts compared with that slice.

    pi_old's record of the batch is in host memory, so the device holds routing of one part at
    a time (`_routing_moments`). Each MoE pass is the larger of its moments; the metrics' last
    moment, the router entropy's masked mean over the batch one layer at a time, holds a
    layer's float32 entropies and their `where` copy beside the step's float32 mask.
    """
    base = replace(state, gathered=gathered_units(shape, setup, backward=False))
    chunked = setup.logprob_chunk_tokens is not None
    rows = setup.scoring_rows
    tokens = rows * setup.seq_len
    routed = routes_recorded(shape)
    passes: dict[ScoringPass, Phase] = {}
    if not routed or setup.reference or setup.critic:
        scores = not routed or setup.reference  # a policy's log-probs, not only values
        passes["micro"] = replace(
            base,
            activations=scoring_activations(shape, setup, rows, hidden_copy=chunked),
            logits=logit_bytes(shape, setup, tokens, chunked=True) if scores else 0,
        )
    if routed:
        forward, stacked, compared = _routing_moments(shape, setup)
        pi_old = replace(
            base,
            activations=scoring_activations(shape, setup, rows, hidden_copy=chunked, captured=True),
            logits=logit_bytes(shape, setup, tokens, chunked=True),
            routing=forward,
        )
        passes["moe_pi_old"] = _largest(pi_old, replace(base, routing=stacked))
        replayed = replace(
            pi_old, logits=pi_old.logits + F32 * tokens, routing=2 * _part_experts(shape, setup)
        )
        entropy = replace(base, routing=3 * F32 * setup.step_rows * setup.seq_len)
        passes["moe_routing"] = _largest(pi_old, replayed, replace(base, routing=compared), entropy)
    return passes


def _routing_moments(shape: ModelShape, setup: LearnerSetup) -> tuple[float, float, float]:
    """Device routing bytes of one part's capture (`moe.record.PartCaptures`,
    `StepRouting._own_experts`): (during its forward, when it is stacked, when the metrics
    compare it). During a forward the recorder holds the part's layers so far (at most all of
    them); once the forward returns, `RoutingRecorder.routing` stacks them into a second copy
    of the part before it goes to the host record. The metrics' pass stacks only the experts
    (`RoutingRecorder.indices`) and then compares them with the part's slice of pi_old's
    experts, moved to the device (`moe.RoutingTally.add`)."""
    part = setup.scoring_rows * setup.seq_len
    capture, experts = routing_bytes(shape, part), _part_experts(shape, setup)
    return capture, 2 * capture, max(capture + experts, 2 * experts)


def _part_experts(shape: ModelShape, setup: LearnerSetup) -> float:
    """One part's experts alone (`RoutingRecorder.indices`, or its slice of pi_old's record)."""
    return routing_bytes(shape, setup.scoring_rows * setup.seq_len, entropy=False)


def _largest(*phases: Phase) -> Phase:
    return max(phases, key=lambda phase: phase.total)  # the first of equals


def optimizer_step_bytes(shape: ModelShape, setup: LearnerSetup) -> float:
    """The temporaries of the policy's AdamW step on the device (`learner.optimizer_impl`;
    the critic's optimizer steps after it, with fewer parameters). `foreach` takes the square
    root of every exp_avg_sq at once (`torch._foreach_sqrt`, in place from there on): a
    float32 copy of the rank's parameters, 4 bytes each (measured on an H200: 11,882 MiB for
    a 3.1B-parameter rank, the step's peak). `for_loop` makes that root and its quotient one
    tensor at a time: two copies of the largest tensor. `fused` makes none. With cpu_offload
    the step runs on the host."""
    if setup.cpu_offload or setup.optimizer_impl == "fused":
        return 0.0
    shards = setup.gpus if setup.parallel == "fsdp" else 1
    if setup.optimizer_impl == "foreach":
        return F32 * shape.parameters() / shards
    return 2 * F32 * shape.largest_tensor() / shards


def update_moments(
    shape: ModelShape, setup: LearnerSetup, state: Phase
) -> dict[UpdateMoment, Phase]:
    """The update's three moments, each on what persists then (`state`): its parts peak at
    different times, so the update's peak is the largest moment, not the sum of each part's
    own peak (a GPU trace of a 30B-A3B-wide update shows no logits alive at its peak, during
    a block's backward).

    - `backward`: a decoder block's backward, late in the micro-batch: gathered units with
      the unit's and the root's unsharded gradients and a reduce-scatter input, the saved
      activations with one block's working set, the micro-batch's slice of pi_old's experts
      for routing replay; the logits are gone (freed once their backward ran).
    - `log_probs`: the log-prob pass and its backward through the log-softmax and head, at the
      start: the forward's gathered units and the root's unsharded gradient, the activations
      saved for backward (no block in backward yet), the logits at their peak. In an update
      of one micro-batch the gradients of the last update are freed by then
      (`zero_grad(set_to_none=True)` as it starts; DDP's buckets stay), and only the head's
      gradient has been made.
    - `optimizer_step`: AdamW's step, after the backwards (`optimizer_step_bytes`).
    """
    micro_tokens = setup.micro_rows * setup.seq_len
    routing = routing_bytes(shape, micro_tokens, entropy=False)  # replay's slice of pi_old's
    backward = replace(
        state,
        gathered=gathered_units(shape, setup, backward=True),
        activations=update_activations(shape, setup),
        routing=routing,
    )
    b, root = setup.compute_bytes, fsdp_units(shape)[0]
    gradients, root_gradient = state.gradients, 0.0
    if setup.parallel == "fsdp":
        root_gradient = b * root
        if setup.micro_batches == 1:
            gradients = 0.0
    elif setup.micro_batches == 1:  # DDP: the buckets stay, the head's gradient is made
        copies = gradient_copies(setup)
        gradients = state.gradients * (copies - 1) / copies + F32 * shape.vocab * shape.hidden
    log_probs = replace(
        state,
        gradients=gradients,
        gathered=gathered_units(shape, setup, backward=False) + root_gradient,
        activations=update_activations(shape, setup, working_set=False),
        logits=logit_bytes(shape, setup, micro_tokens, chunked=True, backward=True),
        routing=routing,
    )
    optimizer_step = replace(state, step=optimizer_step_bytes(shape, setup))
    return {"backward": backward, "log_probs": log_probs, "optimizer_step": optimizer_step}


def estimate(shape: ModelShape, setup: LearnerSetup) -> MemoryEstimate:
    """Both peaks of a step on one rank (module docstring)."""
    state, host = persistent(shape, setup)
    moments = update_moments(shape, setup, state)
    moment = max(moments, key=lambda key: moments[key].total)  # the first of equals
    passes = scoring_passes(shape, setup, state)
    name = max(passes, key=lambda key: passes[key].total)  # the first of equals
    return MemoryEstimate(
        update=moments[moment],
        scoring=passes[name],
        host=host,
        scoring_pass=name,
        update_moment=moment,
    )
