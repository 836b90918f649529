"""Per-token log-probabilities and entropies of a causal LM on collated rollouts.

Tokens are scored under the *sampling* distribution (`learner.algorithms.sampling_dist`: logits / T,
then top-k and top-p), the one the generator sampled from and whose log-probs it stored as behaviour
log-probs, so identical weights give ratio 1 at any temperature and nucleus. Every learner
log-prob pass (pi_old recompute, the current policy in the loss, the reference) goes through here.

Position convention (shared with `buffer.schema.collate`): `input_ids[b, p]` is token p of the
sequence prompt + response; the model's logits at position p - 1 predict token p, so the logprob of
token p is read from logits[:, p - 1]. Outputs are aligned with `input_ids`: position 0 (never a
response token) holds 0. Logits are materialised once, in float32, and only response positions
matter to the caller (the response mask zeroes the rest).

Passes that only score (no gradient) run inside `scoring(...)`: eval mode and no_grad, so a module
with dropout (or any other train-time randomness) scores deterministically; each module's mode is
restored afterwards, so gradient passes run in train mode.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn

from learner.algorithms.sampling_dist import (
    LOGPROB_FLOOR,
    PLAIN,
    SamplingSettings,
    processed_logprobs,
)


def token_logprobs_from_logits(
    logits: Tensor, input_ids: Tensor, sampling: SamplingSettings = PLAIN
) -> tuple[Tensor, Tensor]:
    """(logprobs, entropy), each [B, L], aligned with input_ids (position 0 is 0).

    Both are of the sampling distribution. A token outside its top-k / top-p set (log-prob -inf)
    is floored at `LOGPROB_FLOOR` with zero gradient (see there); entropy counts kept tokens only.
    """
    log_probs = processed_logprobs(logits[:, :-1], sampling)  # (B, L-1, V) predicts 1..L-1
    targets = input_ids[:, 1:].unsqueeze(-1)  # (B, L-1, 1)
    chosen = log_probs.gather(-1, targets).squeeze(-1)  # (B, L-1), may be -inf
    # clamp_min has zero gradient below the floor, so a -inf never reaches the graph as a NaN.
    chosen = chosen.clamp_min(LOGPROB_FLOOR)
    entropy = _entropy(log_probs.detach())  # (B, L-1)
    pad = chosen.new_zeros(chosen.shape[0], 1)  # (B, 1)
    return torch.cat([pad, chosen], dim=1), torch.cat([pad, entropy], dim=1)


def _entropy(log_probs: Tensor) -> Tensor:
    """-sum_v p_v log p_v over the last dim; tokens with p = 0 (log p = -inf) add 0, not NaN."""
    kept = torch.isfinite(log_probs)
    terms = torch.where(kept, log_probs.exp() * log_probs, 0.0)
    return -terms.sum(-1)


def policy_logprobs(
    model: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    sampling: SamplingSettings = PLAIN,
) -> tuple[Tensor, Tensor]:
    """Forward the policy and return (logprobs, entropy) aligned with input_ids, both [B, L]."""
    out = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
    return token_logprobs_from_logits(out.logits, input_ids, sampling)


@contextmanager
def scoring(*modules: nn.Module | None) -> Iterator[None]:
    """no_grad with every given module in eval mode; each module's own mode is restored after.

    For passes that are not gradient passes (pi_old, reference, old values, diagnostics): eval
    mode turns off dropout and similar train-time noise, so the score is the policy's. None
    entries are skipped (an absent reference or critic).
    """
    present = [module for module in modules if module is not None]
    # Per submodule, so a part that was deliberately in another mode gets that mode back.
    modes = [(sub, sub.training) for module in present for sub in module.modules()]
    for module in present:
        module.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        for sub, was_training in modes:
            sub.training = was_training
