"""The policy metrics of a minibatch, computed once under no_grad from its `PolicyStats`.

Ratio statistics come in two kinds (design section 7):
- `ratio_mean`, `ratio_min`, `ratio_max` describe the ratio the objective *clips*, in its own
  units: GSPO's sequence ratio s_i over non-empty sequences, GSPO-token's s_i,t (= s_i) over
  response tokens, GRPO's and PPO's r_t over response tokens. They show where the clip range
  sits, but their means are not comparable across arms (kept for earlier reports).
- `ratio_seq_mean` and `ratio_token_mean` are the same two numbers for every objective:
  mean over non-empty sequences of exp(mean_t l_t) (the length-normalised sequence ratio), and
  the token-weighted mean of r_t = exp(l_t). Compare arms with these.

"Clipped" means the clip is active, i.e. the token's (or sequence's) gradient is zero: A > 0
and ratio > 1 + eps_high (clip high), or A < 0 and ratio < 1 - eps_low (clip low); objectives
without a hard clip flag what their own mechanism acts on (`PolicyStats.clipped`). clip_frac,
clip_frac_low and clip_frac_high are token-weighted (low + high = clip_frac); clip_frac_seq is
the fraction of non-empty sequences with any clipped token. kl_old is k3 of
KL(pi_old || pi_theta) per token, r_t - 1 - l_t (CleanRL's approx_kl), token mean; kl_ref the
token mean of the reference-KL estimate, when reference log-probs were given.
"""

from __future__ import annotations

import torch
from torch import Tensor

from contract import metrics as M
from learner.algorithms.kl import LOG_RATIO_CLAMP
from learner.algorithms.objectives.terms import PolicyTerms

POLICY_METRICS: frozenset[str] = frozenset(
    {
        M.POLICY_LOSS,
        M.POLICY_CLIP_FRAC,
        M.POLICY_CLIP_FRAC_SEQ,
        M.POLICY_CLIP_FRAC_LOW,
        M.POLICY_CLIP_FRAC_HIGH,
        M.POLICY_RATIO_MEAN,
        M.POLICY_RATIO_MIN,
        M.POLICY_RATIO_MAX,
        M.POLICY_RATIO_SEQ_MEAN,
        M.POLICY_RATIO_TOKEN_MEAN,
        M.POLICY_KL_OLD,
    }
)
"""The metrics of every policy objective; `M.POLICY_KL_REF` too when reference log-probs are
given."""


def pack(values: dict[str, Tensor]) -> dict[str, float]:
    """0-dim tensors -> python floats in one device-to-host copy (one sync on GPU)."""
    floats = torch.stack([v.float() for v in values.values()]).tolist()
    return dict(zip(values, floats, strict=True))


@torch.no_grad()
def policy_metrics(terms: PolicyTerms, mask: Tensor, loss: Tensor) -> dict[str, float]:
    """The metrics (`POLICY_METRICS`, by their `contract.metrics` names) of the rows of `terms`
    with response `mask` [B, T] and reduced `loss` (module docstring)."""
    stats, kl = terms.stats, terms.loss.kl
    lengths = mask.bool().sum(-1)  # (B,)
    n_tokens = lengths.sum().clamp_min(1)
    n_seqs = (lengths > 0).sum().clamp_min(1)
    per_sequence = stats.ratio.ndim == 1  # one clipped ratio per sequence (GSPO)
    valid = lengths > 0 if per_sequence else mask.bool()
    clipped = stats.clipped * lengths if per_sequence else stats.clipped  # token-weighted
    clipped_per_row = clipped.reshape(lengths.shape[0], -1).sum(-1)  # (B,)
    n_clipped = clipped_per_row.sum()
    ratio_minus_one = torch.where(valid, stats.ratio - 1.0, 0.0)
    # Clipped entries have r < 1 - eps_low (low) or r > 1 + eps_high (high), so the dot product
    # with sign(r - 1) counts high clips minus low clips.
    n_high_minus_low = torch.dot(clipped.flatten(), ratio_minus_one.sign().flatten())
    n_low = (n_clipped - n_high_minus_low) / 2
    n_ratio = valid.sum().clamp_min(1) if per_sequence else n_tokens
    ratio_mean = 1.0 + ratio_minus_one.sum() / n_ratio  # also the token mean of a token ratio
    # The mean fills padding: it lies within [min, max], so one aminmax pass gives both.
    ratio_min, ratio_max = torch.where(valid, stats.ratio, ratio_mean).aminmax()
    log_ratio = stats.log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)  # as the clipped unit
    if stats.is_token_ratio:
        token_ratio_minus_one, ratio_token_mean = ratio_minus_one, ratio_mean
    else:
        token_ratio_minus_one = torch.expm1(log_ratio)  # (B, T)  0 off the mask
        ratio_token_mean = 1.0 + token_ratio_minus_one.sum() / n_tokens
    seq_log_ratio = log_ratio.sum(-1) / lengths.clamp_min(1)  # (B,)  log s_i, 0 for empty rows
    optional = {} if kl is None else {M.POLICY_KL_REF: kl.sum() / n_tokens}
    return pack(
        {
            M.POLICY_LOSS: loss.detach(),
            M.POLICY_CLIP_FRAC: n_clipped / n_tokens,
            M.POLICY_CLIP_FRAC_SEQ: (clipped_per_row > 0).sum() / n_seqs,
            M.POLICY_CLIP_FRAC_LOW: n_low / n_tokens,
            M.POLICY_CLIP_FRAC_HIGH: (n_clipped - n_low) / n_tokens,
            M.POLICY_RATIO_MEAN: ratio_mean,
            M.POLICY_RATIO_MIN: ratio_min,
            M.POLICY_RATIO_MAX: ratio_max,
            M.POLICY_RATIO_SEQ_MEAN: 1.0 + torch.expm1(seq_log_ratio).sum() / n_seqs,
            M.POLICY_RATIO_TOKEN_MEAN: ratio_token_mean,
            M.POLICY_KL_OLD: (token_ratio_minus_one - log_ratio).sum() / n_tokens,
            **optional,
        }
    )
