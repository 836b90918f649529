"""The sampled distribution, written once: temperature, then top-p, then renormalise.

Behaviour log-probs are log-probs of this distribution (design sections 4 and 6), so the torch
backend samples from it, the learner can recompute pi_old under it, and tests compare vLLM's
`processed_logprobs` against it. The top-p rule follows vLLM's (`apply_top_k_top_p_pytorch`): sort
ascending, drop tokens whose cumulative probability is <= 1 - top_p, always keep the most likely.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from harness.generators.base import GenRequest, GenResult


def sampling_logits(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """Float32 logits of the sampled distribution: tokens outside the nucleus get -inf."""
    scaled = logits.float() / temperature  # (..., V)
    if top_p >= 1.0:
        return scaled
    ascending, order = scaled.sort(dim=-1)
    cumulative = ascending.softmax(dim=-1).cumsum(dim=-1)  # (..., V), last entry = 1
    drop = cumulative <= 1.0 - top_p
    drop[..., -1] = False  # the most likely token always stays
    ascending = ascending.masked_fill(drop, float("-inf"))
    return torch.empty_like(scaled).scatter_(-1, order, ascending)


def sampling_logprobs(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """Log-probs of the sampled distribution, float32, -inf outside the nucleus."""
    return sampling_logits(logits, temperature, top_p).log_softmax(dim=-1)


@torch.no_grad()
def recompute_logprobs(
    model: nn.Module,
    prompt_ids: Sequence[int],
    response_ids: Sequence[int],
    temperature: float,
    top_p: float,
) -> torch.Tensor:
    """Behaviour log-probs of one response by a plain full-sequence forward (no cache, no batch)."""
    device = next(model.parameters()).device
    ids = torch.tensor([[*prompt_ids, *response_ids]], device=device)  # (1, P + R)
    logits = model(ids).logits[0, len(prompt_ids) - 1 : -1]  # (R, V): position t predicts t + 1
    targets = ids[0, len(prompt_ids) :, None]  # (R, 1)
    return sampling_logprobs(logits, temperature, top_p).gather(-1, targets)[:, 0].cpu()


def max_logprob_gap(
    model: nn.Module,
    requests: Sequence[GenRequest],
    results: Sequence[GenResult],
    temperature: float,
    top_p: float,
) -> float:
    """Largest |generator logprob - recomputed logprob| over every response token of a batch.

    The engine-mismatch check of design section 6 in its bluntest form: with equal weights and
    float32 on both sides it should be about 1e-5.
    """
    worst = 0.0
    for request, result in zip(requests, results, strict=True):
        for ids, logprobs in zip(result.response_ids, result.behavior_logprobs, strict=True):
            expected = recompute_logprobs(model, request.prompt_ids, ids, temperature, top_p)
            gap = (torch.tensor(logprobs, dtype=torch.float32) - expected).abs().max().item()
            worst = max(worst, gap)
    return worst
