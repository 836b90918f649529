"""Float32 tolerances derived from the computation, for tests comparing results computed in
different orders (micro-batches against the whole minibatch, one kernel against another).

The model is the standard first-order rounding-error analysis (Higham, *Accuracy and Stability of
Numerical Algorithms*, 2nd ed., sec. 3.1 and 4.2): a float32 sum or dot product of n terms is
within gamma(n) * S of the exact one, S the sum of the terms' magnitudes, and a value computed
through a chain of such reductions (one token's forward, or its backward) is within
gamma(n) * S for n the summed lengths of the chain's reductions. Two evaluations of the same
quantity in different orders (another kernel, another grouping of the same terms) are each that
close to the exact value, so they differ by at most `reorder_tol(n, S) = 2 gamma(n) S`. These are
worst-case bounds, independent of the CPU, its vector width and the thread count (which only
choose the order), and far above what rounding does on average (~sqrt(n) u); they are still far
below what a real bug moves (a missing or doubled micro-batch changes a gradient by a whole
part's share, >= 1e-2 relative here).
"""

from __future__ import annotations

from transformers import PretrainedConfig

U32 = 2.0**-24
"""float32's unit roundoff u (round to nearest): |fl(x op y) - (x op y)| <= u |x op y|."""


TERM_SCALE = 10.0
"""A bound on the magnitude of the per-token values the learner tests' tiny models compute and
their metrics average: log-probs over a 24-token vocabulary (~log 24 = 3.2 for the dense policy,
<= 6 for the wider-initialised MoE), logits and router logits of the same scale, entropies
(<= log 24), ratios near 1, normalised advantages of groups of 4 (|A| <= 1.5), KL estimates of
those log-probs. Tests that lean on it check what they can of it (their batch's log-probs)."""


def gamma(n: int, u: float = U32) -> float:
    """gamma_n = n u / (1 - n u): the relative bound of n accumulated roundings."""
    assert n * u < 1, n
    return n * u / (1 - n * u)


def reorder_tol(n: int, scale: float) -> float:
    """How far two float32 evaluations, in any two orders, of a quantity computed through
    reductions of summed length n may differ, `scale` bounding the sum of the terms'
    magnitudes: each is within gamma(n) * scale of the exact value."""
    return 2 * gamma(n) * scale


def forward_chain(config: PretrainedConfig, width: int) -> int:
    """Summed lengths of the float32 reductions a token's log-prob goes through in a forward of
    a (tiny) Qwen2 / Qwen3-MoE model over `width` positions, i.e. the n of its first-order
    rounding bound. Per decoder layer: two RMSNorms (H each), the q/k/v projections (K = H),
    Qwen3's q/k RMSNorms (head_dim each), the attention scores (head_dim), the softmax's sum and
    the weighted sum of values (width each), the output projection (heads x head_dim), two
    residual adds; then the MLP: gate/up (H) and down (its intermediate width), or for an MoE
    layer the router (H), its softmax (experts), the top-k renormalisation (k), one expert (H,
    then its intermediate width) and the weighted sum of the k experts (k). After the layers:
    the final RMSNorm (H), the LM head (H) and the log-softmax over the vocabulary."""
    hidden, heads = config.hidden_size, config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    experts = getattr(config, "num_experts", 0) or 0
    attention = hidden + head_dim + 2 * width + heads * head_dim
    if experts:
        top_k = config.num_experts_per_tok
        attention += 2 * head_dim  # Qwen3's q_norm and k_norm
        mlp = hidden + experts + top_k + hidden + config.moe_intermediate_size + top_k
    else:
        mlp = hidden + config.intermediate_size
    layer = 2 * hidden + attention + mlp + 2
    return config.num_hidden_layers * layer + 2 * hidden + config.vocab_size


def backward_chain(config: PretrainedConfig, width: int) -> int:
    """The same count for the backward of one token's loss term down to a weight: each forward
    reduction's gradient reduces over the other side of the same product (a projection's input
    gradient over its output width, the softmax's over the positions), so per layer: the two
    RMSNorms (H each), q/k/v's input gradient ((heads + 2 kv_heads) x head_dim), Qwen3's q/k
    norms (head_dim each), scores and softmax (width each), the values' gradient (head_dim), the
    output projection's (H), residuals (2); the MLP's down (H) and gate/up (2 x intermediate), or
    an MoE layer's expert down (H), gate/up (2 x intermediate), the router's softmax (experts)
    and projection (experts). After the layers: the log-softmax (vocabulary), the LM head's
    input gradient (vocabulary) and the final RMSNorm (H)."""
    hidden, heads = config.hidden_size, config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    experts = getattr(config, "num_experts", 0) or 0
    attention = (heads + 2 * config.num_key_value_heads) * head_dim + 2 * width + head_dim
    attention += hidden
    if experts:
        attention += 2 * head_dim
        mlp = hidden + 2 * config.moe_intermediate_size + 2 * experts
    else:
        mlp = hidden + 2 * config.intermediate_size
    layer = 2 * hidden + attention + mlp + 2
    return config.num_hidden_layers * layer + 2 * config.vocab_size + hidden
