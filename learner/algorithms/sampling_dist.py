"""The sampling distribution, written once for the generators and the learner.

Behaviour log-probs are log-probs of the distribution the generator actually sampled from (design
sections 4 and 6), so the learner must score tokens under that same distribution or identical
weights give ratios != 1 (at T = 0.7, top-p = 0.9 the plain softmax put token ratios in
[0.74, 1.49]). This module is that distribution, as one pure function of the logits, imported by
the torch generator (`harness.generators`) and by the learner (`learner.runtime.forward`); the vLLM
generator asks its engine for the same thing (`logprobs_mode="processed_logprobs"`).

Order and semantics follow vLLM 0.32's sampler (`vllm/v1/sample/sampler.py`, `Sampler.sample`, and
`ops/topk_topp_sampler.py`, `apply_top_k_top_p_pytorch`), which the torch generator reproduces:
1. logits in float32, divided by the temperature;
2. top-k: keep the tokens whose scaled logit is >= the k-th largest (ties at the k-th value are
   all kept);
3. top-p on what top-k kept: sort ascending, softmax, cumulative sum; drop every token whose
   cumulative probability is <= 1 - top_p (computed in float32, as vLLM does), always keeping the
   most likely token;
4. dropped tokens get logit -inf; log_softmax renormalises over the kept ones.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from learner.algorithms.sampling_settings import (
    MAX_TEMPERATURE,
    MIN_TEMPERATURE,
    PLAIN,
    SamplingSettings,
)

__all__ = [
    "LOGPROB_FLOOR",
    "MAX_TEMPERATURE",
    "MIN_TEMPERATURE",
    "PLAIN",
    "SamplingSettings",
    "processed_logits",
    "processed_logprobs",
]

# Rounded to float32, so a floored float32 log-prob equals it exactly.
LOGPROB_FLOOR = float(torch.tensor(math.log(torch.finfo(torch.float32).tiny), dtype=torch.float32))
"""-87.34 = log of the smallest normal float32: the learner's stand-in for log 0.

A token outside the learner's nucleus has log-prob -inf under the sampling distribution. The
generator only samples inside its own nucleus, but after a weight update (or from last-ulp
differences between engines at the nucleus edge) the learner's nucleus may exclude it; -inf
would then make -inf - (-inf) = NaN ratios and NaN gradients. `learner.runtime.forward` floors token
log-probs here instead: the ratio exp(floor - old) is ~0 (every log-ratio is clamped to +-20
downstream, `learner.algorithms.kl.LOG_RATIO_CLAMP`), so such a token contributes no gradient, which
is also the exact gradient of the truncated distribution (its probability is 0 on a neighbourhood of
the weights); two floored log-probs give ratio 1.
"""


def processed_logits(logits: Tensor, sampling: SamplingSettings) -> Tensor:
    """Float32 logits (..., V) of the sampling distribution: -inf outside top-k and top-p.

    Differentiable in the kept entries; the keep/drop mask is piecewise constant in the logits,
    so it is computed without a graph.
    """
    scaled = logits.float() / sampling.temperature  # (..., V)
    if not sampling.truncates:
        return scaled
    with torch.no_grad():
        drop = _dropped(scaled.detach(), sampling)  # (..., V) bool
    return scaled.masked_fill(drop, float("-inf"))


def processed_logprobs(logits: Tensor, sampling: SamplingSettings) -> Tensor:
    """Log-probs (..., V) of the sampling distribution, float32, -inf outside the kept set."""
    return processed_logits(logits, sampling).log_softmax(dim=-1)


def _dropped(scaled: Tensor, sampling: SamplingSettings) -> Tensor:
    """Tokens top-k then top-p remove, as vLLM's `apply_top_k_top_p_pytorch` decides."""
    vocab = scaled.shape[-1]
    top_k = sampling.top_k if 0 < sampling.top_k < vocab else 0
    if sampling.top_p >= 1.0:  # top-k only (vLLM's `apply_top_k_only`: no sort)
        if top_k == 0:
            return torch.zeros_like(scaled, dtype=torch.bool)
        kth = scaled.topk(top_k, dim=-1).values[..., -1:]  # (..., 1)
        return scaled < kth
    ascending, order = scaled.sort(dim=-1)  # (..., V)
    if top_k:
        kth = ascending[..., vocab - top_k : vocab - top_k + 1]  # (..., 1) k-th largest
        ascending = ascending.masked_fill(ascending < kth, float("-inf"))
    cumulative = ascending.softmax(dim=-1).cumsum(dim=-1)  # (..., V), last entry ~1
    # 1 - p in float32, exactly as vLLM compares (its p is a float32 tensor).
    threshold = 1.0 - torch.tensor(sampling.top_p, dtype=torch.float32, device=scaled.device)
    drop_sorted = (cumulative <= threshold) | (ascending == float("-inf"))
    drop_sorted[..., -1] = False  # the most likely token always stays
    return torch.zeros_like(drop_sorted).scatter_(-1, order, drop_sorted)
