"""Activation bytes of a learner step: what autograd saves for backward per token and decoder
block (the accounting of Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
Transformer Models", sec. 4, redone for transformers' RMSNorm, GQA with SDPA and SwiGLU), and
one block's working set in a forward without gradient. Pure functions of a shape and a setup;
`memory.estimate` adds them to the step's two peaks.
"""

from __future__ import annotations

from harness.planning.architecture import ModelShape
from harness.planning.setup import F32, INDEX_BYTES, LearnerSetup


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


def backward_transient(shape: ModelShape, b: int) -> int:
    """Bytes per token of the gradients in flight inside one block's backward, beside what it
    saved: the gradients of the block's output and input (2 x hidden) and of the largest
    activation and its input (2 x the largest: a dense MLP's width, an MoE's routed experts'
    fused gate and up outputs, k x 2 x width, or the attention's queries). Measured on an H200
    (Qwen3-30B-A3B's width, a checkpointed block in backward at the update's peak): the
    recomputed block's saved tensors and these, 0.92x its saved activations together, where
    counting that block twice had said 2x."""
    sizes = [shape.heads * shape.head_dim, shape.hidden]
    if any(not sparse for sparse, _ in shape.block_kinds()):
        sizes.append(shape.intermediate)
    if shape.moe is not None:
        sizes.append(shape.moe.active * 2 * shape.moe.expert_intermediate)
    return b * (2 * shape.hidden + 2 * max(sizes))


def attention_mask_bytes(rows: int, width: int, b: int, saved_masks: int) -> float:
    """transformers' 4-D boolean padding mask [rows, 1, L, L], and SDPA's additive copy of it in
    the compute dtype, made (and kept for backward) in each of `saved_masks` blocks."""
    return rows * width * width * (1 + b * saved_masks)


def update_activations(
    shape: ModelShape, setup: LearnerSetup, *, working_set: bool = True
) -> float:
    """Saved activations of the largest micro-batch, plus, with `working_set`, one block's
    backward working set: the gradients in flight (`backward_transient`). Activation
    checkpointing keeps each block's input only, and recomputes one block at a time in
    backward: the working set is then that block's saved activations too."""
    b, rows, width = setup.compute_bytes, setup.micro_rows, setup.seq_len
    tokens = rows * width
    kinds = shape.block_kinds()
    one_block = max(block_saved(shape, b, sparse) for sparse, _ in kinds)
    transient = backward_transient(shape, b) if working_set else 0
    if setup.activation_checkpointing:
        blocks = shape.layers * b * shape.hidden + (one_block + transient if working_set else 0)
        masks = 1
    else:
        blocks = sum(count * block_saved(shape, b, sparse) for sparse, count in kinds)
        blocks += transient
        masks = shape.layers
    final = rms_saved(shape.hidden, b) + b * shape.hidden  # final norm, the head's input
    rotary = 2 * F32 * shape.head_dim  # cos and sin, shared by the blocks
    per_token = blocks + final + rotary
    return tokens * per_token + attention_mask_bytes(rows, width, b, masks)


ROUTER_HOOK_COPY_BYTES = 3 * F32
"""float32 bytes per token and expert that the routing capture's hook makes while it reduces a
router's logits to the token's entropy (`learner.runtime.moe.hooks.router_entropy`): the
log-softmax, its `exp` and their product at once (a bf16 router's float32 cast is freed before
the `exp`). The hook runs once the router has returned, so they stand in for the router's own
float32 softmax, which is freed by then."""


def scoring_block_bytes(shape: ModelShape, b: int, sparse: bool, *, captured: bool = False) -> int:
    """Bytes per token alive inside one block of a forward without gradient: the residual in
    and out, the RMSNorm's float32 temporaries and output, then the larger of attention
    (q, repeated k and v, output and its contiguous copy) and the MLP (SiLU, up, product at
    once; a sparse layer: the shared expert, the router's logits and softmax, and the
    one-hot expert mask [tokens, k, experts + 1] of int64 the expert loop builds). A forward
    whose routing is `captured` has the hook's float32 copies of the router's logits in place
    of the softmax (`ROUTER_HOOK_COPY_BYTES`)."""
    residual = 2 * b * shape.hidden + 2 * F32 * shape.hidden + b * shape.hidden
    attention = 5 * b * shape.heads * shape.head_dim
    if not sparse:
        return residual + max(attention, 3 * b * shape.intermediate)
    moe = shape.moe
    assert moe is not None
    dispatch = INDEX_BYTES * moe.active * (moe.experts + 1)
    router = (b + (ROUTER_HOOK_COPY_BYTES if captured else F32)) * moe.experts
    mlp = 3 * b * moe.shared_intermediate + router + dispatch
    return residual + max(attention, mlp)


def scoring_activations(
    shape: ModelShape,
    setup: LearnerSetup,
    rows: int,
    *,
    hidden_copy: bool,
    captured: bool = False,
) -> float:
    """A no-grad forward of `rows` rows: one block's working set (with the routing hook's
    copies when `captured`), the final hidden states (and, with `hidden_copy`, their copy at
    the scored positions that chunked log-probs make), the mask and one SDPA copy."""
    b, width = setup.compute_bytes, setup.seq_len
    block = max(
        scoring_block_bytes(shape, b, sparse, captured=captured)
        for sparse, _ in shape.block_kinds()
    )
    hidden = b * shape.hidden * (2 if hidden_copy else 1)
    per_token = block + hidden + 2 * F32 * shape.head_dim
    return rows * width * per_token + attention_mask_bytes(rows, width, b, 1)
