"""Warnings for arms of one experiment that would train the same thing (design section 6)."""

from __future__ import annotations

import warnings

from learner.config.arm_base import ArmBase
from learner.config.shared import LearnerConfig


class EquivalentArmsWarning(UserWarning):
    """Two arms of one experiment train with the same loss value and gradient."""


def warn_equivalent_arms(arms: list[ArmBase], learner: LearnerConfig) -> list[str]:
    """Warn (EquivalentArmsWarning) for each pair of arms whose objectives coincide here.

    GSPO-token equals GSPO in value and gradient under sequence-level advantages (design
    section 6), which group advantages are, unless per-token weights separate them: a token-level
    correction (decoupled, tis_token, mis_token, icepop) gives each token its own weight, while
    naive, proximal and the sequence-level corrections weight all tokens of a sequence alike.
    Comparing such a pair (same correction) measures only their other settings, so it is most
    likely a mistake. Returns the messages.
    """
    by_objective: dict[str, list[ArmBase]] = {}
    for arm in arms:
        by_objective.setdefault(arm.objective, []).append(arm)
    messages = []
    for arm in arms:
        if arm.same_gradient_as is None or arm.advantages != "group":
            continue
        correction = arm.correction_for(learner)
        if correction.token_weights:
            continue  # per-token weights give the two objectives different gradients
        for other in by_objective.get(arm.same_gradient_as, []):
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


def _updates_per_step(settings: LearnerConfig) -> int:
    return settings.ppo_epochs * settings.minibatches


def warn_single_update(arms: list[ArmBase], learner: LearnerConfig) -> list[str]:
    """Warn (EquivalentArmsWarning) when one update per step makes the objectives' ratios moot.

    With ppo_epochs x minibatches = 1 and pi_old recomputed by the learner, the only update of a
    step is taken at pi_theta = pi_old: every ratio is exactly 1, no clip range ever engages, and
    GSPO-token and GRPO (seq-mean-token-mean) take the same gradient under the same per-token
    weights (GSPO too when the weights are per sequence). A GSPO-vs-GRPO comparison run that way
    measures only the corrections' weights and the clip-free paths, which is rarely intended.
    """
    recomputing = [
        arm
        for arm in arms
        if _updates_per_step(arm.training_settings(learner)) == 1
        and arm.advantages == "group"  # PPO's critic makes its own path
        and arm.aggregation == "seq-mean-token-mean"
        and arm.correction_for(learner).kind != "naive"
    ]
    if len({arm.objective for arm in recomputing}) < 2:
        return []
    names = ", ".join(f"{arm.name!r} ({arm.objective})" for arm in recomputing)
    message = (
        f"arms {names} recompute pi_old and take one update per step (learner.ppo_epochs x "
        "learner.minibatches = 1, or the arm's own): every ratio is exactly 1, no clipping "
        "engages, and their gradients differ only through their correction weights; set "
        "learner.minibatches >= 2 (or ppo_epochs >= 2) to compare the objectives"
    )
    warnings.warn(message, EquivalentArmsWarning, stacklevel=2)
    return [message]
