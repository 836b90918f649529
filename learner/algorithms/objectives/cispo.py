"""CISPO: the clipped importance-sampling weight as a constant factor of REINFORCE."""

from __future__ import annotations

import torch

from learner.algorithms.kl import LOG_RATIO_CLAMP
from learner.algorithms.objectives.inputs import PolicyBatch, masked_constant
from learner.algorithms.objectives.objective import PolicyObjective
from learner.algorithms.objectives.settings import PolicySettings
from learner.algorithms.objectives.terms import PolicyTerms, policy_terms


@PolicyObjective
def cispo_loss(batch: PolicyBatch, settings: PolicySettings) -> PolicyTerms:
    """CISPO (MiniMax-M1, arXiv:2506.13585, sec. 3.1, eq. 4-5):

        r_t   = pi_theta(y_t) / pi_old(y_t)
        w_t   = sg[ clip(r_t, 1 - eps_low, 1 + eps_high) ]
        J     = (1 / sum_i |y_i|) sum_i sum_t  w_t A_i,t log pi_theta(y_t),   loss = -J

    The weight is a constant, so grad J = mean_t w_t A_t grad log pi_theta(y_t): REINFORCE with a
    truncated IS weight. No token's gradient is ever dropped (unlike PPO's clip, which zeroes
    it); a weight at a bound only caps the token's step. MiniMax's normalisation is one mean over
    all response tokens of the batch (`token-mean`, fixed). advantages [B] or [B, T];
    `is_weights` multiply each token's term.

    Stats: a token counts as clipped when its weight is truncated (r_t outside the range), low
    or high by the side; its gradient is scaled to the bound, not zeroed. The loss value is the
    REINFORCE surrogate (it contains log pi_theta, not the ratio).
    """
    mask = batch.mask
    token_adv = masked_constant(batch.advantages, mask, "advantages")  # (B, T)
    with torch.no_grad():
        ratio = torch.exp(batch.log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))  # (B, T)
        weight = ratio.clamp(1.0 - settings.eps_low, 1.0 + settings.eps_high)  # (B, T)
        truncated = (weight != ratio) & mask  # (B, T)
    logprobs = torch.where(mask, batch.logprobs.float(), 0.0)  # (B, T)  padding junk dropped
    pg_loss = -(weight * token_adv) * logprobs  # (B, T)  0 off the mask
    if batch.is_weights is not None:
        pg_loss = pg_loss * masked_constant(batch.is_weights, mask, "is_weights")
    return policy_terms(
        batch, settings, pg_loss, "token-mean", ratio=ratio, clipped=truncated.float()
    )
