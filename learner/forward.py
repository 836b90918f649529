"""Per-token log-probabilities and entropies of a causal LM on collated rollouts.

Position convention (shared with `buffer.schema.collate`): `input_ids[b, p]` is token p of the
sequence prompt + response; the model's logits at position p - 1 predict token p, so the logprob of
token p is read from logits[:, p - 1]. Outputs are aligned with `input_ids`: position 0 (never a
response token) holds 0. Logits are materialised once, in float32, and only response positions
matter to the caller (the response mask zeroes the rest).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def token_logprobs_from_logits(logits: Tensor, input_ids: Tensor) -> tuple[Tensor, Tensor]:
    """(logprobs, entropy), each [B, L], aligned with input_ids (position 0 is 0)."""
    logits = logits[:, :-1].float()  # (B, L-1, V) predicts tokens 1..L-1
    log_probs = F.log_softmax(logits, dim=-1)  # (B, L-1, V)
    targets = input_ids[:, 1:].unsqueeze(-1)  # (B, L-1, 1)
    chosen = log_probs.gather(-1, targets).squeeze(-1)  # (B, L-1)
    entropy = -(log_probs.exp() * log_probs).sum(-1)  # (B, L-1)
    pad = chosen.new_zeros(chosen.shape[0], 1)  # (B, 1)
    return torch.cat([pad, chosen], dim=1), torch.cat([pad, entropy.detach()], dim=1)


def policy_logprobs(
    model: nn.Module, input_ids: Tensor, attention_mask: Tensor
) -> tuple[Tensor, Tensor]:
    """Forward the policy and return (logprobs, entropy) aligned with input_ids, both [B, L]."""
    out = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
    return token_logprobs_from_logits(out.logits, input_ids)
