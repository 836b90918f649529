"""What every policy objective starts from: the checked batch of one call, and its constants."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class PolicyBatch:
    """The checked tensors of one objective call (a whole minibatch, or a part of one: the
    objective cannot tell, and need not). Only `logprobs` carries a grad graph."""

    logprobs: Tensor  # (B, T) log pi_theta, any float dtype
    log_ratio: Tensor  # (B, T) l_t = log pi_theta - log pi_old in float32, exactly 0 off the mask
    advantages: Tensor  # (B,) or (B, T) as given, constants; each objective checks its kind
    mask: Tensor  # (B, T) bool, response tokens
    lengths: Tensor  # (B,) response lengths
    is_weights: Tensor | None = None  # (B, T) truncated IS weights, constants
    ref_logprobs: Tensor | None = None  # (B, T) reference policy, constants
    selected: Tensor | None = None  # (B, T) bool: the tokens a selecting objective acts on

    @classmethod
    def of(
        cls,
        logprobs: Tensor,
        old_logprobs: Tensor,
        advantages: Tensor,
        mask: Tensor,
        *,
        is_weights: Tensor | None = None,
        ref_logprobs: Tensor | None = None,
        selected: Tensor | None = None,
    ) -> PolicyBatch:
        """Check shapes and take l_t in float32, exactly 0 off the mask, so every later
        per-token term is 0 there and plain sums are masked sums."""
        shapes = {tuple(t.shape) for t in (logprobs, old_logprobs, mask)}
        if len(shapes) != 1 or logprobs.ndim != 2:
            raise ValueError(
                f"logprobs, old_logprobs and mask must share one [B, T] shape; got "
                f"{tuple(logprobs.shape)}, {tuple(old_logprobs.shape)}, {tuple(mask.shape)}"
            )
        mask = mask.bool()
        log_ratio = torch.where(mask, logprobs.float() - old_logprobs.detach().float(), 0.0)
        lengths = mask.sum(-1)  # (B,)
        return cls(
            logprobs, log_ratio, advantages, mask, lengths, is_weights, ref_logprobs, selected
        )


def masked_constant(x: Tensor, mask: Tensor, name: str) -> Tensor:
    """A [B] or [B, T] constant as float32 [B, T], 0 off the mask (so never counted as clipped)."""
    if x.shape == mask.shape[:1]:
        x = x[:, None]  # (B, 1)
    elif x.shape != mask.shape:
        raise ValueError(f"{name} must be [B] or [B, T] = {tuple(mask.shape)}; got {x.shape}")
    return torch.where(mask, x.detach().float(), 0.0)  # (B, T)
