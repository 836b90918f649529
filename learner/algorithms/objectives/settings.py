"""The settings a policy objective reads, as structural types (no config, no torch).

An objective reads its arm: the frozen pydantic arm model of `learner.config.arms` is passed as
is. These Protocols say which attributes each family reads, so the math stays free of the
config (`learner.algorithms` imports no `learner.config`) and the settings exist once, as the
arm's fields. The arm models satisfy them structurally; a test or a notebook may pass any object
with the same attributes.

The aggregation's constant of Dr. GRPO (`max_len`, the generation cap) is not an arm setting:
the update's reducer takes it (`learner.algorithms.objectives.reduce.reduce_loss`).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from learner.vocabulary import KLEstimator, LossAggregation


@runtime_checkable
class PolicySettings(Protocol):
    """What every policy objective may read of its arm."""

    @property
    def eps_low(self) -> float:
        """Lower clip range: ratios below 1 - eps_low are clipped (for A < 0)."""
        ...

    @property
    def eps_high(self) -> float:
        """Upper clip range: ratios above 1 + eps_high are clipped (for A > 0)."""
        ...

    @property
    def aggregation(self) -> LossAggregation:
        """How per-token terms become one number (an arm's `agg`, or its objective's own)."""
        ...

    @property
    def beta(self) -> float:
        """KL-to-reference coefficient; 0 = no penalty (the KL is still measured when given)."""
        ...

    @property
    def kl_estimator(self) -> KLEstimator:
        """Estimator of the reference KL term (Schulman's k1/k2/k3)."""
        ...


@runtime_checkable
class SAPOSettings(PolicySettings, Protocol):
    """SAPO's soft-gate temperatures (`learner.algorithms.objectives.sapo`)."""

    @property
    def tau_pos(self) -> float:
        """Gate temperature of tokens with A > 0."""
        ...

    @property
    def tau_neg(self) -> float:
        """Gate temperature of tokens with A <= 0."""
        ...


@runtime_checkable
class ClipCovSettings(PolicySettings, Protocol):
    """Clip-Cov's token selection (`learner.algorithms.objectives.covariance`)."""

    @property
    def clip_fraction(self) -> float:
        """r: the share of response tokens (at least one, unless 0) whose gradient is cut."""
        ...

    @property
    def cov_low(self) -> float:
        """omega_low: only tokens with covariance strictly above it are candidates."""
        ...

    @property
    def cov_high(self) -> float:
        """omega_high: only tokens with covariance strictly below it are candidates."""
        ...


@runtime_checkable
class KLCovSettings(PolicySettings, Protocol):
    """KL-Cov's token selection and penalty (`learner.algorithms.objectives.covariance`)."""

    @property
    def kl_fraction(self) -> float:
        """k: the share of response tokens, highest covariance first, that take the penalty."""
        ...

    @property
    def kl_coef(self) -> float:
        """beta of the penalty beta * |log pi_theta - log pi_old| on the selected tokens."""
        ...
