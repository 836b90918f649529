"""The arm registry: every objective registered, its declared behaviour, options built from the
config, and the warning for arms that train one objective."""

from __future__ import annotations

import re
import subprocess
import sys
import warnings
from pathlib import Path
from typing import get_args

import pytest

from learner import objectives
from learner.arms import ARMS, Objective, ObjectiveOptions, arm_spec, objective_options
from learner.config import (
    ArmConfig,
    EquivalentArmsWarning,
    LearnerConfig,
    warn_equivalent_arms,
    warn_single_update,
)
from learner.masking import LOSS_AGGREGATIONS
from learner.step import loss_units

ROOT = Path(__file__).resolve().parents[2]

# objective: (advantages, critic, default clip, loss units under each agg of ArmConfig)
DECLARED = {
    "gspo": ("group", False, (3e-4, 4e-4), {"sequences"}),
    "gspo_token": ("group", False, (3e-4, 4e-4), {"sequences"}),
    "grpo": ("group", False, (0.2, 0.2), {"tokens", "sequences"}),
    "ppo": ("gae", True, (0.2, 0.2), {"tokens"}),
}


def test_every_objective_is_registered_under_its_name() -> None:
    assert set(ARMS) == set(get_args(Objective)) == set(DECLARED)
    for name, spec in ARMS.items():
        assert spec.objective == name
        assert spec.loss is getattr(objectives, f"{name}_loss")


@pytest.mark.parametrize("name", sorted(DECLARED))
def test_declared_properties(name: str) -> None:
    advantages, critic, clip, units = DECLARED[name]
    spec = arm_spec(name)
    assert (spec.advantages, spec.needs_value_model, spec.default_clip) == (
        advantages,
        critic,
        clip,
    )
    assert {spec.loss_units(agg) for agg in LOSS_AGGREGATIONS} == units
    # Only GRPO lets the arm choose its aggregation; the others declare theirs.
    assert ("agg" in spec.options) == (spec.aggregation is None) == (name == "grpo")
    arm = ArmConfig(name="a", objective=name)
    assert (arm.eps_low, arm.eps_high) == clip  # the one declaration of the defaults


def test_loss_units_per_aggregation() -> None:
    assert loss_units(ArmConfig(name="a", objective="grpo", agg="token-mean")) == "tokens"
    assert loss_units(ArmConfig(name="a", objective="grpo")) == "sequences"
    dr_grpo = ArmConfig(name="a", objective="grpo", agg="seq-mean-token-sum-norm")
    assert loss_units(dr_grpo) == "sequences"
    # agg has no effect on GSPO (a mean over sequences) nor on PPO (a token mean).
    assert loss_units(ArmConfig(name="a", objective="gspo", agg="token-mean")) == "sequences"
    assert loss_units(ArmConfig(name="a", objective="ppo")) == "tokens"


def test_unknown_objective_names_the_registered_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown objective 'dpo'.*gspo_token"):
        arm_spec("dpo")


def test_options_are_built_once_from_the_arm() -> None:
    arm = ArmConfig(
        name="a", objective="grpo", eps_high=0.28, agg="seq-mean-token-sum-norm", beta=0.1,
        kl_estimator="k2",
    )  # fmt: skip
    assert objective_options(arm, max_len=16) == ObjectiveOptions(
        eps_low=0.2, eps_high=0.28, agg="seq-mean-token-sum-norm", max_len=16, beta=0.1,
        kl_estimator="k2",
    )  # fmt: skip
    assert objective_options(ArmConfig(name="p", objective="ppo"), max_len=16) == ObjectiveOptions(
        eps_low=0.2, eps_high=0.2, agg="token-mean"
    )


@pytest.mark.parametrize("name", sorted(DECLARED))
def test_settings_an_objective_does_not_take_change_nothing(name: str) -> None:
    spec = arm_spec(name)
    base = objective_options(ArmConfig(name="a", objective=name), max_len=16)
    assert base == spec.default_options(max_len=16)
    other = objective_options(ArmConfig(name="a", objective=name, agg="token-mean"), max_len=32)
    if "agg" in spec.options:
        assert (other.agg, other.max_len) == ("token-mean", 32)
    else:
        assert other == base


def test_options_are_frozen() -> None:
    options = arm_spec("gspo").default_options()
    with pytest.raises(AttributeError):
        options.eps_low = 0.1  # type: ignore[misc]


def test_gspo_and_gspo_token_arms_warn_that_they_train_one_objective() -> None:
    arms = [ArmConfig(name="g", objective="gspo"), ArmConfig(name="t", objective="gspo_token")]
    with pytest.warns(EquivalentArmsWarning, match=r"'g' \(gspo\) and 't' \(gspo_token\)"):
        messages = warn_equivalent_arms(arms, LearnerConfig())
    assert len(messages) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning in the cases below
        # Per-token IS weights (recompute) give GSPO-token its own gradient.
        assert warn_equivalent_arms(arms, LearnerConfig(old_logprobs="recompute")) == []
        alone = [ArmConfig(name="t", objective="gspo_token"), ArmConfig(name="r", objective="grpo")]
        assert warn_equivalent_arms(alone, LearnerConfig()) == []


def test_experiment_config_validation_warns() -> None:
    from harness.config import ExperimentConfig

    arms = [{"name": "g", "objective": "gspo"}, {"name": "t", "objective": "gspo_token"}]
    with pytest.warns(EquivalentArmsWarning, match="design section 6"):
        ExperimentConfig.model_validate({"arms": arms, "generation": {"backend": "torch"}})


def test_config_loading_does_not_import_torch() -> None:
    """The registry is torch-free; losses load on first use of `ArmSpec.loss`."""
    code = (
        "import sys, learner.config as c; c.ArmConfig(name='a', objective='gspo'); "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=60)


def test_no_objective_name_branches_outside_the_registry() -> None:
    """The learner, harness and analysis ask declared properties, never `objective == ...`."""
    pattern = re.compile(r"objective\s*(==|!=|in\s*[({\[])\s*")
    offenders = [
        f"{path.relative_to(ROOT)}:{number}"
        for package in ("learner", "harness", "analysis")
        for path in sorted((ROOT / package).rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert offenders == []


def test_one_update_per_step_with_a_recomputed_pi_old_warns_that_ratios_are_one() -> None:
    arms = [
        ArmConfig(name="tok", objective="gspo_token", correction="decoupled"),
        ArmConfig(name="grpo", objective="grpo", correction="icepop"),
    ]
    with pytest.warns(EquivalentArmsWarning, match=r"'tok' \(gspo_token\), 'grpo' \(grpo\)"):
        assert len(warn_single_update(arms, LearnerConfig(minibatches=1))) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert warn_single_update(arms, LearnerConfig(minibatches=2)) == []
        assert warn_single_update(arms, LearnerConfig(ppo_epochs=2)) == []
        naive = [arm.model_copy(update={"correction": "naive"}) for arm in arms]
        assert warn_single_update(naive, LearnerConfig()) == []  # pi_old = mu: ratios move
        dapo = [arms[0], ArmConfig(name="dapo", objective="grpo", agg="token-mean")]
        assert warn_single_update(dapo, LearnerConfig()) == []  # token-mean weighs differently
        assert warn_single_update(arms[:1], LearnerConfig()) == []  # nothing to compare
