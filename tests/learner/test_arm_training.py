"""Per-arm optimiser settings: an arm's own lr, gradient clip, minibatches and epochs override
`learner.*` for that arm alone, are refused by name where they do not fit, are part of the arm's
identity when set and invisible when not, and are what a real learner step trains with."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from buffer.collate import collate
from harness.config import ConfigError, load_config, resolved_dump, validate_config
from learner.config import LearnerConfig, make_arm, warn_single_update
from learner.runtime.models import build_step_models
from learner.runtime.step import train_on_batch
from tests.harness.trial_helpers import REPO
from tests.learner.test_step import GROUP_SIZE, on_policy_groups
from tests.learner.tiny import save_tiny_policy, tiny_policy

SHARED = LearnerConfig(prompts_per_step=4, minibatches=1, lr=1e-4, grad_clip=1.0)


def test_unset_overrides_keep_the_shared_settings_and_the_dump() -> None:
    arm = make_arm(name="g", objective="grpo")
    assert arm.training_settings(SHARED) is SHARED
    assert {"lr", "grad_clip", "minibatches", "ppo_epochs"}.isdisjoint(resolved_dump(arm))


def test_overrides_apply_to_their_arm_alone() -> None:
    control = make_arm(name="slow", objective="grpo", lr=1e-5, minibatches=2, grad_clip=5.0)
    settings = control.training_settings(SHARED)
    assert (settings.lr, settings.minibatches, settings.grad_clip, settings.ppo_epochs) == (
        1e-5,
        2,
        5.0,
        1,
    )
    assert settings.prompts_per_step == SHARED.prompts_per_step  # everything else is shared
    assert resolved_dump(control)["lr"] == 1e-5  # part of the arm's identity
    ppo = make_arm(name="p", objective="ppo", value_lr=1e-3)
    assert ppo.training_settings(SHARED).value_lr == 1e-3


def test_overrides_are_refused_by_name_where_they_do_not_fit() -> None:
    with pytest.raises(ValidationError, match=r"does not read value_lr \(only ppo arms take it\)"):
        make_arm(name="g", objective="gspo", value_lr=1e-3)
    with pytest.raises(ValidationError, match=r"lr\n.*greater than 0"):
        make_arm(name="g", objective="gspo", lr=0.0)
    too_many = [{"name": "g", "objective": "grpo", "minibatches": 8}]
    with pytest.raises(ConfigError, match=r"arm 'g' overrides \['minibatches'\]: .*exceeds"):
        validate_config({"arms": too_many, "learner": {"prompts_per_step": 4}})


def test_config_hash_changes_only_when_an_arm_sets_one() -> None:
    base = load_config(REPO / "configs" / "quickstart.yaml")
    same = load_config(REPO / "configs" / "quickstart.yaml", ["arms.grpo.lr=null"])
    tuned = load_config(REPO / "configs" / "quickstart.yaml", ["arms.grpo.lr=3e-4"])
    assert base.config_hash() == same.config_hash() != tuned.config_hash()


def test_single_update_warning_reads_each_arms_own_updates() -> None:
    arms = [
        make_arm(name="tok", objective="gspo_token", correction="decoupled"),
        make_arm(name="grpo", objective="grpo", correction="icepop"),
    ]
    with pytest.warns(UserWarning):
        assert len(warn_single_update(arms, SHARED)) == 1
    two = [arms[0], arms[1].model_copy(update={"minibatches": 2})]  # only tok takes one update
    assert warn_single_update(two, SHARED) == []


def test_a_learner_step_trains_with_the_arms_own_settings(tmp_path) -> None:
    """minibatches 2 on the arm: two updates though learner.minibatches is 1; its lr reaches the
    optimiser; its grad_clip (1e-6) is the norm of the gradient each optimiser step applies."""
    model_dir = save_tiny_policy(tmp_path / "model")
    arm = make_arm(name="g", objective="grpo", minibatches=2, lr=3e-2, grad_clip=1e-6)
    settings = arm.training_settings(SHARED)
    models = build_step_models(model_dir, arm, settings, total_steps=2)
    assert models.policy.optimizer.param_groups[0]["lr"] == pytest.approx(3e-2)
    applied: list[float] = []

    def record_applied_norm(optimizer, *_args) -> None:
        grads = [p.grad for group in optimizer.param_groups for p in group["params"]]
        applied.append(float(torch.linalg.vector_norm(torch.cat([g.flatten() for g in grads]))))

    models.policy.optimizer.register_step_pre_hook(record_applied_norm)
    batch = collate(on_policy_groups(tiny_policy(), 4), pad_id=0)
    result = train_on_batch(
        models, batch, arm=arm, learner=settings, group_size=GROUP_SIZE, max_len=8, version=0
    )
    assert len(result.grad_norms) == len(applied) == 2  # the arm's minibatches
    assert all(norm > 1e-3 for norm in result.grad_norms)  # pre-clip norms, far above the clip
    assert applied == pytest.approx([1e-6, 1e-6], rel=1e-3)  # clipped to the arm's grad_clip
