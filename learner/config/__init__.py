"""Configuration of the learner and of the arms it can train (design sections 5, 6).

`arm_base`: what every arm is, and the registry that dispatches an arm on its `objective`;
`arms` and `arms_zoo`: the built-in objective families, one model each; `shared`: the
settings every arm trains with; `equivalence`: warnings for arms that would train one thing.
Imports no torch, so loading a config stays cheap.
"""

from learner.config.arm_base import (
    ARM_MODELS,
    ArmBase,
    ArmConfig,
    GroupArm,
    arm_model,
    make_arm,
    objective_names,
    objective_of,
    register_arm,
    unregister_arm,
    validate_arm,
)
from learner.config.arms import GRPOArm, GSPOArm, GSPOTokenArm, PPOArm
from learner.config.arms_zoo import CISPOArm, ClipCovArm, GMPOArm, KLCovArm, SAPOArm
from learner.config.equivalence import (
    EquivalentArmsWarning,
    warn_equivalent_arms,
    warn_single_update,
)
from learner.config.shared import LearnerConfig, RolloutLogConfig, group_split_problem

__all__ = [
    "ARM_MODELS",
    "ArmBase",
    "ArmConfig",
    "CISPOArm",
    "ClipCovArm",
    "EquivalentArmsWarning",
    "GMPOArm",
    "GRPOArm",
    "GSPOArm",
    "GSPOTokenArm",
    "GroupArm",
    "KLCovArm",
    "LearnerConfig",
    "PPOArm",
    "RolloutLogConfig",
    "SAPOArm",
    "arm_model",
    "group_split_problem",
    "make_arm",
    "objective_names",
    "objective_of",
    "register_arm",
    "unregister_arm",
    "validate_arm",
    "warn_equivalent_arms",
    "warn_single_update",
]
