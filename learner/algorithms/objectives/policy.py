"""The four policy objectives: GSPO, GSPO-token, GRPO and PPO, as pure functions of tensors.

Each is `(logprobs, old_logprobs, advantages, mask, options, *, is_weights, ref_logprobs) ->
(loss, stats)`: a `PolicyLoss` made from a core that receives the checked `PolicyBatch`.
`options` (`learner.algorithms.options.ObjectiveOptions`) carries the clip range, aggregation and
KL settings; each objective's defaults are its arm model's (`learner.config.arms`).
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import Tensor

from learner.algorithms.kl import LOG_RATIO_CLAMP
from learner.algorithms.masking import aggregate_padded, check_aggregation, masked_mean
from learner.algorithms.objectives.inputs import (
    PolicyBatch,
    PolicyLoss,
    Stats,
    kl_ref_term,
    masked_constant,
)
from learner.algorithms.objectives.stats import ClipUnits, policy_stats
from learner.algorithms.objectives.surrogate import clipped_surrogate
from learner.algorithms.options import ObjectiveOptions


def _sequence_aggregation(options: ObjectiveOptions) -> ObjectiveOptions:
    """GSPO's terms are averaged per sequence, then over sequences, whatever `options.agg` says
    (so the optional KL penalty is aggregated the same way); max_len has no effect."""
    if options.agg == "seq-mean-token-mean" and options.max_len is None:
        return options
    return replace(options, agg="seq-mean-token-mean", max_len=None)


@PolicyLoss
def gspo_loss(
    batch: PolicyBatch, advantages: Tensor, options: ObjectiveOptions
) -> tuple[Tensor, Stats]:
    """GSPO: sequence-level, length-normalised importance ratio (Zheng et al. 2025, eq. 5-7).

        s_i = exp( (1/|y_i|) sum_t (log pi_theta(y_i,t) - log pi_old(y_i,t)) )
        J   = mean_i min( s_i A_i, clip(s_i, 1 - eps_low, 1 + eps_high) A_i ),   loss = -J

    advantages [B]; the mean is over non-empty sequences. `is_weights` [B, T] (truncated IS,
    constants) multiply each sequence's surrogate by the sequence's mean weight over its
    response tokens. The optional KL penalty uses seq-mean-token-mean. Clip flags are per
    sequence (clip_frac weights each by |y_i|); ratio_mean/min/max are over non-empty sequences.
    """
    options = _sequence_aggregation(options)
    lengths = batch.lengths
    if advantages.shape != lengths.shape:
        raise ValueError(f"gspo_loss needs advantages [B]; got {tuple(advantages.shape)}")
    nonempty = lengths > 0  # (B,)
    clamped = batch.log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)  # the sum stays finite
    seq_log_ratio = clamped.sum(-1) / lengths.clamp_min(1)  # (B,)  log s_i
    seq_adv = torch.where(nonempty, advantages.detach().float(), 0.0)  # (B,)  empty rows: 0
    pg_loss, seq_ratio, clipped = clipped_surrogate(
        seq_log_ratio, seq_adv, options.eps_low, options.eps_high
    )
    if batch.is_weights is not None:
        weights = batch.is_weights.detach().float()
        pg_loss = pg_loss * masked_mean(weights, batch.mask, dim=-1)  # (B,)
    loss = pg_loss.sum() / batch.totals.sequences.clamp_min(1)  # the minibatch's rows
    kl_term, kl_ref = kl_ref_term(batch, options)
    if kl_term is not None:
        loss = loss + kl_term
    units = ClipUnits(seq_ratio, clipped, valid=nonempty, tokens=lengths, is_token_ratio=False)
    stats = policy_stats(loss, batch, units, seq_log_ratio=seq_log_ratio, kl_ref=kl_ref)
    return loss, stats


def _token_objective(
    batch: PolicyBatch,
    token_log_ratio: Tensor,
    advantages: Tensor,
    options: ObjectiveOptions,
    *,
    seq_log_ratio: Tensor | None,
) -> tuple[Tensor, Stats]:
    """Shared tail of the token-level objectives: clipped surrogate, weights, KL, aggregation.

    `token_log_ratio` [B, T] is the log of the ratio to clip: l_t itself (GRPO, PPO) or
    GSPO-token's log s_i,t, whose sequence part `seq_log_ratio` [B] is passed along for stats.
    """
    check_aggregation(options.agg, options.max_len)
    mask, lengths = batch.mask, batch.lengths
    token_adv = masked_constant(advantages, mask, "advantages")  # (B, T)
    pg_loss, ratio, clipped = clipped_surrogate(
        token_log_ratio, token_adv, options.eps_low, options.eps_high
    )
    if batch.is_weights is not None:
        pg_loss = pg_loss * masked_constant(batch.is_weights, mask, "is_weights")  # (B, T)
    loss = aggregate_padded(pg_loss, lengths, options.agg, options.max_len, batch.totals)
    kl_term, kl_ref = kl_ref_term(batch, options)
    if kl_term is not None:
        loss = loss + kl_term
    is_token_ratio = token_log_ratio is batch.log_ratio  # clipping r_t itself (GRPO, PPO)
    units = ClipUnits(ratio, clipped, valid=mask, tokens=None, is_token_ratio=is_token_ratio)
    stats = policy_stats(loss, batch, units, seq_log_ratio=seq_log_ratio, kl_ref=kl_ref)
    return loss, stats


@PolicyLoss
def gspo_token_loss(
    batch: PolicyBatch, advantages: Tensor, options: ObjectiveOptions
) -> tuple[Tensor, Stats]:
    """GSPO-token: per-token advantages with GSPO's sequence ratio (Zheng et al. 2025, eq. 13-14).

        s_i,t = sg[s_i] * pi_theta(y_i,t) / sg[pi_theta(y_i,t)]
        J     = mean_i (1/|y_i|) sum_t min( s_i,t A_i,t, clip(s_i,t, 1-eps_low, 1+eps_high) A_i,t )

    s_i,t equals s_i in value and has gradient s_i * grad log pi_theta(y_i,t), so with A_i,t = A_i
    value and gradient equal `gspo_loss`. advantages [B] or [B, T]. `is_weights` multiply each
    token's term: with weights the value still matches GSPO's, but each token's gradient follows
    its own weight rather than the sequence mean.
    """
    options = _sequence_aggregation(options)
    log_ratio, mask = batch.log_ratio, batch.mask
    clamped = log_ratio.detach().clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    seq_log_ratio = clamped.sum(-1) / batch.lengths.clamp_min(1)  # (B,)  sg[log s_i]
    # log s_i,t = sg[log s_i] + log pi - sg[log pi]; l_t - sg[l_t] stands in for the last two
    # terms because pi_old is a constant. Its value is exactly 0, so s_i,t == s_i bit for bit.
    seq_log_ratio_t = torch.where(mask, seq_log_ratio[:, None], 0.0)  # (B, T)  0 off the mask
    token_log_ratio = seq_log_ratio_t + (log_ratio - log_ratio.detach())  # (B, T)
    return _token_objective(
        batch, token_log_ratio, advantages, options, seq_log_ratio=seq_log_ratio
    )


@PolicyLoss
def grpo_loss(
    batch: PolicyBatch, advantages: Tensor, options: ObjectiveOptions
) -> tuple[Tensor, Stats]:
    """GRPO: per-token ratio and clip, group-relative advantages (Shao et al. 2024, eq. 3).

        r_t = exp(log pi_theta(y_t) - log pi_old(y_t))
        L_t = max(-A r_t, -A clip(r_t, 1 - eps_low, 1 + eps_high))

    aggregated by `options.agg` (see `LossAggregation`; `options.max_len` is required by
    Dr. GRPO's `seq-mean-token-sum-norm`). eps_high > eps_low is DAPO's clip-higher.
    advantages [B] or [B, T].
    """
    return _token_objective(batch, batch.log_ratio, advantages, options, seq_log_ratio=None)


@PolicyLoss
def ppo_loss(
    batch: PolicyBatch, advantages: Tensor, options: ObjectiveOptions
) -> tuple[Tensor, Stats]:
    """PPO policy loss with per-token advantages [B, T] from GAE (Schulman et al. 2017, eq. 7).

    The per-token clipped surrogate of `grpo_loss`, aggregated by `options.agg`: the arm
    registry gives PPO `token-mean` over the batch (CleanRL; PPO as usually run for LLMs).
    Whiten the advantages beforehand (`whiten`).
    """
    if advantages.shape != batch.mask.shape:
        raise ValueError(f"ppo_loss needs per-token advantages [B, T]; got {advantages.shape}")
    return _token_objective(batch, batch.log_ratio, advantages, options, seq_log_ratio=None)
