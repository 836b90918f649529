"""The four policy objectives: GSPO, GSPO-token, GRPO and PPO, as pure functions of tensors.

Each is a `PolicyObjective`: (checked `PolicyBatch`, arm settings) -> `PolicyTerms`, the
unaggregated loss terms and the stats of the rows given. The settings are the arm's
(`learner.config.arms`, read through `PolicySettings`): the clip range, aggregation and KL terms.
"""

from __future__ import annotations

import torch
from torch import Tensor

from learner.algorithms.kl import LOG_RATIO_CLAMP
from learner.algorithms.masking import masked_mean
from learner.algorithms.objectives.inputs import PolicyBatch, masked_constant
from learner.algorithms.objectives.objective import PolicyObjective
from learner.algorithms.objectives.settings import PolicySettings
from learner.algorithms.objectives.surrogate import clipped_surrogate
from learner.algorithms.objectives.terms import PolicyTerms, policy_terms
from learner.vocabulary import LossAggregation


@PolicyObjective
def gspo_loss(batch: PolicyBatch, settings: PolicySettings) -> PolicyTerms:
    """GSPO: sequence-level, length-normalised importance ratio (Zheng et al. 2025, eq. 5-7).

        s_i = exp( (1/|y_i|) sum_t (log pi_theta(y_i,t) - log pi_old(y_i,t)) )
        J   = mean_i min( s_i A_i, clip(s_i, 1 - eps_low, 1 + eps_high) A_i ),   loss = -J

    advantages [B]; terms [B], one per sequence, averaged over non-empty sequences. `is_weights`
    [B, T] (truncated IS, constants) multiply each sequence's surrogate by the sequence's mean
    weight over its response tokens. The optional KL penalty uses seq-mean-token-mean. Stats:
    clip flags per sequence (clip_frac weights each by |y_i|); the ratio is s_i [B].
    """
    lengths, advantages = batch.lengths, batch.advantages
    if advantages.shape != lengths.shape:
        raise ValueError(f"gspo_loss needs advantages [B]; got {tuple(advantages.shape)}")
    nonempty = lengths > 0  # (B,)
    clamped = batch.log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)  # the sum stays finite
    seq_log_ratio = clamped.sum(-1) / lengths.clamp_min(1)  # (B,)  log s_i
    seq_adv = torch.where(nonempty, advantages.detach().float(), 0.0)  # (B,)  empty rows: 0
    pg_loss, seq_ratio, clipped = clipped_surrogate(
        seq_log_ratio, seq_adv, settings.eps_low, settings.eps_high
    )
    if batch.is_weights is not None:
        weights = batch.is_weights.detach().float()
        pg_loss = pg_loss * masked_mean(weights, batch.mask, dim=-1)  # (B,)
    return policy_terms(
        batch,
        settings,
        pg_loss,
        "seq-mean-token-mean",
        ratio=seq_ratio,
        clipped=clipped,
        is_token_ratio=False,
    )


def _token_terms(
    batch: PolicyBatch, token_log_ratio: Tensor, settings: PolicySettings, agg: LossAggregation
) -> PolicyTerms:
    """Shared tail of the token-level objectives: clipped surrogate and IS weights, per token.

    `token_log_ratio` [B, T] is the log of the ratio to clip: l_t itself (GRPO, PPO) or
    GSPO-token's log s_i,t.
    """
    mask = batch.mask
    token_adv = masked_constant(batch.advantages, mask, "advantages")  # (B, T)
    pg_loss, ratio, clipped = clipped_surrogate(
        token_log_ratio, token_adv, settings.eps_low, settings.eps_high
    )
    if batch.is_weights is not None:
        pg_loss = pg_loss * masked_constant(batch.is_weights, mask, "is_weights")  # (B, T)
    is_token_ratio = token_log_ratio is batch.log_ratio  # clipping r_t itself (GRPO, PPO)
    return policy_terms(
        batch,
        settings,
        pg_loss,
        agg,
        ratio=ratio,
        clipped=clipped,
        is_token_ratio=is_token_ratio,
    )


@PolicyObjective
def gspo_token_loss(batch: PolicyBatch, settings: PolicySettings) -> PolicyTerms:
    """GSPO-token: per-token advantages with GSPO's sequence ratio (Zheng et al. 2025, eq. 13-14).

        s_i,t = sg[s_i] * pi_theta(y_i,t) / sg[pi_theta(y_i,t)]
        J     = mean_i (1/|y_i|) sum_t min( s_i,t A_i,t, clip(s_i,t, 1-eps_low, 1+eps_high) A_i,t )

    s_i,t equals s_i in value and has gradient s_i * grad log pi_theta(y_i,t), so with A_i,t = A_i
    value and gradient equal `gspo_loss`. advantages [B] or [B, T]; seq-mean-token-mean, as GSPO.
    `is_weights` multiply each token's term: with weights the value still matches GSPO's, but
    each token's gradient follows its own weight rather than the sequence mean.
    """
    log_ratio, mask = batch.log_ratio, batch.mask
    clamped = log_ratio.detach().clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    seq_log_ratio = clamped.sum(-1) / batch.lengths.clamp_min(1)  # (B,)  sg[log s_i]
    # log s_i,t = sg[log s_i] + log pi - sg[log pi], the last two terms from the masked float32
    # log-probs themselves: exactly 0 for any finite log-prob, so s_i,t == s_i bit for bit, with
    # l_t's gradient (l_t - sg[l_t] gave the same bits, but NaN where l_t = lp - old overflows).
    seq_log_ratio_t = torch.where(mask, seq_log_ratio[:, None], 0.0)  # (B, T)  0 off the mask
    live = torch.where(mask, batch.logprobs.float(), 0.0)  # (B, T)  log pi, 0 off the mask
    token_log_ratio = seq_log_ratio_t + (live - live.detach())  # (B, T)
    return _token_terms(batch, token_log_ratio, settings, "seq-mean-token-mean")


@PolicyObjective
def grpo_loss(batch: PolicyBatch, settings: PolicySettings) -> PolicyTerms:
    """GRPO: per-token ratio and clip, group-relative advantages (Shao et al. 2024, eq. 3).

        r_t = exp(log pi_theta(y_t) - log pi_old(y_t))
        L_t = max(-A r_t, -A clip(r_t, 1 - eps_low, 1 + eps_high))

    aggregated by the arm's `agg` (see `LossAggregation`; Dr. GRPO's `seq-mean-token-sum-norm`
    needs the reducer's max_len). eps_high > eps_low is DAPO's clip-higher. advantages [B] or
    [B, T].
    """
    return _token_terms(batch, batch.log_ratio, settings, settings.aggregation)


@PolicyObjective
def ppo_loss(batch: PolicyBatch, settings: PolicySettings) -> PolicyTerms:
    """PPO policy loss with per-token advantages [B, T] from GAE (Schulman et al. 2017, eq. 7).

    The per-token clipped surrogate of `grpo_loss`, aggregated by the arm's `token-mean` over
    the batch (CleanRL; PPO as usually run for LLMs). Whiten the advantages beforehand
    (`whiten`).
    """
    if batch.advantages.shape != batch.mask.shape:
        raise ValueError(
            f"ppo_loss needs per-token advantages [B, T]; got {batch.advantages.shape}"
        )
    return _token_terms(batch, batch.log_ratio, settings, settings.aggregation)
