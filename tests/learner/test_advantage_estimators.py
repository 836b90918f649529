"""Sequence-level advantage estimators (group, RLOO, REINFORCE++, REINFORCE++-baseline):
hand-worked values, their identities, loop references, the arm setting and a real step each."""

from __future__ import annotations

import math
from typing import get_args

import pytest
import torch
from pydantic import ValidationError
from torch import Tensor

import learner.runtime.step as step_module
from buffer.collate import collate
from harness.config import resolved_dump
from learner.algorithms.advantages import (
    ADV_EPS,
    ADVANTAGE_ESTIMATORS,
    batch_whiten,
    group_advantages,
    reinforce_pp_advantages,
    reinforce_pp_baseline_advantages,
    rloo_advantages,
    whiten,
)
from learner.algorithms.masking import masked_mean, masked_var
from learner.config import LearnerConfig, make_arm
from learner.runtime.models import build_step_models
from learner.vocabulary import AdvantageEstimator
from tests.learner.tiny import random_groups, save_tiny_policy

ESTIMATORS: tuple[str, ...] = get_args(AdvantageEstimator)
# Three groups of 4: uneven, spread out, constant.
REWARDS = torch.tensor([1.0, 0, 0, 1, 0, 1, 2, 3, 2, 2, 2, 2])


def _random(n_groups: int, group_size: int, seed: int) -> tuple[Tensor, Tensor]:
    """Rewards with some constant groups and ragged response lengths, some empty."""
    gen = torch.Generator().manual_seed(seed)
    rewards = torch.randint(0, 3, (n_groups * group_size,), generator=gen).float() / 2
    rewards[:group_size] = 1.0  # a constant group
    lengths = torch.randint(0, 6, (n_groups * group_size,), generator=gen)
    return rewards, lengths


# --- RLOO -------------------------------------------------------------------------------------


def test_rloo_hand_worked() -> None:
    adv = rloo_advantages(REWARDS, group_size=4)
    # Group (1, 0, 0, 1), sum 2: A_i = r_i - (2 - r_i) / 3
    #   r=1: 1 - 1/3 = 2/3;  r=0: 0 - 2/3 = -2/3
    # Group (0, 1, 2, 3), sum 6: 0 - 6/3 = -2, 1 - 5/3 = -2/3, 2 - 4/3 = 2/3, 3 - 3/3 = 2
    # Group (2, 2, 2, 2): constant -> exactly 0
    expected = [2 / 3, -2 / 3, -2 / 3, 2 / 3, -2, -2 / 3, 2 / 3, 2, 0, 0, 0, 0]
    assert adv.dtype == torch.float32
    assert adv.tolist() == pytest.approx(expected, rel=1e-6)
    assert adv[8:].tolist() == [0.0] * 4


def test_rloo_group_of_two_is_the_reward_difference() -> None:
    # G = 2: the baseline of each sample is the other one: A = (r_0 - r_1, r_1 - r_0)
    adv = rloo_advantages(torch.tensor([1.0, 0, 0.5, 0.5, 3, -1]), group_size=2)
    assert adv.tolist() == [1.0, -1.0, 0.0, 0.0, 4.0, -4.0]


def test_rloo_degenerate_groups_are_exactly_zero() -> None:
    # 0.1 is not a float32 binary fraction: (0.3 - 0.1) / 2 need not round back to 0.1.
    adv = rloo_advantages(torch.tensor([0.1] * 3 + [0.7] * 3), group_size=3)
    assert adv.tolist() == [0.0] * 6
    assert rloo_advantages(torch.tensor([1.0, 0.0, 5.0]), group_size=1).tolist() == [0.0] * 3


def test_rloo_baseline_excludes_the_sample_itself() -> None:
    rewards = torch.tensor([0.3, 1.0, 0.0, 0.7, 0.2])
    baseline = rewards - rloo_advantages(rewards, group_size=5)  # b_i = r_i - A_i
    moved = rewards.clone()
    moved[0] = 5.0
    moved_baseline = moved - rloo_advantages(moved, group_size=5)
    # b_0 = mean(1.0, 0.0, 0.7, 0.2) = 0.475 whatever r_0 is; every other b_j sees r_0.
    assert baseline[0].item() == pytest.approx(0.475, rel=1e-6)
    assert moved_baseline[0].item() == pytest.approx(0.475, rel=1e-6)
    assert torch.all(moved_baseline[1:] > baseline[1:])


@pytest.mark.parametrize("group_size", [2, 3, 8])
def test_rloo_is_mean_only_scaled_by_g_over_g_minus_1(group_size: int) -> None:
    rewards, _ = _random(5, group_size, seed=group_size)
    mean_only = group_advantages(rewards, group_size, norm="mean_only")
    expected = group_size / (group_size - 1) * mean_only
    assert torch.allclose(rloo_advantages(rewards, group_size), expected, rtol=1e-5, atol=1e-6)


# --- REINFORCE++ ------------------------------------------------------------------------------


def test_reinforce_pp_hand_worked_equal_lengths() -> None:
    # Batch (1, 0, 0, 1, 0, 0, 0, 0), every response 2 tokens: mean 2/8 = 0.25,
    # population var 0.25 * 0.75 = 0.1875, std 0.4330127 -> +0.75 / 0.4330137 = 1.7320468,
    # -0.25 / 0.4330137 = -0.5773489. The all-zero second group is not zero: the baseline is
    # the batch mean, not the group's.
    adv = reinforce_pp_advantages(torch.tensor([1.0, 0, 0, 1, 0, 0, 0, 0]), torch.full((8,), 2))
    hi, lo = 0.75 / (math.sqrt(0.1875) + ADV_EPS), -0.25 / (math.sqrt(0.1875) + ADV_EPS)
    assert adv.tolist() == pytest.approx([hi, lo, lo, hi, lo, lo, lo, lo], rel=1e-6)


def test_reinforce_pp_weighs_each_sequence_by_its_tokens() -> None:
    # Rewards (1, 0, 0) with 3, 1 and 0 response tokens: tokens (1, 1, 1, 0), mean 0.75,
    # population std sqrt(0.75 * 0.25) = 0.4330127 -> (0.25, -0.75) / 0.4330137
    # = (0.5773489, -1.7320468); the empty response gets 0.
    adv = reinforce_pp_advantages(torch.tensor([1.0, 0, 0]), torch.tensor([3, 1, 0]))
    std = math.sqrt(0.1875) + ADV_EPS
    assert adv.tolist() == pytest.approx([0.25 / std, -0.75 / std, 0.0], rel=1e-6)
    assert adv[2].item() == 0.0


def test_reinforce_pp_has_token_mean_zero_and_std_one() -> None:
    rewards, lengths = _random(6, 4, seed=3)
    adv = reinforce_pp_advantages(rewards, lengths)
    mask = torch.arange(6)[None, :] < lengths[:, None]  # (B, T) response tokens
    tokens = adv[:, None].expand(mask.shape)  # (B, T)
    assert abs(masked_mean(tokens, mask).item()) < 1e-6
    std = masked_var(tokens, mask).sqrt().item()
    # std / (std + eps): 1 up to the epsilon (the reward std here is ~0.4)
    assert std == pytest.approx(1.0, abs=1e-5)
    with_equal_lengths = reinforce_pp_advantages(rewards, torch.ones_like(lengths))
    assert abs(with_equal_lengths.mean().item()) < 1e-6
    assert with_equal_lengths.std(correction=0).item() == pytest.approx(1.0, abs=1e-5)


def test_reinforce_pp_equals_ppo_whitening_on_tokens() -> None:
    # The same statistics as `whiten` (PPO) on the reward broadcast over the response tokens.
    rewards, lengths = _random(4, 3, seed=7)
    mask = torch.arange(6)[None, :] < lengths[:, None]  # (B, T)
    on_tokens = whiten(rewards[:, None].expand(mask.shape), mask)  # (B, T)
    adv = reinforce_pp_advantages(rewards, lengths)
    assert torch.allclose(on_tokens, torch.where(mask, adv[:, None], 0.0), rtol=1e-5, atol=1e-6)


def test_batch_normalised_degenerate_batches_are_zero_never_nan() -> None:
    constant = torch.tensor([0.1] * 6)
    lengths = torch.tensor([1, 2, 3, 1, 2, 3])
    assert reinforce_pp_advantages(constant, lengths).tolist() == [0.0] * 6
    assert reinforce_pp_baseline_advantages(constant, 3, lengths).tolist() == [0.0] * 6
    # No response token at all: nothing to normalise over.
    empty = torch.zeros(4, dtype=torch.long)
    assert reinforce_pp_advantages(torch.tensor([1.0, 0, 2, 3]), empty).tolist() == [0.0] * 4
    # One non-empty row: its value alone, a constant, gets 0 (not -0.5 / 1e-6).
    one = reinforce_pp_baseline_advantages(torch.tensor([1.0, 0]), 2, torch.tensor([0, 4]))
    assert one.tolist() == [0.0, 0.0]


# --- REINFORCE++-baseline ---------------------------------------------------------------------


def test_reinforce_pp_baseline_hand_worked() -> None:
    adv = reinforce_pp_baseline_advantages(REWARDS, 4, torch.ones(12, dtype=torch.long))
    # Group-centred: (.5, -.5, -.5, .5), (-1.5, -.5, .5, 1.5), (0, 0, 0, 0); batch mean 0,
    # population var (4 * 0.25 + 2 * 2.25 + 2 * 0.25) / 12 = 6 / 12 = 0.5, std 0.7071068
    # -> 0.5 / 0.7071078 = 0.7071058, 1.5 / 0.7071078 = 2.1213174; the constant group stays 0.
    s = math.sqrt(0.5) + ADV_EPS
    expected = [0.5 / s, -0.5 / s, -0.5 / s, 0.5 / s, -1.5 / s, -0.5 / s, 0.5 / s, 1.5 / s]
    assert adv.tolist() == pytest.approx(expected + [0.0] * 4, rel=1e-6)


def test_reinforce_pp_baseline_ragged_lengths_keep_constant_groups_at_zero() -> None:
    # G = 2, rewards (1, 0 | 1, 1), lengths (3, 1 | 2, 0): centred (0.5, -0.5 | 0, 0).
    # Tokens: 3 x 0.5, 1 x -0.5, 2 x 0 -> mean 1/6; var (3 (1/3)^2 + (2/3)^2 + 2 (1/6)^2) / 6
    # = (6/18 + 8/18 + 1/18) / 6 = 15/108, std 0.3726780 -> +-0.5 / 0.3726790 = +-1.3416371.
    # Only the std is taken: the constant group keeps 0 (a second shift by the token mean
    # would give it -(1/6) / std = -0.447).
    adv = reinforce_pp_baseline_advantages(
        torch.tensor([1.0, 0, 1, 1]), 2, torch.tensor([3, 1, 2, 0])
    )
    s = math.sqrt(15 / 108) + ADV_EPS
    assert adv.tolist() == pytest.approx([0.5 / s, -0.5 / s, 0.0, 0.0], rel=1e-6)


def test_reinforce_pp_baseline_with_one_group_is_centred_over_batch_std() -> None:
    rewards = torch.tensor([0.0, 1.0, 0.5, 1.0, 0.0, 0.0, 1.0, 0.25])
    adv = reinforce_pp_baseline_advantages(rewards, 8, torch.full((8,), 3))
    expected = (rewards - rewards.mean()) / (rewards.std(correction=0) + ADV_EPS)
    assert torch.allclose(adv, expected, rtol=1e-5, atol=1e-7)


def test_group_size_two_for_every_estimator() -> None:
    rewards, lengths = torch.tensor([1.0, 0, 0, 0]), torch.ones(4, dtype=torch.long)
    # Group (1, 0): mean 0.5, unbiased std sqrt(0.5) -> +-0.5 / 0.707108 = +-0.707106 (population
    # std 0.5 -> +-0.999998); RLOO: +-1; group (0, 0): 0 everywhere.
    assert group_advantages(rewards, 2).tolist() == pytest.approx([0.7071058, -0.7071058, 0, 0])
    population = group_advantages(rewards, 2, std="population").tolist()
    assert population == pytest.approx([0.999998, -0.999998, 0, 0])
    assert rloo_advantages(rewards, 2).tolist() == [1.0, -1.0, 0.0, 0.0]
    # REINFORCE++: mean 0.25, std sqrt(0.1875) -> (0.75, -0.25, -0.25, -0.25) / 0.4330137
    s = math.sqrt(0.1875) + ADV_EPS
    pp = reinforce_pp_advantages(rewards, lengths).tolist()
    assert pp == pytest.approx([0.75 / s, -0.25 / s, -0.25 / s, -0.25 / s], rel=1e-6)
    # Baseline: centred (0.5, -0.5, 0, 0), mean 0, var (0.25 + 0.25) / 4 = 0.125
    b = math.sqrt(0.125) + ADV_EPS
    base = reinforce_pp_baseline_advantages(rewards, 2, lengths).tolist()
    assert base == pytest.approx([0.5 / b, -0.5 / b, 0.0, 0.0], rel=1e-6)


# --- vectorised vs a python loop --------------------------------------------------------------


def _loop_whiten(values: list[float], lengths: list[int], shift: bool) -> list[float]:
    tokens = [v for v, n in zip(values, lengths, strict=True) for _ in range(n)]
    if not tokens or max(tokens) == min(tokens):
        return [0.0] * len(values)
    mean = sum(tokens) / len(tokens)
    std = math.sqrt(sum((t - mean) ** 2 for t in tokens) / len(tokens))
    return [
        ((v - mean) if shift else v) / (std + ADV_EPS) if n > 0 else 0.0
        for v, n in zip(values, lengths, strict=True)
    ]


def _loop(estimator: str, rewards: list[float], lengths: list[int], g: int) -> list[float]:
    groups = [rewards[i : i + g] for i in range(0, len(rewards), g)]
    out: list[float] = []
    for group in groups:
        mean = sum(group) / g
        for i, r in enumerate(group):
            if max(group) == min(group):
                out.append(0.0)
            elif estimator == "rloo":
                out.append(r - sum(x for j, x in enumerate(group) if j != i) / (g - 1))
            elif estimator == "group":
                std = math.sqrt(sum((x - mean) ** 2 for x in group) / (g - 1))
                out.append((r - mean) / (std + ADV_EPS))
            else:
                out.append(r - mean)
    if estimator == "reinforce_pp":
        return _loop_whiten(rewards, lengths, shift=True)
    if estimator == "reinforce_pp_baseline":
        return _loop_whiten(out, lengths, shift=False)
    return out


@pytest.mark.parametrize("estimator", ESTIMATORS)
@pytest.mark.parametrize("group_size", [2, 4])
def test_vectorised_matches_python_loop(estimator: str, group_size: int) -> None:
    rewards, lengths = _random(5, group_size, seed=11 + group_size)
    adv = ADVANTAGE_ESTIMATORS[estimator](rewards, lengths, group_size, "std", "unbiased")  # type: ignore[index]
    expected = _loop(estimator, rewards.tolist(), lengths.tolist(), group_size)
    assert adv.shape == rewards.shape and adv.dtype == torch.float32
    assert adv.tolist() == pytest.approx(expected, rel=1e-5, abs=1e-6)


def test_registry_covers_every_estimator_name() -> None:
    assert tuple(ADVANTAGE_ESTIMATORS) == ESTIMATORS


def test_batch_whiten_rejects_mismatched_shapes() -> None:
    with pytest.raises(ValueError, match="x and lengths must both be"):
        batch_whiten(torch.zeros(4), torch.ones(3))


# --- the arm setting --------------------------------------------------------------------------


@pytest.mark.parametrize("objective", ["gspo", "gspo_token", "grpo"])
def test_group_arms_default_to_group_and_keep_adv_norm(objective: str) -> None:
    arm = make_arm(name="a", objective=objective, adv_norm="mean_only")
    assert arm.adv_estimator == "group" and arm.adv_norm == "mean_only"  # type: ignore[attr-defined]
    assert arm.advantages == "group"  # every estimator here is sequence-level [B]
    # A config written before the field existed resolves as before (same config hash).
    assert "adv_estimator" not in resolved_dump(arm)


def test_adv_norm_with_another_estimator_is_refused() -> None:
    with pytest.raises(
        ValidationError,
        match=r"arm 'r' sets adv_norm: mean_only, but adv_estimator: rloo does not read it .*"
        r"remove adv_norm, or set adv_estimator: group",
    ):
        make_arm(name="r", objective="grpo", adv_estimator="rloo", adv_norm="mean_only")
    with pytest.raises(ValidationError, match="adv_estimator: reinforce_pp does not read it"):
        make_arm(name="r", objective="gspo", adv_estimator="reinforce_pp", adv_norm="std")


def test_unknown_estimator_and_ppo_are_refused() -> None:
    with pytest.raises(ValidationError, match="adv_estimator"):
        make_arm(name="x", objective="gspo", adv_estimator="reinforce")
    ppo_hint = r"does not read adv_estimator \(PPO.s advantages come from GAE.*only gspo"
    with pytest.raises(ValidationError, match=ppo_hint):
        make_arm(name="p", objective="ppo", adv_estimator="rloo")


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_arm_dump_validates_again(estimator: str) -> None:
    # The learner re-reads the resolved config that the driver dumped.
    arm = make_arm(name="a", objective="grpo", adv_estimator=estimator)
    dumped = resolved_dump(arm)
    assert ("adv_norm" in dumped) == (estimator == "group")
    again = make_arm(**dumped)
    assert again == arm


# --- one real learner step per estimator ------------------------------------------------------


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_step_uses_the_arms_estimator(tmp_path, monkeypatch, estimator: str) -> None:
    group_size = 4
    model_dir = save_tiny_policy(tmp_path / "model")
    arm = make_arm(name="a", objective="grpo", adv_estimator=estimator)
    cfg = LearnerConfig(prompts_per_step=4, minibatches=2, lr=1e-2)
    models = build_step_models(model_dir, arm, cfg, total_steps=1)
    batch = collate(random_groups(4, group_size, seed=1), pad_id=0)
    seen: list[Tensor] = []
    compute = step_module.compute_advantages

    def spy(*args, **kwargs):
        advantages, returns = compute(*args, **kwargs)
        seen.append(advantages)
        return advantages, returns

    monkeypatch.setattr(step_module, "compute_advantages", spy)
    result = step_module.train_on_batch(
        models, batch, arm=arm, learner=cfg, group_size=group_size, max_len=8, version=0
    )
    lengths = batch.response_mask.sum(-1)  # (B,)
    expected = {
        "group": lambda: group_advantages(batch.rewards, group_size),
        "rloo": lambda: rloo_advantages(batch.rewards, group_size),
        "reinforce_pp": lambda: reinforce_pp_advantages(batch.rewards, lengths),
        "reinforce_pp_baseline": lambda: reinforce_pp_baseline_advantages(
            batch.rewards, group_size, lengths
        ),
    }[estimator]()
    (advantages,) = seen
    assert advantages.shape == batch.rewards.shape  # sequence-level [B]
    assert torch.equal(advantages, expected) and advantages.abs().sum() > 0
    trained = {k: v for k, v in result.metrics.items() if k.startswith(("policy/", "optim/"))}
    assert trained and all(math.isfinite(v) for v in trained.values()), trained
    assert len(result.grad_norms) == 2
