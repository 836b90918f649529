"""Per-token KL estimators and truncated importance weights for behaviour-vs-learner mismatch.

Estimators follow J. Schulman, "Approximating KL Divergence" (2020, joschu.net/blog/kl-approx):
for x ~ q and r = p(x) / q(x), KL(q || p) is estimated by
    k1 = -log r                (unbiased, high variance, can be negative)
    k2 = (log r)^2 / 2         (biased, low variance, always >= 0)
    k3 = (r - 1) - log r       (unbiased, low variance, always >= 0)
"""

from __future__ import annotations

from typing import get_args

import torch
from torch import Tensor

from learner.config import KLEstimator
from learner.masking import masked_mean

# KLEstimator (learner.config): Schulman's k1/k2/k3; `k3` is the default everywhere
# (unbiased and non-negative).

KL_ESTIMATORS: tuple[str, ...] = get_args(KLEstimator)

LOG_RATIO_CLAMP = 20.0
"""Log-ratios are clamped to [-20, 20] before exp: e^20 ~ 4.9e8 keeps float32 finite."""


def kl_from_log_ratio(log_ratio: Tensor, kind: KLEstimator) -> Tensor:
    """Per-token estimate of KL(q || p) from log r = log p(x) - log q(x), samples x ~ q.

    k1 = -log r,  k2 = (log r)^2 / 2,  k3 = exp(log r) - 1 - log r   (Schulman 2020).
    log r is clamped to [-20, 20] first (for every estimator, so they stay comparable and finite
    for any finite input); beyond that the estimate is meaningless anyway.
    """
    if kind not in KL_ESTIMATORS:
        raise ValueError(f"unknown KL estimator {kind!r}; choose one of {KL_ESTIMATORS}")
    log_ratio = log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    if kind == "k1":
        return -log_ratio
    if kind == "k2":
        return 0.5 * log_ratio.square()
    # expm1 keeps k3 accurate (and exactly 0) for tiny log-ratios where exp(x) - 1 cancels.
    return torch.expm1(log_ratio) - log_ratio


def kl(logprobs: Tensor, ref_logprobs: Tensor, kind: KLEstimator = "k3") -> Tensor:
    """Per-token estimate of KL(pi || ref) for tokens sampled from pi; shape as the inputs.

    With log r = log ref(y_t) - log pi(y_t):  k1 = -log r, k2 = (log r)^2 / 2,
    k3 = r - 1 - log r. Computed in float32; mask (e.g. with `masked_mean`) before reducing.
    """
    log_ratio = ref_logprobs.float() - logprobs.float()  # (B, T)
    return kl_from_log_ratio(log_ratio, kind)


def truncated_importance_weights(
    learner_logprobs: Tensor, behavior_logprobs: Tensor, mask: Tensor, cap: float
) -> tuple[Tensor, dict[str, float]]:
    """Truncated IS weights w_t = min(pi_learner(y_t) / pi_behavior(y_t), C), detached.

    Used with `old_logprobs: recompute`: pi_old is recomputed by the learner, but the tokens were
    sampled by the generator engine, whose numerics differ. Multiplying each per-token loss term
    by w_t corrects the sampling mismatch; truncating at C bounds the variance (truncated IS,
    Ionides 2008; applied to RL-for-LLM engine mismatch by Yao et al. 2025, "Your Efficient RL
    Framework Secretly Brings You Off-Policy RL Training").

    Returns weights [B, T] (float32, 0 outside the mask) and stats:
    `is_weight_mean` (truncated, token mean), `is_weight_max` (before truncation),
    `is_trunc_frac` (fraction of tokens capped) and `kl_behavior`
    (k3 estimate of KL(behavior || learner), token mean: the engine-mismatch metric).
    """
    if cap <= 0:
        raise ValueError(f"importance-weight cap must be > 0, got {cap}; a typical value is 2.0")
    with torch.no_grad():
        mask = mask.bool()
        log_ratio = torch.where(mask, learner_logprobs.float() - behavior_logprobs.float(), 0.0)
        log_ratio = log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)  # (B, T)
        raw = torch.exp(log_ratio)  # (B, T)
        weights = torch.where(mask, raw.clamp_max(cap), 0.0)  # (B, T)
        raw_max = torch.where(mask, raw, 0.0).amax() if mask.any() else raw.new_zeros(())
        values = torch.stack(
            [
                masked_mean(weights, mask),
                raw_max,
                masked_mean((raw > cap).float(), mask),
                masked_mean(kl_from_log_ratio(log_ratio, "k3"), mask),
            ]
        ).tolist()
    keys = ("is_weight_mean", "is_weight_max", "is_trunc_frac", "kl_behavior")
    return weights, dict(zip(keys, values, strict=True))
