"""The settings a policy objective reads, as one frozen value (no torch, no config).

The objectives are pure functions of (tensors..., options). An arm's config builds this value
once per step (`learner.config.arms`), so the math never sees pydantic models and the config
never imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from learner.vocabulary import KLEstimator, LossAggregation


@dataclass(frozen=True)
class ObjectiveOptions:
    """Every setting a policy objective reads.

    Clip defaults are not repeated here: they belong to each objective's arm config
    (`learner.config.arms`), as its paper gives them.
    """

    eps_low: float
    """Lower clip range: ratios below 1 - eps_low are clipped (for A < 0)."""
    eps_high: float
    """Upper clip range: ratios above 1 + eps_high are clipped (for A > 0); > eps_low is DAPO's
    clip-higher."""
    agg: LossAggregation = "seq-mean-token-mean"
    """Token aggregation (`learner.algorithms.masking`); GSPO's and PPO's are fixed by their arm."""
    max_len: int | None = None
    """Dr. GRPO's constant divisor, needed by `seq-mean-token-sum-norm` only."""
    beta: float = 0.0
    """KL-to-reference coefficient; 0 = no penalty (the KL is still measured when given)."""
    kl_estimator: KLEstimator = "k3"
    """Estimator of the reference KL term (Schulman's k1/k2/k3)."""
