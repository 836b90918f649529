"""One learner step per arm on a tiny real model: finite, updates weights, right diagnostics."""

from __future__ import annotations

import math

import pytest
import torch

from buffer.collate import collate
from contract import metrics as M
from learner.config import LearnerConfig, arm_model, make_arm
from learner.runtime.forward import policy_logprobs
from learner.runtime.models import build_step_models
from learner.runtime.step import DivergenceError, compute_advantages, train_on_batch
from tests.learner.tiny import random_groups, save_tiny_policy, tiny_policy

GROUP_SIZE = 4


def on_policy_groups(model, n_groups: int):
    """Behaviour logprobs computed by the policy itself: the step starts exactly on-policy."""

    def logprobs(prompt, response):
        ids = torch.tensor([prompt + response])
        with torch.no_grad():
            lp, _ = policy_logprobs(model, ids, torch.ones_like(ids))
        return lp[0, len(prompt) :].tolist()

    return random_groups(n_groups, GROUP_SIZE, seed=1, with_logprobs=logprobs)


def one_step(model_dir, objective: str, **settings):
    """One step of a fresh arm on 4 on-policy groups: (result, weights before, weights after)."""
    arm = make_arm(name=objective, objective=objective, **settings)
    cfg = LearnerConfig(prompts_per_step=4, minibatches=2, lr=1e-2, old_logprobs="recompute")
    models = build_step_models(model_dir, arm, cfg, total_steps=3)
    before = [p.detach().clone() for p in models.policy.module.parameters()]
    batch = collate(on_policy_groups(tiny_policy(), 4), pad_id=0)
    result = train_on_batch(
        models, batch, arm=arm, learner=cfg, group_size=GROUP_SIZE, max_len=8, version=0
    )
    return result, before, list(models.policy.module.parameters())


@pytest.mark.parametrize("objective", ["gspo", "gspo_token", "grpo", "ppo"])
def test_one_step_per_arm(tmp_path, objective: str) -> None:
    result, before, after = one_step(save_tiny_policy(tmp_path / "model"), objective)
    m = result.metrics
    # Every row was sampled by the current version: no staleness gap to measure.
    assert math.isnan(m.pop(M.STALENESS_KL_BEHAVIOR))
    assert all(math.isfinite(v) for v in m.values()), m
    assert len(result.grad_norms) == 2  # ppo_epochs 1 x minibatches 2
    # The first minibatch starts at ratio exactly 1 (pi_old recomputed with the same weights).
    assert m["policy/ratio_min"] <= 1.0 <= m["policy/ratio_max"]
    # Every arm logs both objective-independent ratio means (learner.algorithms.objectives.stats).
    assert {M.POLICY_RATIO_SEQ_MEAN, M.POLICY_RATIO_TOKEN_MEAN} <= set(m)
    # Behaviour logprobs came from the same weights: engine mismatch ~ 0, IS weights ~ 1.
    assert m["mismatch/kl_behavior"] < 1e-6
    assert abs(m[M.OFFPOLICY_WEIGHT_MEAN] - 1.0) < 1e-5
    assert abs(m[M.OFFPOLICY_ESS_FRAC] - 1.0) < 1e-6
    assert any(not torch.equal(a, b) for a, b in zip(before, after, strict=True))
    if objective == "ppo":
        assert "value/loss" in m and "value/explained_var" in m
    else:
        assert "value/loss" not in m


def test_non_finite_loss_is_a_divergence(tmp_path) -> None:
    model_dir = save_tiny_policy(tmp_path / "model")
    arm = make_arm(name="grpo", objective="grpo")
    cfg = LearnerConfig(prompts_per_step=2)
    models = build_step_models(model_dir, arm, cfg, total_steps=1)
    with torch.no_grad():
        next(models.policy.module.parameters()).fill_(float("nan"))
    batch = collate(random_groups(2, GROUP_SIZE), pad_id=0)
    with pytest.raises(DivergenceError, match="non-finite"):
        train_on_batch(
            models, batch, arm=arm, learner=cfg, group_size=GROUP_SIZE, max_len=8, version=0
        )


def test_stale_rows_are_left_out_of_engine_mismatch(tmp_path) -> None:
    model_dir = save_tiny_policy(tmp_path / "model")
    arm = make_arm(name="gspo", objective="gspo")
    cfg = LearnerConfig(prompts_per_step=2)
    models = build_step_models(model_dir, arm, cfg, total_steps=1)
    batch = collate(random_groups(2, GROUP_SIZE, version=0), pad_id=0)
    result = train_on_batch(
        models, batch, arm=arm, learner=cfg, group_size=GROUP_SIZE, max_len=8, version=3
    )
    assert math.isnan(result.metrics["mismatch/kl_behavior"])


def test_one_on_policy_update_logs_unit_ratios(tmp_path) -> None:
    """One minibatch against a recomputed pi_old: every ratio statistic is 1 (design 6)."""
    model_dir = save_tiny_policy(tmp_path / "model")
    arm = make_arm(name="gspo_token", objective="gspo_token")
    cfg = LearnerConfig(prompts_per_step=2, old_logprobs="recompute")
    models = build_step_models(model_dir, arm, cfg, total_steps=1)
    batch = collate(on_policy_groups(tiny_policy(), 2), pad_id=0)
    m = train_on_batch(
        models, batch, arm=arm, learner=cfg, group_size=GROUP_SIZE, max_len=8, version=0
    ).metrics
    for name in (M.POLICY_RATIO_SEQ_MEAN, M.POLICY_RATIO_TOKEN_MEAN, M.POLICY_RATIO_MEAN):
        assert m[name] == pytest.approx(1.0, abs=1e-6), name
    assert m[M.POLICY_CLIP_FRAC] == 0.0


@pytest.mark.parametrize("objective", ["gspo", "gspo_token", "grpo", "ppo"])
def test_advantages_follow_the_declared_kind(objective: str) -> None:
    spec = arm_model(objective)
    batch = collate(random_groups(2, GROUP_SIZE), pad_id=0)
    mask = batch.response_mask
    old_values = torch.zeros(mask.shape) if spec.needs_value_model else None
    arm = make_arm(name=objective, objective=objective)
    advantages, returns = compute_advantages(arm, batch, GROUP_SIZE, LearnerConfig(), old_values)
    if spec.advantages == "group":  # one per sequence, no critic targets
        assert advantages.shape == batch.rewards.shape and returns is None
    else:  # GAE: per token, with lambda-returns for the critic
        assert advantages.shape == mask.shape and returns is not None
        assert returns.shape == mask.shape
