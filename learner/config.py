"""Configuration of the learner and of the arms it can train (design sections 5, 6)."""

from __future__ import annotations

import re
import warnings
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

# The arm vocabulary (objective names, aggregations, ...) is declared with the arm registry and
# re-exported here, where the rest of the learner has always imported it from.
from learner.arms import AdvantageNorm, KLEstimator, LossAggregation, Objective, arm_spec

__all__ = [
    "AdvantageNorm",
    "ArmConfig",
    "EquivalentArmsWarning",
    "KLEstimator",
    "LRSchedule",
    "LearnerConfig",
    "LossAggregation",
    "Objective",
    "OldLogprobs",
    "RoutingReplay",
    "warn_equivalent_arms",
]

OldLogprobs = Literal["behavior", "recompute"]
LRSchedule = Literal["constant", "cosine"]
RoutingReplay = Literal["off", "old"]

_ARM_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


class ArmConfig(BaseModel):
    """One arm: an objective and its settings. Everything else is shared by all arms."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="Unique arm name (letters, digits, `_.-`), used in paths.")
    objective: Objective = Field(description="Which policy objective the arm trains.")
    eps_low: float | None = Field(
        default=None,
        gt=0,
        description="Lower clip range; default per objective (`learner.arms`: GSPO 3e-4, "
        "GRPO/PPO 0.2).",
    )
    eps_high: float | None = Field(
        default=None,
        gt=0,
        description="Upper clip range; default per objective (`learner.arms`: GSPO 4e-4, "
        "GRPO/PPO 0.2).",
    )
    agg: LossAggregation = Field(
        default="seq-mean-token-mean",
        description="Token aggregation of GRPO (`token-mean` = DAPO, `seq-mean-token-sum-norm` = "
        "Dr. GRPO). PPO always uses `token-mean`; no effect for GSPO.",
    )
    adv_norm: AdvantageNorm = Field(
        default="std",
        description="Group advantage normalisation: divide by the group std (GRPO/GSPO) or only "
        "subtract the group mean (Dr. GRPO). No effect for PPO (GAE).",
    )
    beta: float = Field(default=0.0, ge=0, description="KL-to-reference coefficient; 0 = off.")
    kl_estimator: KLEstimator = Field(
        default="k3", description="KL estimator for the reference term (Schulman's k1/k2/k3)."
    )
    routing_replay: RoutingReplay = Field(
        default="off",
        description="MoE only: `old` reuses the old policy's top-k experts in the new forward.",
    )

    @model_validator(mode="after")
    def _fill_defaults(self) -> ArmConfig:
        if not _ARM_NAME.match(self.name):
            raise ValueError(f"arm name {self.name!r} may only hold letters, digits and `_.-`")
        low, high = arm_spec(self.objective).default_clip
        if self.eps_low is None:
            self.eps_low = low
        if self.eps_high is None:
            self.eps_high = high
        if self.eps_low >= 1:
            raise ValueError(f"eps_low={self.eps_low} must be < 1 (ratios are positive)")
        return self


class LearnerConfig(BaseModel):
    """Optimisation settings shared by every arm, so arms differ only in their objective."""

    model_config = ConfigDict(extra="forbid")

    steps: int = Field(default=20, gt=0, description="Learner steps (policy versions) per trial.")
    prompts_per_step: int = Field(
        default=8, gt=0, description="Groups (prompts) consumed per learner step."
    )
    lr: float = Field(default=1e-4, gt=0, description="AdamW learning rate of the policy.")
    value_lr: float = Field(default=3e-4, gt=0, description="PPO value model learning rate.")
    weight_decay: float = Field(default=0.0, ge=0, description="AdamW weight decay.")
    betas: tuple[float, float] = Field(default=(0.9, 0.999), description="AdamW betas.")
    warmup_steps: int = Field(default=0, ge=0, description="Linear warm-up length, in updates.")
    schedule: LRSchedule = Field(default="constant", description="LR after warm-up.")
    grad_clip: float = Field(default=1.0, gt=0, description="Global gradient-norm clip.")
    ppo_epochs: int = Field(default=1, gt=0, description="Passes over each step's batch.")
    minibatches: int = Field(default=1, gt=0, description="Minibatches per pass (updates).")
    old_logprobs: OldLogprobs = Field(
        default="behavior",
        description="`behavior`: the generator's logprobs are pi_old. `recompute`: pi_old is "
        "recomputed by the learner at step start and a truncated IS weight (cap `is_cap`) "
        "corrects behaviour-vs-learner mismatch.",
    )
    is_cap: float = Field(default=2.0, gt=0, description="Truncation cap C of the IS weight.")
    gamma: float = Field(default=1.0, ge=0, le=1, description="PPO GAE discount.")
    lam: float = Field(default=0.95, ge=0, le=1, description="PPO GAE lambda.")
    value_clip: float = Field(default=0.2, gt=0, description="PPO value-loss clip range.")
    eval_every: int = Field(
        default=5, gt=0, description="Steps between greedy evals (of task.eval_size prompts)."
    )
    checkpoint_every: int = Field(default=10, gt=0, description="Steps between checkpoints.")
    grad_spike_factor: float = Field(
        default=5.0, gt=1, description="A grad norm over this x the rolling median is a spike."
    )
    keep_versions: int = Field(
        default=3, gt=0, description="Weight-store versions kept on disk (older are removed)."
    )
    threads: int = Field(
        default=1, gt=0, description="torch intra-op threads of the learner process (CPU)."
    )
    device: Literal["cpu", "cuda"] = Field(default="cpu", description="Learner device.")

    @model_validator(mode="after")
    def _check(self) -> LearnerConfig:
        if self.minibatches > self.prompts_per_step:
            raise ValueError(
                f"learner.minibatches={self.minibatches} exceeds learner.prompts_per_step="
                f"{self.prompts_per_step}; each minibatch needs at least one group"
            )
        return self


class EquivalentArmsWarning(UserWarning):
    """Two arms of one experiment train with the same loss value and gradient."""


def warn_equivalent_arms(arms: list[ArmConfig], learner: LearnerConfig) -> list[str]:
    """Warn (EquivalentArmsWarning) for each pair of arms whose objectives coincide here.

    GSPO-token equals GSPO in value and gradient under sequence-level advantages (design
    section 6), which group advantages are; per-token IS weights (`old_logprobs: recompute`)
    are the one thing that separates them. Comparing such a pair measures only their other
    settings, so it is most likely a mistake. Returns the messages.
    """
    if learner.old_logprobs == "recompute":
        return []  # per-token IS weights give the two objectives different gradients
    by_objective: dict[str, list[ArmConfig]] = {}
    for arm in arms:
        by_objective.setdefault(arm.objective, []).append(arm)
    messages = []
    for arm in arms:
        spec = arm_spec(arm.objective)
        if spec.same_gradient_as is None or spec.advantages != "group":
            continue
        for other in by_objective.get(spec.same_gradient_as, []):
            messages.append(
                f"arms {other.name!r} ({other.objective}) and {arm.name!r} ({arm.objective}) "
                f"train one objective: under sequence-level (group) advantages and "
                f"learner.old_logprobs=behavior, {arm.objective} takes the same loss value and "
                f"gradient as {other.objective} (design section 6), so any difference between "
                f"the arms comes from their other settings (clip range, KL); drop one, or keep "
                f"both only as an equivalence check"
            )
    for message in messages:
        warnings.warn(message, EquivalentArmsWarning, stacklevel=2)
    return messages
