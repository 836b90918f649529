"""Arms as typed variants: every objective has a model, its declared behaviour, the frozen arm
as the settings its objective reads, settings it does not read refused by name, and the warning
for arms that train one objective."""

from __future__ import annotations

import math
import re
import subprocess
import sys
import warnings
from pathlib import Path
from typing import get_args

import pytest
from pydantic import ValidationError

from learner.algorithms import objectives
from learner.algorithms.masking import LOSS_AGGREGATIONS
from learner.algorithms.objectives import POLICY_LOSSES, PolicySettings
from learner.config import (
    ARM_MODELS,
    EquivalentArmsWarning,
    LearnerConfig,
    arm_model,
    make_arm,
    warn_equivalent_arms,
    warn_single_update,
)
from learner.runtime.step import loss_units
from learner.vocabulary import Objective

ROOT = Path(__file__).resolve().parents[2]

# objective: (advantages, critic, default clip, loss units under each agg it takes)
DECLARED = {
    "gspo": ("group", False, (3e-4, 4e-4), {"sequences"}),
    "gspo_token": ("group", False, (3e-4, 4e-4), {"sequences"}),
    "grpo": ("group", False, (0.2, 0.2), {"tokens", "sequences"}),
    "ppo": ("gae", True, (0.2, 0.2), {"tokens"}),
    "cispo": ("group", False, (1.0, 0.2), {"tokens"}),
    "sapo": ("group", False, (math.inf, math.inf), {"sequences"}),  # no clip range
    "gmpo": ("group", False, (0.4, 0.4), {"sequences"}),  # in log space
    "clip_cov": ("group", False, (1.0, 1.0), {"tokens"}),
    "kl_cov": ("group", False, (math.inf, math.inf), {"tokens"}),  # no clip range
}


def test_every_objective_is_registered_under_its_name() -> None:
    assert set(ARM_MODELS) == set(get_args(Objective)) == set(DECLARED) == set(POLICY_LOSSES)
    for name, model in ARM_MODELS.items():
        assert make_arm(name="a", objective=name).objective == name
        assert type(make_arm(name="a", objective=name)) is model
        assert POLICY_LOSSES[name] is getattr(objectives, f"{name}_loss")


@pytest.mark.parametrize("name", sorted(DECLARED))
def test_declared_properties(name: str) -> None:
    advantages, critic, clip, units = DECLARED[name]
    spec = arm_model(name)
    assert (spec.advantages, spec.needs_value_model, spec.default_clip()) == (
        advantages,
        critic,
        clip,
    )
    takes_agg = "agg" in spec.model_fields
    aggs = LOSS_AGGREGATIONS if takes_agg else [None]
    arms = [make_arm(name="a", objective=name, **({"agg": a} if a else {})) for a in aggs]
    assert {arm.loss_units for arm in arms} == units
    # Only GRPO lets the arm choose its aggregation; the others declare theirs.
    assert takes_agg == (spec.fixed_aggregation is None) == (name == "grpo")
    arm = make_arm(name="a", objective=name)
    assert (arm.eps_low, arm.eps_high) == clip  # the one declaration of the defaults


def test_loss_units_per_aggregation() -> None:
    assert loss_units(make_arm(name="a", objective="grpo", agg="token-mean")) == "tokens"
    assert loss_units(make_arm(name="a", objective="grpo")) == "sequences"
    dr_grpo = make_arm(name="a", objective="grpo", agg="seq-mean-token-sum-norm")
    assert loss_units(dr_grpo) == "sequences"
    # GSPO is a mean over sequences, PPO a token mean: both fixed (agg is refused, below).
    assert loss_units(make_arm(name="a", objective="gspo")) == "sequences"
    assert loss_units(make_arm(name="a", objective="ppo")) == "tokens"


def test_unknown_objective_names_the_registered_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown objective 'dpo'.*gspo_token"):
        arm_model("dpo")
    with pytest.raises(ValidationError, match=r"objective\n.*unknown objective 'dpo'.*gspo_token"):
        make_arm(name="a", objective="dpo")


SETTINGS = ("eps_low", "eps_high", "aggregation", "beta", "kl_estimator")


def test_the_arm_is_the_settings_its_objective_reads() -> None:
    arm = make_arm(
        name="a", objective="grpo", eps_high=0.28, agg="seq-mean-token-sum-norm", beta=0.1,
        kl_estimator="k2",
    )  # fmt: skip
    assert isinstance(arm, PolicySettings)
    assert tuple(getattr(arm, name) for name in SETTINGS) == (
        0.2, 0.28, "seq-mean-token-sum-norm", 0.1, "k2",
    )  # fmt: skip
    ppo = make_arm(name="p", objective="ppo")
    assert tuple(getattr(ppo, name) for name in SETTINGS) == (0.2, 0.2, "token-mean", 0.0, "k3")


@pytest.mark.parametrize("name", sorted(DECLARED))
def test_settings_an_objective_does_not_take_are_refused_by_name(name: str) -> None:
    base = make_arm(name="a", objective=name)
    assert isinstance(base, PolicySettings) and base == arm_model(name)(name="a", objective=name)
    if "agg" in arm_model(name).model_fields:
        other = make_arm(name="a", objective=name, agg="token-mean")
        assert other.aggregation == "token-mean"
    else:  # an ignored setting would pass silently: it is an error naming it and its readers
        with pytest.raises(ValidationError, match=r"does not read agg \(.*only grpo arms take"):
            make_arm(name="a", objective=name, agg="token-mean")


def test_unread_settings_name_the_objectives_that_read_them() -> None:
    with pytest.raises(ValidationError, match=r"arm 'p' \(ppo\) does not read adv_norm \(PPO's"):
        make_arm(name="p", objective="ppo", adv_norm="mean_only")
    with pytest.raises(ValidationError, match=r"eps_lo \(not a setting of any arm\).*eps_low"):
        make_arm(name="g", objective="gspo", eps_lo=0.1)
    # The shared settings stay valid on every arm.
    for name in DECLARED:
        make_arm(name="a", objective=name, beta=0.1, correction="tis_seq", routing_replay="old")


def test_shipped_configs_validate() -> None:
    from harness.config import load_config

    for path in sorted((ROOT / "configs").glob("*.yaml")):  # objective_zoo.yaml: a plugin
        assert load_config(path).arms, path


def test_arms_are_frozen() -> None:
    arm = make_arm(name="g", objective="gspo")
    with pytest.raises(ValidationError, match="frozen"):
        arm.eps_low = 0.1  # type: ignore[misc]


def test_gspo_and_gspo_token_arms_warn_that_they_train_one_objective() -> None:
    arms = [make_arm(name="g", objective="gspo"), make_arm(name="t", objective="gspo_token")]
    with pytest.warns(EquivalentArmsWarning, match=r"'g' \(gspo\) and 't' \(gspo_token\)"):
        messages = warn_equivalent_arms(arms, LearnerConfig())
    assert len(messages) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning in the cases below
        # Per-token IS weights (recompute) give GSPO-token its own gradient.
        assert warn_equivalent_arms(arms, LearnerConfig(old_logprobs="recompute")) == []
        alone = [make_arm(name="t", objective="gspo_token"), make_arm(name="r", objective="grpo")]
        assert warn_equivalent_arms(alone, LearnerConfig()) == []


def test_experiment_config_validation_warns() -> None:
    from harness.config import ExperimentConfig

    arms = [{"name": "g", "objective": "gspo"}, {"name": "t", "objective": "gspo_token"}]
    with pytest.warns(EquivalentArmsWarning, match="design section 6"):
        ExperimentConfig.model_validate({"arms": arms, "generation": {"backend": "torch"}})


def test_config_loading_does_not_import_torch() -> None:
    """The arm models are torch-free; the losses live in `learner.algorithms.objectives`."""
    code = (
        "import sys, learner.config as c; c.make_arm(name='a', objective='gspo'); "
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
        make_arm(name="tok", objective="gspo_token", correction="decoupled"),
        make_arm(name="grpo", objective="grpo", correction="icepop"),
    ]
    with pytest.warns(EquivalentArmsWarning, match=r"'tok' \(gspo_token\), 'grpo' \(grpo\)"):
        assert len(warn_single_update(arms, LearnerConfig(minibatches=1))) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert warn_single_update(arms, LearnerConfig(minibatches=2)) == []
        assert warn_single_update(arms, LearnerConfig(ppo_epochs=2)) == []
        naive = [arm.model_copy(update={"correction": "naive"}) for arm in arms]
        assert warn_single_update(naive, LearnerConfig()) == []  # pi_old = mu: ratios move
        dapo = [arms[0], make_arm(name="dapo", objective="grpo", agg="token-mean")]
        assert warn_single_update(dapo, LearnerConfig()) == []  # token-mean weighs differently
        assert warn_single_update(arms[:1], LearnerConfig()) == []  # nothing to compare
