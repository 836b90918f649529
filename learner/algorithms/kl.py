"""Per-token KL estimators (reference penalty, old-policy and behaviour gaps).

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

from learner.vocabulary import KLEstimator

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
