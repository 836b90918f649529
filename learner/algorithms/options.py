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


@dataclass(frozen=True, kw_only=True)
class SAPOOptions(ObjectiveOptions):
    """SAPO's soft-gate temperatures (`learner.algorithms.objectives.sapo`); no clip range."""

    tau_pos: float
    """Gate temperature of tokens with A > 0: larger decays the gradient faster off ratio 1."""
    tau_neg: float
    """Gate temperature of tokens with A <= 0; SAPO takes tau_neg > tau_pos."""


@dataclass(frozen=True, kw_only=True)
class ClipCovOptions(ObjectiveOptions):
    """Clip-Cov's token selection (`learner.algorithms.objectives.covariance`)."""

    clip_fraction: float
    """r: the share of response tokens (at least one, unless 0) whose gradient is detached."""
    cov_low: float
    """omega_low: only tokens with covariance strictly above it are candidates."""
    cov_high: float
    """omega_high: only tokens with covariance strictly below it are candidates."""


@dataclass(frozen=True, kw_only=True)
class KLCovOptions(ObjectiveOptions):
    """KL-Cov's token selection and penalty (`learner.algorithms.objectives.covariance`)."""

    kl_fraction: float
    """k: the share of response tokens (at least one, unless 0), highest covariance first, that
    take the KL penalty."""
    kl_coef: float
    """beta of the penalty beta * |log pi_theta - log pi_old| on the selected tokens."""
