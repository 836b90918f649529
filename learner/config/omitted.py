"""The learner's config fields left out of a resolved config while at their default.

Each was added after configs had been written: left out at the default that means "as before",
it changes neither an existing config's hash nor its `resolved_config.yaml`
(`contract.config_dump`; `harness.config` adds the harness's rows). Also left out: `adv_norm`
of a group arm whose estimator does not read it, and `adv_std` of one that divides by no group
std, so that a resolved arm validates again. `adv_std` is the exception to "as before": it is
kept wherever it is read, because its default changed what those arms compute.
"""

from __future__ import annotations

from contract.config_dump import OmitAtDefault
from learner.config.arm_base import ArmBase, GroupArm
from learner.config.arm_staleness import ArmStaleness
from learner.config.arm_training import TrainingOverrides
from learner.config.arms import PPOArm
from learner.config.shared import LearnerConfig, RolloutLogConfig


def _estimator_ignores_adv_norm(arm: GroupArm) -> bool:
    return arm.adv_estimator != "group"


def _advantages_ignore_adv_std(arm: GroupArm) -> bool:
    return not arm.reads_adv_std()


OMITTED_AT_DEFAULT: tuple[OmitAtDefault, ...] = (
    # scale and memory options of the shared settings
    OmitAtDefault(LearnerConfig, "micro_batch_tokens", None),
    OmitAtDefault(LearnerConfig, "logprob_chunk_tokens", None),
    OmitAtDefault(LearnerConfig, "parallel", "ddp"),
    OmitAtDefault(LearnerConfig, "dtype", "float32"),
    OmitAtDefault(LearnerConfig, "activation_checkpointing", False),
    OmitAtDefault(LearnerConfig, "cpu_offload", False),
    OmitAtDefault(LearnerConfig, "optimizer_impl", "auto"),
    # what the trial writes besides its results: the rollout log, every step
    OmitAtDefault(LearnerConfig, "rollout_log", RolloutLogConfig()),
    # an arm's optimiser overrides, unset: it trains with `learner.*`
    *(OmitAtDefault(TrainingOverrides, name, None) for name in TrainingOverrides.training_fields),
    OmitAtDefault(PPOArm, "value_lr", None),
    # an arm's own staleness regime, unset: the experiment's (`learner.config.arm_staleness`)
    OmitAtDefault(ArmBase, "staleness", None),
    *(OmitAtDefault(ArmStaleness, name, None) for name in ArmStaleness.model_fields),
    # group arms: the estimator and DAPO's dynamic sampling, off
    OmitAtDefault(GroupArm, "adv_estimator", "group"),
    OmitAtDefault(GroupArm, "adv_norm", "std", when=_estimator_ignores_adv_norm),
    # Kept wherever it is read, so every arm dividing by a group std got a new hash when the
    # default became `unbiased` (issue 37): its advantages changed; other arms kept theirs.
    OmitAtDefault(GroupArm, "adv_std", "unbiased", when=_advantages_ignore_adv_std),
    OmitAtDefault(GroupArm, "dynamic_sampling_rounds", 0),
)
"""(model, field, default) rows; a row applies to the model's subclasses (plugin arms) too."""
