"""GMPO: the geometric mean of token ratios, each clipped in log space, times A."""

from __future__ import annotations

import torch
from torch import Tensor

from learner.algorithms.kl import LOG_RATIO_CLAMP
from learner.algorithms.masking import masked_mean
from learner.algorithms.objectives.inputs import PolicyBatch
from learner.algorithms.objectives.objective import PolicyObjective
from learner.algorithms.objectives.settings import PolicySettings
from learner.algorithms.objectives.terms import PolicyTerms, policy_terms


def clip_log_ratio(
    log_ratio: Tensor, advantages: Tensor, eps_low: float, eps_high: float
) -> tuple[Tensor, Tensor]:
    """GMPO's per-token clip in log space, one-sided by the sign of A (PPO's trust region):

        A > 0:  l~ = min(l, eps_high)      A < 0:  l~ = max(l, -eps_low)      A = 0:  l~ = l

    i.e. ratios are clipped to (e^-eps_low, e^eps_high) where the clip would raise the
    objective. Returns (l~, clipped): clipped is 1.0 where l~ != l (the token's gradient is 0).
    """
    upper = torch.where(advantages > 0, eps_high, torch.inf)  # (B, T)
    lower = torch.where(advantages < 0, -eps_low, -torch.inf)  # (B, T)
    clipped_log_ratio = torch.minimum(torch.maximum(log_ratio, lower), upper)
    clipped = ((log_ratio > upper) | (log_ratio < lower)).float()
    return clipped_log_ratio, clipped


@PolicyObjective
def gmpo_loss(batch: PolicyBatch, settings: PolicySettings) -> PolicyTerms:
    """GMPO (Zhao et al. 2025, arXiv:2507.20673, sec. 3): geometric-mean policy optimisation.

        l~_t = clip of l_t = log pi_theta(y_t) - log pi_old(y_t), see `clip_log_ratio`
        s~_i = exp( (1/|y_i|) sum_t l~_t ) = ( prod_t r~_t )^(1/|y_i|)
        J    = mean_i A_i s~_i,   loss = -J

    = mean_i sgn(A_i) prod_t |min(r_t A_i, clip(r_t, e^-eps_low, e^eps_high) A_i)|^(1/|y_i|).
    Gradient: -A_i s~_i / |y_i| grad log pi_theta(y_t) on unclipped tokens, 0 on clipped ones.
    With no token clipped, value and gradient equal GSPO's with no sequence clipped (both take
    the length-normalised sequence ratio); GMPO clips tokens, GSPO the sequence. advantages [B];
    terms [B], one per sequence. `is_weights` multiply each sequence's term by its mean weight
    over its response tokens (as GSPO). The optional KL penalty uses seq-mean-token-mean.

    Stats: clipped tokens as above (gradient zero), token-weighted; ratio_mean/min/max are of
    the token ratios r_t, which the objective clips.
    """
    mask, lengths, advantages = batch.mask, batch.lengths, batch.advantages
    if advantages.shape != lengths.shape:
        raise ValueError(f"gmpo_loss needs advantages [B]; got {tuple(advantages.shape)}")
    nonempty = lengths > 0  # (B,)
    seq_adv = torch.where(nonempty, advantages.detach().float(), 0.0)  # (B,)
    log_ratio = batch.log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)  # (B, T)  0 off mask
    token_adv = torch.where(mask, seq_adv[:, None], 0.0)  # (B, T)
    clipped_log_ratio, clipped = clip_log_ratio(
        log_ratio, token_adv, settings.eps_low, settings.eps_high
    )
    seq_ratio = torch.exp(clipped_log_ratio.sum(-1) / lengths.clamp_min(1))  # (B,)  s~_i
    pg_loss = -seq_adv * seq_ratio  # (B,)
    if batch.is_weights is not None:
        pg_loss = pg_loss * masked_mean(batch.is_weights.detach().float(), mask, dim=-1)
    with torch.no_grad():
        ratio = torch.exp(log_ratio)  # (B, T)  1 off the mask
    return policy_terms(
        batch, settings, pg_loss, "seq-mean-token-mean", ratio=ratio, clipped=clipped * mask
    )
