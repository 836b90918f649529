"""SAPO: a soft sigmoid gate on the token ratio in place of PPO's hard clip."""

from __future__ import annotations

import torch
from torch import Tensor

from learner.algorithms.kl import LOG_RATIO_CLAMP
from learner.algorithms.objectives.inputs import PolicyBatch, masked_constant
from learner.algorithms.objectives.objective import PolicyObjective
from learner.algorithms.objectives.settings import SAPOSettings
from learner.algorithms.objectives.terms import PolicyTerms, policy_terms

GATED_BELOW = 0.5
"""A token counts as gated (stats) when its gate weight 4 p (1 - p) is below this: its gradient
is less than half the unclipped surrogate's, r_t A grad log pi."""


def gate_weight(ratio: Tensor, tau: Tensor) -> Tensor:
    """d f / d r of SAPO's gate, 4 p (1 - p) with p = sigmoid(tau (r - 1)), = sech^2(tau (r-1) / 2):
    in (0, 1], exactly 1 at r = 1 for every tau (p = 1/2), so the gate starts as the plain
    surrogate; below 1/2 once |tau (r - 1)| > 2 acosh(sqrt 2) ~ 1.763."""
    p = torch.sigmoid(tau * (ratio - 1.0))
    return 4.0 * p * (1.0 - p)


@PolicyObjective
def sapo_loss(batch: PolicyBatch, settings: SAPOSettings) -> PolicyTerms:
    """SAPO (Gao et al. 2025, arXiv:2511.20347, sec. 3): soft adaptive policy optimisation.

        r_t   = pi_theta(y_t) / pi_old(y_t),   tau_t = tau_pos if A_t > 0 else tau_neg
        f_t   = (4 / tau_t) sigmoid(tau_t (r_t - 1))
        J     = mean_i (1/|y_i|) sum_t f_t A_i,t,   loss = -J

    grad f_t = 4 p (1 - p) r_t grad log pi_theta = `gate_weight` x the unclipped surrogate's
    gradient: equal to it at r_t = 1 for any tau, decaying smoothly (never to exactly 0) as r_t
    leaves 1 on either side, faster for larger tau; tau_neg > tau_pos damps negative-advantage
    tokens more (sec. 3.2). The value at r_t = 1 is 2 A / tau, not A. Aggregated per sequence,
    then over sequences (seq-mean-token-mean, fixed). advantages [B] or [B, T]; `is_weights`
    multiply each token's term. `settings`: `SAPOSettings`; eps_low/eps_high are unread.

    Stats: a token counts as gated when its gate weight is below `GATED_BELOW` (gradient under
    half the surrogate's), low or high by the side of r_t = 1.
    """
    if not isinstance(settings, SAPOSettings):
        raise TypeError(f"sapo_loss needs SAPOSettings (tau_pos, tau_neg); got {type(settings)}")
    mask = batch.mask
    token_adv = masked_constant(batch.advantages, mask, "advantages")  # (B, T)
    tau = torch.where(token_adv > 0, settings.tau_pos, settings.tau_neg)  # (B, T)
    ratio = torch.exp(batch.log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))  # (B, T)
    gate = torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)  # (B, T)  f_t
    pg_loss = -gate * token_adv  # (B, T)  0 off the mask (A = 0 there)
    if batch.is_weights is not None:
        pg_loss = pg_loss * masked_constant(batch.is_weights, mask, "is_weights")
    with torch.no_grad():
        gated = (gate_weight(ratio, tau) < GATED_BELOW) & mask  # (B, T)
    return policy_terms(
        batch, settings, pg_loss, "seq-mean-token-mean", ratio=ratio, clipped=gated.float()
    )
