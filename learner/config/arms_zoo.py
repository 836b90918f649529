"""More arms: CISPO, SAPO, GMPO, Clip-Cov and KL-Cov, one config model each (design section 6).

Like `learner.config.arms`: each model holds only the settings its loss reads
(`learner.algorithms.objectives.POLICY_LOSSES[objective]`), with its paper's defaults, and
declares its behaviour as class variables. SAPO and KL-Cov have no clip range: their eps_low and
eps_high are class constants (inf, no clip), so a config that sets them is refused by name.
"""

from __future__ import annotations

import math
from typing import ClassVar, Literal

from pydantic import Field, model_validator

from learner.config.arm_base import GroupArm, register_arm
from learner.vocabulary import LossAggregation

_NO_AGG = "the aggregation is the paper's own (fixed)"


class _ClipFreeArm(GroupArm):
    """An objective without a clip range: eps_low/eps_high are not settings."""

    eps_low: ClassVar[float] = math.inf  # type: ignore[misc]
    eps_high: ClassVar[float] = math.inf  # type: ignore[misc]

    @classmethod
    def default_clip(cls) -> tuple[float, float]:
        return math.inf, math.inf


@register_arm
class CISPOArm(GroupArm):
    """CISPO (MiniMax-M1, arXiv:2506.13585, sec. 3.1): REINFORCE with a clipped, constant IS
    weight; every token keeps a gradient. Token-mean over the batch (eq. 4)."""

    fixed_aggregation: ClassVar[LossAggregation | None] = "token-mean"
    unread_hints: ClassVar[dict[str, str]] = {"agg": f"CISPO: {_NO_AGG}, token-mean"}

    objective: Literal["cispo"] = Field(description="Which policy objective the arm trains.")
    eps_low: float = Field(
        default=1.0,
        gt=0,
        le=1,
        description="IS weights below 1 - eps_low are raised to it. Default 1.0: no lower bound, "
        "as MiniMax-M1 (sec. 3.1: eps_low^IS set large, only eps_high^IS tuned).",
    )
    eps_high: float = Field(
        default=0.2,
        gt=0,
        description="IS weights above 1 + eps_high are capped there (gradient scaled, never "
        "zeroed). MiniMax-M1 reports no value; 0.2 is verl's CISPO example "
        "(examples/cispo_trainer), the usual token range.",
    )


@register_arm
class SAPOArm(_ClipFreeArm):
    """SAPO (Gao et al. 2025, arXiv:2511.20347): a sigmoid gate on the token ratio instead of a
    clip, with its own temperature per advantage sign. seq-mean-token-mean."""

    fixed_aggregation: ClassVar[LossAggregation | None] = "seq-mean-token-mean"
    unread_hints: ClassVar[dict[str, str]] = {
        "agg": f"SAPO: {_NO_AGG}, seq-mean-token-mean",
        "eps_low": "SAPO has no clip range: tau_pos/tau_neg set how fast its gate closes",
        "eps_high": "SAPO has no clip range: tau_pos/tau_neg set how fast its gate closes",
    }

    objective: Literal["sapo"] = Field(description="Which policy objective the arm trains.")
    tau_pos: float = Field(
        default=1.0,
        gt=0,
        description="Gate temperature for A > 0 (larger: gradient decays faster away from ratio "
        "1). SAPO paper default 1.0.",
    )
    tau_neg: float = Field(
        default=1.05,
        gt=0,
        description="Gate temperature for A <= 0; the paper takes it above tau_pos, since "
        "negative updates spread to many unsampled tokens. SAPO paper default 1.05.",
    )


@register_arm
class GMPOArm(GroupArm):
    """GMPO (Zhao et al. 2025, arXiv:2507.20673): the geometric mean of token ratios, each clipped
    in log space; a sequence-level objective (seq-mean-token-mean, like GSPO)."""

    fixed_aggregation: ClassVar[LossAggregation | None] = "seq-mean-token-mean"
    unread_hints: ClassVar[dict[str, str]] = {"agg": f"GMPO: {_NO_AGG}, one term per sequence"}

    objective: Literal["gmpo"] = Field(description="Which policy objective the arm trains.")
    eps_low: float = Field(
        default=0.4,
        gt=0,
        description="Log-space lower clip: token log-ratios below -eps_low are clipped (A < 0), "
        "i.e. ratios below e^-eps_low. GMPO paper default 0.4.",
    )
    eps_high: float = Field(
        default=0.4,
        gt=0,
        description="Log-space upper clip: token log-ratios above eps_high are clipped (A > 0), "
        "i.e. ratios above e^eps_high. GMPO paper default 0.4.",
    )


@register_arm
class ClipCovArm(GroupArm):
    """Clip-Cov (Cui et al. 2025, arXiv:2505.22617, sec. 4.3): PPO-clip, plus the gradient of a
    random r N of the tokens with covariance in (omega_low, omega_high) detached. token-mean."""

    fixed_aggregation: ClassVar[LossAggregation | None] = "token-mean"
    unread_hints: ClassVar[dict[str, str]] = {"agg": f"Clip-Cov: {_NO_AGG}, token-mean"}

    objective: Literal["clip_cov"] = Field(description="Which policy objective the arm trains.")
    eps_low: float = Field(
        default=1.0,
        gt=0,
        le=1,
        description="PPO lower clip range. Default 1.0 (no lower clip): the authors' Clip-Cov "
        "recipes (PRIME-RL/Entropy-Mechanism-of-RL, recipe/dapo/*_clip_cov.sh).",
    )
    eps_high: float = Field(
        default=1.0,
        gt=0,
        description="PPO upper clip range. Default 1.0, as the authors' Clip-Cov recipes.",
    )
    clip_fraction: float = Field(
        default=2e-4,
        ge=0,
        le=1,
        description="r: share of the batch's response tokens (at least one) whose gradient is "
        "detached; 0 turns the selection off. Paper default 2e-4.",
    )
    cov_low: float = Field(
        default=1.0, description="omega_low: candidates have covariance above it (paper: 1)."
    )
    cov_high: float = Field(
        default=5.0, description="omega_high: candidates have covariance below it (paper: 5)."
    )

    @model_validator(mode="after")
    def _check_cov_bounds(self) -> ClipCovArm:
        if not self.cov_low < self.cov_high:
            raise ValueError(
                f"arm {self.name!r}: cov_low={self.cov_low} must be below cov_high="
                f"{self.cov_high}, or no token is ever a candidate; e.g. 1.0 and 5.0"
            )
        return self


@register_arm
class KLCovArm(_ClipFreeArm):
    """KL-Cov (Cui et al. 2025, arXiv:2505.22617, sec. 4.3): the unclipped surrogate, with
    beta |log r| on the k N tokens of highest covariance. token-mean."""

    fixed_aggregation: ClassVar[LossAggregation | None] = "token-mean"
    unread_hints: ClassVar[dict[str, str]] = {
        "agg": f"KL-Cov: {_NO_AGG}, token-mean",
        "eps_low": "KL-Cov has no clip range: kl_fraction/kl_coef restrain the update",
        "eps_high": "KL-Cov has no clip range: kl_fraction/kl_coef restrain the update",
    }

    objective: Literal["kl_cov"] = Field(description="Which policy objective the arm trains.")
    kl_fraction: float = Field(
        default=2e-3,
        ge=0,
        le=1,
        description="k: share of the batch's response tokens (at least one), highest covariance "
        "first, that take the KL penalty; 0 turns it off. Default 2e-3, the authors' 7B recipe "
        "(k_percent 0.2; their 32B recipe uses 2e-4).",
    )
    kl_coef: float = Field(
        default=1.0,
        ge=0,
        description="beta of the penalty beta |log pi_theta - log pi_old| on the selected tokens; "
        "the authors' recipes use 1.",
    )
