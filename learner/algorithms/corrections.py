"""Off-policy corrections: which pi_old an arm's ratio uses, and what multiplies its terms.

Three policies meet in an asynchronous learner step at version k (design sections 5, 6):
- mu, the *behaviour* policy: the generator's logprobs, sampled by version k - lag on the
  generation engine's numerics;
- pi_prox, the *proximal* policy: the learner's own forward at version k, at the start of the step;
- pi_theta, the policy being updated.
With rho_t = pi_prox(y_t) / mu(y_t), a correction decides two things, and nothing else:
1. pi_old of the objective's ratio: mu (`naive`) or pi_prox (every other correction). With pi_prox
   the first minibatch's ratio is exactly 1 at any lag, so staleness reaches the loss only
   through the weights below; with mu the ratio itself carries the lag and the engine gap.
2. weights w >= 0, constants multiplying each token's (or each sequence's) surrogate term. The
   objectives stay pure: they receive w as `is_weights` and never know which correction made it.

The corrections (rho_seq = prod_t rho_t, rho_geo = exp(mean_t log rho_t); thresholds inclusive):
- `naive`: pi_old = mu, no weight. What a synchronous trainer does when fed stale data.
- `proximal`: pi_old = pi_prox, no weight: the trust region is centred on the learner's own
  recompute and the behaviour policy enters nowhere. AReaL's default since its PR #1088
  (`ppo_actor_loss_fn` with `rejection_sampling=None`: "no filtering", no behaviour weight).
- `decoupled`: w_t = rho_t, tokens with rho_t > cap masked (cap None: untruncated). Decoupled PPO
  (Hilton et al. 2022, "Batch size-invariance for policy optimization", arXiv 2110.00641) as used
  by AReaL for asynchronous RL (Fu et al. 2025, arXiv 2505.24298): AReaL's loss before its
  PR #1088, `behav_imp_weight_cap`.
- `tis_token`: w_t = min(rho_t, C). Truncated IS (Ionides 2008), applied to rollout/trainer
  mismatch by Yao et al. 2025 ("Your efficient RL framework secretly brings you off-policy RL
  training"); verl `rollout_correction` token-level IS. `learner.old_logprobs: recompute` is this.
- `tis_seq`: w_i = min(rho_seq, C) on every token of sequence i; verl's sequence-level IS.
- `mis_token` / `mis_seq`: masked IS, w = rho if low <= rho <= C else 0, per token / per
  sequence (Liu et al. 2025, "When speed kills stability: demystifying RL collapse from the
  training-inference mismatch"; verl/slime rejection sampling): masking instead of truncation
  drops the gradient of far off-policy samples instead of keeping a biased one.
- `mis_geo`: geometric-mean sequence rejection: w_i = 1 if low <= rho_geo <= C else 0. The
  length-normalised ratio does not explode with length as rho_seq does (verl `geo_mean`).
- `icepop`: w_t = rho_t if low <= rho_t <= C else 0, two-sided token masking with IcePop's
  defaults [0.5, 5] (Ling team 2025, Ring-1T "IcePop"). Equal to `mis_token` at the same bounds.

What this does to GSPO's sequence ratio s_i = exp(mean_t log pi_theta / pi_old): with `naive`,
pi_old = mu and pi_theta = pi_prox at the step's start, so s_i starts at
exp(mean_t log pi_prox / mu) = rho_geo (staleness and engine gap inside the ratio, so GSPO's
tight clip, 3e-4 / 4e-4, clips almost every stale sequence and its gradient is zero; pinned by
`tests/learner/test_corrections.py`); with every other
correction s_i starts at 1 and the sequence's term is scaled by the mean of its tokens' weights
(`learner.algorithms.objectives.gspo_loss`): the sequence weight for sequence-level corrections, the
mean token weight (a token masked out lowers it by 1/|y_i|) for token-level ones.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from learner.algorithms.correction_spec import CorrectionSpec
from learner.algorithms.kl import LOG_RATIO_CLAMP
from learner.algorithms.masking import masked_mean

Stats = dict[str, float]


def _in_bounds(log_rho: Tensor, spec: CorrectionSpec) -> Tensor:
    """low <= rho <= cap, compared in log space (so a ratio exactly at a bound is kept)."""
    keep = torch.ones_like(log_rho, dtype=torch.bool)
    if spec.cap is not None:
        keep &= log_rho <= math.log(spec.cap)
    if spec.low > 0:
        keep &= log_rho >= math.log(spec.low)
    return keep


def _ess_frac(weights: Tensor, valid: Tensor) -> Tensor:
    """(sum w)^2 / (N sum w^2) over the valid entries: 1 for equal weights, 1/N for one survivor,
    0 when every weight is 0."""
    w = torch.where(valid, weights, 0.0).double()
    n = valid.sum().clamp_min(1)
    square_sum = w.square().sum()
    if square_sum == 0:
        return square_sum
    return w.sum().square() / (n * square_sum)


@torch.no_grad()
def correction_weights(
    spec: CorrectionSpec, proximal_lp: Tensor, behavior_lp: Tensor, mask: Tensor
) -> tuple[Tensor | None, Stats]:
    """The weights [B, T] the arm's objective multiplies (None for `naive` and `proximal`) and
    their stats.

    `proximal_lp` is pi_prox (learner recompute at the step's version), `behavior_lp` mu; both
    [B, T] on response positions `mask`. Weights are float32, 0 off the mask. Stats (keys of
    `contract.metrics` offpolicy/*): weight_mean (token mean; NaN without weights), ess_frac
    (over tokens, or over non-empty sequences for sequence-level corrections; without weights:
    of the raw rho_t, the staleness the step trains through unweighted), masked_frac and
    trunc_frac (shares of response tokens).
    """
    mask = mask.bool()
    log_rho = torch.where(mask, proximal_lp.float() - behavior_lp.float(), 0.0)
    log_rho = log_rho.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)  # (B, T)
    lengths = mask.sum(-1)  # (B,)
    if spec.level == "sequence":
        total = log_rho.sum(-1)  # (B,) log rho_seq
        log_unit = total / lengths.clamp_min(1) if spec.kind == "mis_geo" else total
        log_unit = log_unit.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        valid = lengths > 0  # (B,)
    else:
        log_unit, valid = log_rho, mask
    rho = torch.exp(log_unit)
    truncated = torch.zeros_like(valid)
    kept = valid
    if not spec.weighted:  # naive, proximal
        weights = None
        unit_weights = rho
    elif spec.kind in ("tis_token", "tis_seq"):
        assert spec.cap is not None
        truncated = valid & (log_unit > math.log(spec.cap))
        unit_weights = rho.clamp_max(spec.cap)
    elif spec.kind == "mis_geo":
        kept = valid & _in_bounds(log_unit, spec)
        unit_weights = kept.float()
    else:  # decoupled, mis_token, mis_seq, icepop: keep rho inside the bounds, 0 outside
        kept = valid & _in_bounds(log_unit, spec)
        unit_weights = torch.where(kept, rho, 0.0)
    unit_weights = torch.where(valid, unit_weights, 0.0)
    ess = _ess_frac(unit_weights, valid)
    if spec.level == "sequence":
        token_weights = torch.where(mask, unit_weights[:, None], 0.0)  # (B, T)
        masked_tokens = (valid & ~kept)[:, None] & mask
        truncated_tokens = truncated[:, None] & mask
    else:
        token_weights = unit_weights
        masked_tokens = valid & ~kept
        truncated_tokens = truncated
    if spec.weighted:
        weights = token_weights
    values = torch.stack(
        [
            masked_mean(token_weights, mask) if weights is not None else torch.tensor(math.nan),
            ess.float(),
            masked_mean(masked_tokens.float(), mask),
            masked_mean(truncated_tokens.float(), mask),
        ]
    ).tolist()
    keys = ("weight_mean", "ess_frac", "masked_frac", "trunc_frac")
    return weights, dict(zip(keys, values, strict=True))
