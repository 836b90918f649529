"""Configuration of the learner and of the arms it can train (design sections 5, 6).

`arms`: one model per objective family, a union discriminated by `objective`; `shared`: the
settings every arm trains with; `equivalence`: warnings for arms that would train one thing.
Imports no torch, so loading a config stays cheap.
"""

from learner.config.arms import (
    ARM_MODELS,
    ArmBase,
    ArmConfig,
    GroupArm,
    GRPOArm,
    GSPOArm,
    GSPOTokenArm,
    PPOArm,
    arm_model,
    default_options,
    make_arm,
    objective_names,
    register_arm,
    validate_arm,
)
from learner.config.equivalence import (
    EquivalentArmsWarning,
    warn_equivalent_arms,
    warn_single_update,
)
from learner.config.shared import LearnerConfig

__all__ = [
    "ARM_MODELS",
    "ArmBase",
    "ArmConfig",
    "EquivalentArmsWarning",
    "GRPOArm",
    "GSPOArm",
    "GSPOTokenArm",
    "GroupArm",
    "LearnerConfig",
    "PPOArm",
    "arm_model",
    "default_options",
    "make_arm",
    "objective_names",
    "register_arm",
    "validate_arm",
    "warn_equivalent_arms",
    "warn_single_update",
]
