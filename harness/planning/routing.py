"""Bytes of an MoE policy's routing as the learner keeps it (`learner.runtime.moe`,
`learner.runtime.moe.record`): each token's top-k experts in the smallest integer type and its
router entropy, every sparse layer, never the router logits. Pure functions of a shape and a
setup; `memory.scoring_passes` and `memory.update_moments` put them on the device one
micro-batch at a time, `harness plan` states pi_old's whole record (host memory)."""

from __future__ import annotations

from harness.planning.architecture import ModelShape
from harness.planning.setup import F32, LearnerSetup

ROUTED_MODEL_TYPES = frozenset({"qwen2_moe", "qwen3_moe"})
"""Model types whose routers `learner.runtime.moe.hooks.ROUTER_TYPES` hooks: for them every step
records the batch's routing and runs the `moe/*` routing forward."""
ROUTER_ENTROPY_BYTES = F32
"""What a routing capture keeps of a token's router logits in a sparse layer: their entropy in
float32 (`learner.runtime.moe.hooks.RoutingRecorder.record`), beside the top-k experts
(`expert_index_bytes` each)."""


def routes_recorded(shape: ModelShape) -> bool:
    return shape.moe is not None and shape.model_type in ROUTED_MODEL_TYPES


def expert_index_bytes(experts: int) -> int:
    """Bytes of one recorded expert choice (`learner.runtime.moe.hooks.index_dtype`): 1 up to
    256 experts (uint8), 2 up to 32,768 (int16), else 4."""
    return 1 if experts <= 2**8 else (2 if experts <= 2**15 else 4)


def routing_bytes(shape: ModelShape, tokens: int, *, entropy: bool = True) -> float:
    """The routing of `tokens` tokens as a capture keeps it
    (`learner.runtime.moe.hooks.RoutingRecord`): top-k experts (`expert_index_bytes` each) and,
    with `entropy`, a float32 router entropy, every sparse layer. The router logits (4 x experts
    bytes a token a layer) are reduced in the hook and never kept."""
    if not routes_recorded(shape):
        return 0.0
    moe = shape.moe
    assert moe is not None
    per_layer = expert_index_bytes(moe.experts) * moe.active
    per_layer += ROUTER_ENTROPY_BYTES if entropy else 0
    return tokens * moe.sparse_layers * per_layer


def routing_record(shape: ModelShape, setup: LearnerSetup) -> float:
    """pi_old's record of the step batch's routing, every token of every row, kept in host
    memory from the start of the step to the `moe/*` metrics (`learner.runtime.moe.record`):
    not on the device, so no phase counts it; `harness plan` states its size."""
    return routing_bytes(shape, setup.step_rows * setup.seq_len)
