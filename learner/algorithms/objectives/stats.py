"""Diagnostics of a policy objective, computed under no_grad from the clipped unit's outputs.

Ratio statistics come in two kinds (design section 7):
- `ratio_mean`, `ratio_min`, `ratio_max` describe the ratio the objective *clips*, in its own
  units: GSPO's sequence ratio s_i over non-empty sequences, GSPO-token's s_i,t (= s_i) over
  response tokens, GRPO's and PPO's r_t over response tokens. They show where the clip range
  sits, but their means are not comparable across arms (kept for earlier reports).
- `ratio_seq_mean` and `ratio_token_mean` are the same two numbers for every objective:
  mean over non-empty sequences of exp(mean_t l_t) (the length-normalised sequence ratio), and
  the token-weighted mean of r_t = exp(l_t). Compare arms with these.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from learner.algorithms.kl import LOG_RATIO_CLAMP
from learner.algorithms.objectives.inputs import PolicyBatch, Stats


@dataclass(frozen=True)
class ClipUnits:
    """What an objective clipped: one entry per response token [B, T] or per sequence [B]."""

    ratio: Tensor  # the clipped ratio, exactly 1 off `valid` (exp of a zeroed log-ratio)
    clipped: Tensor  # float 0/1: 1 where the clip is active (gradient zero)
    valid: Tensor  # bool: response tokens, or non-empty sequences
    tokens: Tensor | None  # (B,) tokens each entry stands for (GSPO: |y_i|); None: 1 each
    is_token_ratio: bool  # `ratio` is r_t = exp(l_t) itself (saves an exp)


def pack(**values: Tensor) -> Stats:
    """0-dim tensors -> python floats in one device-to-host copy (one sync on GPU)."""
    floats = torch.stack([v.float() for v in values.values()]).tolist()
    return dict(zip(values, floats, strict=True))


@torch.no_grad()
def policy_stats(
    loss: Tensor,
    batch: PolicyBatch,
    units: ClipUnits,
    *,
    seq_log_ratio: Tensor | None,
    kl_ref: Tensor | None,
) -> Stats:
    """loss, clip fractions, both kinds of ratio statistics, kl_old, and kl_ref when measured.

    `seq_log_ratio` [B] is log s_i = mean_t clamp(l_t) (0 for empty rows) when the objective
    already has it, else None. kl_old is k3 of KL(pi_old || pi_theta) per token,
    r_t - 1 - l_t (CleanRL's approx_kl), token mean.
    """
    lengths = batch.lengths
    n_tokens = lengths.sum().clamp_min(1)
    n_seqs = (lengths > 0).sum().clamp_min(1)
    clipped = units.clipped if units.tokens is None else units.clipped * units.tokens
    clipped_per_row = clipped.reshape(lengths.shape[0], -1).sum(-1)  # (B,)
    n_clipped = clipped_per_row.sum()
    ratio_minus_one = units.ratio - 1.0  # 0 off the mask
    # Clipped entries have r < 1 - eps_low (low) or r > 1 + eps_high (high), so the dot product
    # with sign(r - 1) counts high clips minus low clips.
    n_high_minus_low = torch.dot(clipped.flatten(), ratio_minus_one.sign().flatten())
    n_low = (n_clipped - n_high_minus_low) / 2
    n_ratio = n_tokens if units.tokens is None else units.valid.sum().clamp_min(1)
    ratio_mean = 1.0 + ratio_minus_one.sum() / n_ratio  # also the token mean of a token ratio
    # The mean fills padding: it lies within [min, max], so one aminmax pass gives both.
    ratio_min, ratio_max = torch.where(units.valid, units.ratio, ratio_mean).aminmax()
    log_ratio = batch.log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)  # as the clipped unit
    if units.is_token_ratio:
        token_ratio_minus_one, ratio_token_mean = ratio_minus_one, ratio_mean
    else:
        token_ratio_minus_one = torch.expm1(log_ratio)  # (B, T)  0 off the mask
        ratio_token_mean = 1.0 + token_ratio_minus_one.sum() / n_tokens
    if seq_log_ratio is None:
        seq_log_ratio = log_ratio.sum(-1) / lengths.clamp_min(1)  # (B,)  0 for empty rows
    optional = {} if kl_ref is None else {"kl_ref": kl_ref}
    return pack(
        loss=loss.detach(),
        clip_frac=n_clipped / n_tokens,
        clip_frac_seq=(clipped_per_row > 0).sum() / n_seqs,
        clip_frac_low=n_low / n_tokens,
        clip_frac_high=(n_clipped - n_low) / n_tokens,
        ratio_mean=ratio_mean,
        ratio_min=ratio_min,
        ratio_max=ratio_max,
        ratio_seq_mean=1.0 + torch.expm1(seq_log_ratio.detach()).sum() / n_seqs,
        ratio_token_mean=ratio_token_mean,
        kl_old=(token_ratio_minus_one - log_ratio).sum() / n_tokens,  # 0 off the mask
        **optional,
    )
