"""PPO's critic: the policy's backbone (a separate copy) plus a scalar head.

Why a copy of the policy backbone: the design matches arms on initial weights, so the critic starts
from the same pretrained features the policy has; a separate copy with its own optimizer keeps the
policy update identical in form to the other arms (no shared-trunk gradient interference).
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor, nn


class ValueModel(nn.Module):
    """V(s_p) for every prefix; aligned with logprobs: values[:, p] estimates the return before
    token p is generated, so it reads the hidden state at position p - 1 (position 0 holds 0)."""

    def __init__(self, policy: nn.Module) -> None:
        super().__init__()
        causal_lm = copy.deepcopy(policy)
        self.backbone = (
            causal_lm.get_decoder() if hasattr(causal_lm, "get_decoder") else causal_lm.model
        )
        hidden = causal_lm.config.hidden_size
        self.head = nn.Linear(hidden, 1)
        # Zero-initialised head: the critic starts predicting 0, so early advantages equal the
        # (whitened) returns instead of noise from a random projection.
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        hidden = self.backbone(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        # In the head's own dtype (bf16 compute under FSDP mixed precision), values in float32.
        values = self.head(hidden.to(self.head.weight.dtype)).float().squeeze(-1)  # (B, L)
        pad = values.new_zeros(values.shape[0], 1)
        return torch.cat([pad, values[:, :-1]], dim=1)  # (B, L) aligned with token positions
