"""A worked plugin: clipped REINFORCE, an objective brought by its user (`learner.plugins`).

Run it as an arm by naming this file in a config:

    plugins: [examples/clipped_reinforce.py]
    arms:
      - {name: crf, objective: clipped_reinforce, eps_high: 0.28}

The objective is REINFORCE on group-relative advantages with PPO's trust region as a hard mask
instead of a clip: a token whose ratio r_t = pi_theta / pi_old has already moved past the clip
range in the direction its advantage pushes contributes nothing,

    keep_t = 0  if (A_i > 0 and r_t > 1 + eps_high) or (A_i < 0 and r_t < 1 - eps_low), else 1
    L      = - token-mean_t [ keep_t * w_t * A_i * log pi_theta(y_t) ]     (w_t: IS weights)

so at r_t = 1 its gradient is exactly REINFORCE's, -A_i * grad log pi_theta(y_t) per token, and
the masked tokens are what `policy/clip_frac` counts. What a plugin declares, it declares in its
arm model: the settings the loss reads (here the clip range, with defaults), the advantage kind
(group, from `GroupArm`), no critic, and the loss units (token-mean: tokens).
"""

from __future__ import annotations

from typing import ClassVar, Literal

import torch
from pydantic import Field

from learner.algorithms.kl import LOG_RATIO_CLAMP
from learner.algorithms.objectives import PolicyBatch, PolicyTerms, masked_constant, policy_terms
from learner.config import GroupArm
from learner.plugins import register_objective
from learner.vocabulary import LossAggregation

__version__ = "0.1.0"


class ClippedReinforceArm(GroupArm):
    """REINFORCE with PPO's trust region as a hard token mask (this file's docstring)."""

    fixed_aggregation: ClassVar[LossAggregation | None] = "token-mean"

    objective: Literal["clipped_reinforce"] = Field(description="This plugin's objective.")
    eps_low: float = Field(default=0.2, gt=0, lt=1, description="Mask below 1 - eps_low (A < 0).")
    eps_high: float = Field(default=0.2, gt=0, description="Mask above 1 + eps_high (A > 0).")


@register_objective(arm=ClippedReinforceArm)
def clipped_reinforce_loss(batch: PolicyBatch, settings: ClippedReinforceArm) -> PolicyTerms:
    """Per-token terms -keep_t * w_t * A_i * log pi_theta(y_t), token-mean (module docstring).

    The objective returns terms, never a mean: the learner aggregates them with the whole
    minibatch's counts (`reduce_loss`), so micro-batches and ranks add up exactly."""
    mask = batch.mask
    adv = masked_constant(batch.advantages, mask, "advantages")  # (B, T), 0 off the mask
    ratio = torch.exp(batch.log_ratio.detach().clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))  # (B, T)
    past_high = (adv > 0) & (ratio > 1 + settings.eps_high)
    past_low = (adv < 0) & (ratio < 1 - settings.eps_low)
    masked = (past_high | past_low) & mask  # (B, T)
    weight = (~masked).float()
    if batch.is_weights is not None:
        weight = weight * masked_constant(batch.is_weights, mask, "is_weights")
    logprobs = torch.where(mask, batch.logprobs.float(), 0.0)  # (B, T); padding may hold junk
    per_token = -(weight * adv * logprobs)  # (B, T)
    # The stats: the ratio the trust region reads, and the masked tokens as `clipped`.
    return policy_terms(
        batch, settings, per_token, settings.aggregation, ratio=ratio, clipped=masked.float()
    )
