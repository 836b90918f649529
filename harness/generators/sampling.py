"""Checks that a generator's behaviour log-probs are the learner's log-probs of the same weights.

The sampled distribution itself (temperature, top-k, top-p) is defined once in
`learner.algorithms.sampling_dist`: the torch backend samples from it, vLLM's `processed_logprobs`
are of it, and the learner scores under it. This module recomputes behaviour log-probs with the
learner's own scoring pass (`learner.scoring.policy_logprobs`), so a passing check means
identical weights give ratio 1 in training, not merely that two samplers agree.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from harness.generators.base import GenRequest, GenResult
from learner.algorithms.sampling_dist import SamplingSettings
from learner.scoring import policy_logprobs, scoring


def recompute_logprobs(
    model: nn.Module,
    prompt_ids: Sequence[int],
    response_ids: Sequence[int],
    sampling: SamplingSettings,
) -> torch.Tensor:
    """Log-probs [R] of one response as the learner scores it (full-sequence forward, no cache)."""
    device = next(model.parameters()).device
    ids = torch.tensor([[*prompt_ids, *response_ids]], device=device)  # (1, P + R)
    with scoring(model):
        logprobs, _ = policy_logprobs(model, ids, torch.ones_like(ids), sampling)  # (1, P + R)
    return logprobs[0, len(prompt_ids) :].cpu()


def max_logprob_gap(
    model: nn.Module,
    requests: Sequence[GenRequest],
    results: Sequence[GenResult],
    sampling: SamplingSettings,
) -> float:
    """Largest |generator logprob - recomputed logprob| over every response token of a batch.

    The engine-mismatch check of design section 6 in its bluntest form: with equal weights and
    float32 on both sides it should be about 1e-5.
    """
    worst = 0.0
    for request, result in zip(requests, results, strict=True):
        for ids, logprobs in zip(result.response_ids, result.behavior_logprobs, strict=True):
            expected = recompute_logprobs(model, request.prompt_ids, ids, sampling)
            gap = (torch.tensor(logprobs, dtype=torch.float32) - expected).abs().max().item()
            worst = max(worst, gap)
    return worst
