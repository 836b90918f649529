"""GMPO: the geometric mean of token ratios, each clipped in log space, times A."""

from __future__ import annotations

import torch
from torch import Tensor

from learner.algorithms.kl import LOG_RATIO_CLAMP
from learner.algorithms.masking import masked_mean
from learner.algorithms.objectives.fixed import add_kl_ref, with_aggregation
from learner.algorithms.objectives.inputs import PolicyBatch, PolicyLoss, Stats
from learner.algorithms.objectives.stats import ClipUnits, policy_stats
from learner.algorithms.options import ObjectiveOptions


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


@PolicyLoss
def gmpo_loss(
    batch: PolicyBatch, advantages: Tensor, options: ObjectiveOptions
) -> tuple[Tensor, Stats]:
    """GMPO (Zhao et al. 2025, arXiv:2507.20673, sec. 3): geometric-mean policy optimisation.

        l~_t = clip of l_t = log pi_theta(y_t) - log pi_old(y_t), see `clip_log_ratio`
        s~_i = exp( (1/|y_i|) sum_t l~_t ) = ( prod_t r~_t )^(1/|y_i|)
        J    = mean_i A_i s~_i,   loss = -J

    = mean_i sgn(A_i) prod_t |min(r_t A_i, clip(r_t, e^-eps_low, e^eps_high) A_i)|^(1/|y_i|).
    Gradient: -A_i s~_i / |y_i| grad log pi_theta(y_t) on unclipped tokens, 0 on clipped ones.
    With no token clipped, value and gradient equal GSPO's with no sequence clipped (both take
    the length-normalised sequence ratio); GMPO clips tokens, GSPO the sequence. advantages [B].
    `is_weights` multiply each sequence's term by its mean weight over its response tokens (as
    GSPO). The optional KL penalty uses seq-mean-token-mean.

    Stats: clipped tokens as above (gradient zero), token-weighted; ratio_mean/min/max are of
    the token ratios r_t, which the objective clips.
    """
    options = with_aggregation(options, "seq-mean-token-mean")
    mask, lengths = batch.mask, batch.lengths
    if advantages.shape != lengths.shape:
        raise ValueError(f"gmpo_loss needs advantages [B]; got {tuple(advantages.shape)}")
    nonempty = lengths > 0  # (B,)
    seq_adv = torch.where(nonempty, advantages.detach().float(), 0.0)  # (B,)
    log_ratio = batch.log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)  # (B, T)  0 off mask
    token_adv = torch.where(mask, seq_adv[:, None], 0.0)  # (B, T)
    clipped_log_ratio, clipped = clip_log_ratio(
        log_ratio, token_adv, options.eps_low, options.eps_high
    )
    seq_ratio = torch.exp(clipped_log_ratio.sum(-1) / lengths.clamp_min(1))  # (B,)  s~_i
    pg_loss = -seq_adv * seq_ratio  # (B,)
    if batch.is_weights is not None:
        pg_loss = pg_loss * masked_mean(batch.is_weights.detach().float(), mask, dim=-1)
    loss = pg_loss.sum() / batch.totals.sequences.clamp_min(1)  # the minibatch's rows
    loss, kl_ref = add_kl_ref(loss, batch, options)
    with torch.no_grad():
        ratio = torch.exp(log_ratio)  # (B, T)  1 off the mask
        units = ClipUnits(ratio, clipped * mask, mask, tokens=None, is_token_ratio=True)
        seq_log_ratio = log_ratio.sum(-1) / lengths.clamp_min(1)  # (B,)  unclipped log s_i
    stats = policy_stats(loss, batch, units, seq_log_ratio=seq_log_ratio, kl_ref=kl_ref)
    return loss, stats
