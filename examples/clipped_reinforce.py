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
from torch import Tensor

from learner.algorithms.kl import LOG_RATIO_CLAMP
from learner.algorithms.masking import aggregate_padded
from learner.algorithms.objectives import PolicyLoss, Stats
from learner.algorithms.objectives.inputs import PolicyBatch, kl_ref_term, masked_constant
from learner.algorithms.objectives.stats import ClipUnits, policy_stats
from learner.algorithms.options import ObjectiveOptions
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
@PolicyLoss
def clipped_reinforce_loss(
    batch: PolicyBatch, advantages: Tensor, options: ObjectiveOptions
) -> tuple[Tensor, Stats]:
    """Token-mean of -keep_t * w_t * A_i * log pi_theta(y_t) (module docstring)."""
    mask = batch.mask
    adv = masked_constant(advantages, mask, "advantages")  # (B, T), 0 off the mask
    ratio = torch.exp(batch.log_ratio.detach().clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))  # (B, T)
    past_high = (adv > 0) & (ratio > 1 + options.eps_high)
    past_low = (adv < 0) & (ratio < 1 - options.eps_low)
    masked = (past_high | past_low) & mask  # (B, T)
    weight = (~masked).float()
    if batch.is_weights is not None:
        weight = weight * masked_constant(batch.is_weights, mask, "is_weights")
    logprobs = torch.where(mask, batch.logprobs.float(), 0.0)  # (B, T); padding may hold junk
    per_token = -(weight * adv * logprobs)
    # batch.totals: the whole minibatch's counts, so micro-batches and ranks add up exactly.
    loss = aggregate_padded(per_token, batch.lengths, options.agg, options.max_len, batch.totals)
    kl_term, kl_ref = kl_ref_term(batch, options)
    if kl_term is not None:
        loss = loss + kl_term
    units = ClipUnits(ratio, masked.float(), valid=mask, tokens=None, is_token_ratio=True)
    return loss, policy_stats(loss, batch, units, seq_log_ratio=None, kl_ref=kl_ref)
