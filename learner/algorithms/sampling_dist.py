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
On CPU, step 3 reaches vLLM's bits without its sort with indices (`_dropped_by_value`).
"""

from __future__ import annotations

import math

import numpy as np
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
    # 1 - p in float32, exactly as vLLM compares (its p is a float32 tensor).
    threshold = 1.0 - torch.tensor(sampling.top_p, dtype=torch.float32, device=scaled.device)
    if _sorts_on_host(scaled):
        return _dropped_by_value(scaled, top_k, threshold)
    return _dropped_by_sort(scaled, top_k, threshold)


def _cumulative(ascending: Tensor, top_k: int) -> tuple[Tensor, Tensor]:
    """(values after top-k, their float32 cumulative softmax), each (..., V), from the ascending
    values (..., V): the numbers vLLM's nucleus is decided on. Both `_dropped` paths call this
    with the same values, so their numbers agree to the last bit."""
    vocab = ascending.shape[-1]
    if top_k:
        kth = ascending[..., vocab - top_k : vocab - top_k + 1]  # (..., 1) k-th largest
        ascending = ascending.masked_fill(ascending < kth, float("-inf"))
    return ascending, ascending.softmax(dim=-1).cumsum(dim=-1)  # cumulative's last entry ~1


def _drop_sorted(masked: Tensor, cumulative: Tensor, threshold: Tensor) -> Tensor:
    """vLLM's top-p decision in sorted space (..., V) bool, from `_cumulative`'s pair."""
    drop_sorted = (cumulative <= threshold) | (masked == float("-inf"))
    drop_sorted[..., -1] = False  # the most likely token always stays
    return drop_sorted


def _dropped_by_sort(scaled: Tensor, top_k: int, threshold: Tensor) -> Tensor:
    """vLLM's own way (..., V): sort with indices, decide in sorted space, scatter back."""
    ascending, order = scaled.sort(dim=-1)  # (..., V)
    drop_sorted = _drop_sorted(*_cumulative(ascending, top_k), threshold)  # (..., V)
    return torch.zeros_like(drop_sorted).scatter_(-1, order, drop_sorted)


def _sorts_on_host(scaled: Tensor) -> bool:
    """Whether `_dropped_by_value` applies: a non-empty contiguous float32 CPU tensor (what
    `processed_logits` makes); other devices sort fast enough, and keep vLLM's own way."""
    return (
        scaled.device.type == "cpu"
        and scaled.dtype == torch.float32
        and scaled.dim() > 0
        and scaled.numel() > 0
        and scaled.is_contiguous()
    )


def _dropped_by_value(scaled: Tensor, top_k: int, threshold: Tensor) -> Tensor:
    """`_dropped_by_sort`'s mask (..., V), bit for bit, mostly without torch's index sort.

    Why: on CPU, torch.sort with indices was the learner's largest top-p cost (at a 32k
    vocabulary some 25x slower than NumPy's SIMD sort of the values alone), and its indices
    only carry the sorted-space decision back to the vocabulary. Nothing numeric is
    approximated, so no rounding bound is needed: a row's sorted values are unique up to the
    order of equal entries, so NumPy's equal torch.sort's (+0 and -0 compare equal and may
    trade places or signs; both give x - max and exp(x - max) the same value), and
    `_cumulative` runs the same ops on them. The decision is then a prefix of the ascending
    order (`_boundary`), so the dropped tokens are those below its first kept value, found by
    a comparison instead of a scatter. Only rows where `_boundary` cannot say so take torch's
    sort order (`_scattered`): those rows alone, or all of them where they are the majority
    (bf16 logits, whose ties often straddle the boundary), to skip copying rows.

    Not taken: a top-m shortcut deciding the boundary from a cheaper cumulative sum within a
    rounding bound. The softmax divides by a float32 sum of V exponentials added in sorted
    order; without that order the sum is known only to relative (V-1)u / (1 - (V-1)u),
    u = 2^-24 (about 2e-3 at V = 32768), and that error scales every cumulative value alike.
    At top-p 0.9 it straddles the boundary on every near-uniform row (a fresh model's) and on
    about 60% of peaked ones (`benchmarks/top_p_bench.py`, bound_ambiguous), so nearly every
    row would have fallen back to the full sort.
    """
    vocab = scaled.shape[-1]
    ascending = torch.from_numpy(np.sort(scaled.detach().numpy(), axis=-1))  # (..., V)
    masked, cumulative = _cumulative(ascending, top_k)  # (..., V) each
    boundary, exact = _boundary(ascending, masked, cumulative, threshold)  # (..., 1), (...)
    redo = (~exact).reshape(-1).nonzero().squeeze(-1)  # (R,) flat indices of those rows
    if 2 * redo.numel() > exact.numel():
        drop_sorted = _drop_sorted(masked, cumulative, threshold)  # (..., V)
        del ascending, masked, cumulative  # freed before the sort's values and int64 order
        return _scattered(scaled, drop_sorted)
    drop = scaled < boundary  # (..., V)
    if redo.numel():
        redo_sorted = _drop_sorted(
            masked.reshape(-1, vocab)[redo], cumulative.reshape(-1, vocab)[redo], threshold
        )  # (R, V): those rows' decisions, from the very same numbers
        del ascending, masked, cumulative
        drop.view(-1, vocab)[redo] = _scattered(scaled.reshape(-1, vocab)[redo], redo_sorted)
    return drop


def _scattered(scaled: Tensor, drop_sorted: Tensor) -> Tensor:
    """The sorted-space decision (..., V) carried back to the vocabulary by torch.sort's order
    of `scaled` (..., V): where equal values straddle the boundary, the order decides."""
    _, order = scaled.sort(dim=-1)  # (..., V)
    return torch.zeros_like(drop_sorted).scatter_(-1, order, drop_sorted)


def _boundary(
    ascending: Tensor, masked: Tensor, cumulative: Tensor, threshold: Tensor
) -> tuple[Tensor, Tensor]:
    """(the smallest kept value (..., 1), whether `scaled < it` is the row's mask (...)).

    `_drop_sorted` is (cumulative <= threshold) | (masked == -inf), last position False. Where
    the cumulative sum never decreases (checked per row, not assumed of cumsum), both terms
    mark a prefix of the ascending order (masked is ascending too), so the drop is the prefix
    of length n = min(max(#cumulative <= threshold, #-inf), V - 1), each count a binary search.
    Its tokens are exactly those with a value below ascending[n] unless ascending[n - 1] equals
    it: equal values straddle the boundary, and which of them torch's unstable sort put below
    it is unspecified, so only its own order can say. Rows whose maximum is not finite (NaN
    sorts last; -inf is the maximum only of an all -inf row) are left to torch's order as well.
    """
    vocab = ascending.shape[-1]
    lead = ascending.shape[:-1]
    below_threshold = torch.searchsorted(
        cumulative, threshold.expand(*lead, 1).contiguous(), right=True
    )
    neg_inf = torch.searchsorted(masked, masked.new_full((*lead, 1), float("-inf")), right=True)
    first_kept = torch.maximum(below_threshold, neg_inf).clamp_max(vocab - 1)  # (..., 1)
    boundary = ascending.gather(-1, first_kept)  # (..., 1)
    below = ascending.gather(-1, (first_kept - 1).clamp_min(0))  # (..., 1)
    exact = (
        (cumulative[..., 1:] >= cumulative[..., :-1]).all(dim=-1, keepdim=True)  # NaN: False
        & ((first_kept == 0) | (below < boundary))  # no tie straddles the boundary
        & ascending[..., -1:].isfinite()  # the row's maximum
    )
    return boundary, exact.squeeze(-1)
