"""The built-in arms: one config model per objective family (design section 6).

Each model holds only the settings its objective reads, with its paper's defaults as field
defaults, and declares its behaviour as class variables (`learner.config.arm_base.ArmBase`). The
loss itself is `learner.algorithms.objectives.POLICY_LOSSES[objective]`; adding an arm is one
loss function there plus one model here, registered with `register_arm`.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from learner.config.arm_base import ArmBase, GroupArm, register_arm
from learner.vocabulary import AdvantageKind, LossAggregation, Objective

_CLIP_GSPO = 3e-4, 4e-4  # Zheng et al. 2025, sec. 5.1: the sequence ratio is clipped tightly
_CLIP_PPO = 0.2, 0.2  # the usual token-level range (Schulman et al. 2017; Shao et al. 2024)


@register_arm
class GSPOArm(GroupArm):
    """GSPO (Zheng et al. 2025, arXiv:2507.18071): the clipped length-normalised sequence ratio."""

    fixed_aggregation: ClassVar[LossAggregation | None] = "seq-mean-token-mean"
    unread_hints: ClassVar[dict[str, str]] = {
        "agg": "GSPO averages its sequence terms over sequences (seq-mean-token-mean, fixed)"
    }

    objective: Literal["gspo"] = Field(description="Which policy objective the arm trains.")
    eps_low: float = Field(default=_CLIP_GSPO[0], gt=0, lt=1, description="Lower clip range.")
    eps_high: float = Field(default=_CLIP_GSPO[1], gt=0, description="Upper clip range.")


@register_arm
class GSPOTokenArm(GroupArm):
    """GSPO-token: GSPO's sequence ratio with a per-token gradient path and per-token
    advantages; equal to GSPO in value and gradient under sequence-level advantages."""

    fixed_aggregation: ClassVar[LossAggregation | None] = "seq-mean-token-mean"
    same_gradient_as: ClassVar[Objective | None] = "gspo"
    unread_hints: ClassVar[dict[str, str]] = GSPOArm.unread_hints

    objective: Literal["gspo_token"] = Field(description="Which policy objective the arm trains.")
    eps_low: float = Field(default=_CLIP_GSPO[0], gt=0, lt=1, description="Lower clip range.")
    eps_high: float = Field(default=_CLIP_GSPO[1], gt=0, description="Upper clip range.")


@register_arm
class GRPOArm(GroupArm):
    """GRPO (Shao et al. 2024) with its aggregations: original, DAPO's token-mean, Dr. GRPO's."""

    fixed_aggregation: ClassVar[LossAggregation | None] = None

    objective: Literal["grpo"] = Field(description="Which policy objective the arm trains.")
    eps_low: float = Field(default=_CLIP_PPO[0], gt=0, lt=1, description="Lower clip range.")
    eps_high: float = Field(default=_CLIP_PPO[1], gt=0, description="Upper clip range.")
    agg: LossAggregation = Field(
        default="seq-mean-token-mean",
        description="Token aggregation: `seq-mean-token-mean` (original GRPO), `token-mean` "
        "(DAPO), `seq-mean-token-sum-norm` (Dr. GRPO: divided by generation.max_new_tokens).",
    )

    @property
    def aggregation(self) -> LossAggregation:
        return self.agg


@register_arm
class PPOArm(ArmBase):
    """PPO with a critic (Schulman et al. 2017): GAE on the value model, whitened, per token."""

    advantages: ClassVar[AdvantageKind] = "gae"
    needs_value_model: ClassVar[bool] = True
    fixed_aggregation: ClassVar[LossAggregation | None] = "token-mean"  # CleanRL; PPO for LLMs
    unread_hints: ClassVar[dict[str, str]] = {
        "agg": "PPO's loss is a token mean (fixed)",
        "adv_norm": "PPO's advantages come from GAE on its critic, whitened per batch",
        "adv_estimator": "PPO's advantages come from GAE on its critic, whitened per batch",
    }

    training_fields: ClassVar[tuple[str, ...]] = (*ArmBase.training_fields, "value_lr")

    objective: Literal["ppo"] = Field(description="Which policy objective the arm trains.")
    eps_low: float = Field(default=_CLIP_PPO[0], gt=0, lt=1, description="Lower clip range.")
    eps_high: float = Field(default=_CLIP_PPO[1], gt=0, description="Upper clip range.")
    value_lr: float | None = Field(
        default=None, gt=0, description="This arm's critic learning rate; unset: learner.value_lr."
    )
