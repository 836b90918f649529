"""CISPO: the clipped importance-sampling weight as a constant factor of REINFORCE."""

from __future__ import annotations

import torch
from torch import Tensor

from learner.algorithms.kl import LOG_RATIO_CLAMP
from learner.algorithms.masking import aggregate_padded
from learner.algorithms.objectives.fixed import add_kl_ref, with_aggregation
from learner.algorithms.objectives.inputs import PolicyBatch, PolicyLoss, Stats, masked_constant
from learner.algorithms.objectives.stats import ClipUnits, policy_stats
from learner.algorithms.options import ObjectiveOptions


@PolicyLoss
def cispo_loss(
    batch: PolicyBatch, advantages: Tensor, options: ObjectiveOptions
) -> tuple[Tensor, Stats]:
    """CISPO (MiniMax-M1, arXiv:2506.13585, sec. 3.1, eq. 4-5):

        r_t   = pi_theta(y_t) / pi_old(y_t)
        w_t   = sg[ clip(r_t, 1 - eps_low, 1 + eps_high) ]
        J     = (1 / sum_i |y_i|) sum_i sum_t  w_t A_i,t log pi_theta(y_t),   loss = -J

    The weight is a constant, so grad J = mean_t w_t A_t grad log pi_theta(y_t): REINFORCE with a
    truncated IS weight. No token's gradient is ever dropped (unlike PPO's clip, which zeroes
    it); a weight at a bound only caps the token's step. MiniMax's normalisation is one mean over
    all response tokens of the batch (`token-mean`, whatever `options.agg` says). advantages [B]
    or [B, T]; `is_weights` multiply each token's term.

    Stats: a token counts as clipped when its weight is truncated (r_t outside the range), low
    or high by the side; its gradient is scaled to the bound, not zeroed. The loss value is the
    REINFORCE surrogate (it contains log pi_theta, not the ratio).
    """
    options = with_aggregation(options, "token-mean")
    mask, lengths = batch.mask, batch.lengths
    token_adv = masked_constant(advantages, mask, "advantages")  # (B, T)
    with torch.no_grad():
        ratio = torch.exp(batch.log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))  # (B, T)
        weight = ratio.clamp(1.0 - options.eps_low, 1.0 + options.eps_high)  # (B, T)
        truncated = (weight != ratio) & mask  # (B, T)
    logprobs = torch.where(mask, batch.logprobs.float(), 0.0)  # (B, T)  padding junk dropped
    pg_loss = -(weight * token_adv) * logprobs  # (B, T)  0 off the mask
    if batch.is_weights is not None:
        pg_loss = pg_loss * masked_constant(batch.is_weights, mask, "is_weights")
    loss = aggregate_padded(pg_loss, lengths, "token-mean", totals=batch.totals)
    loss, kl_ref = add_kl_ref(loss, batch, options)
    units = ClipUnits(ratio, truncated.float(), valid=mask, tokens=None, is_token_ratio=True)
    return loss, policy_stats(loss, batch, units, seq_log_ratio=None, kl_ref=kl_ref)
