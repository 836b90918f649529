"""Micro-batches and chunked log-probs through the real learner step: two steps of a tiny model
with `learner.micro_batch_tokens` (and `learner.logprob_chunk_tokens`) give the weights, gradient
norms and metrics of the same steps without them, up to float rounding."""

from __future__ import annotations

import math

import pytest
import torch

from buffer.collate import collate
from learner.config import LearnerConfig, make_arm
from learner.runtime.models import build_step_models
from learner.runtime.step import DivergenceError, train_on_batch
from learner.runtime.update import micro_batches
from tests.learner.tiny import random_groups, save_tiny_policy

GROUP_SIZE = 4
# random_groups: prompts of 2-4 tokens, responses of 1-5, so rows of 3-9 real tokens; 8 padded
# tokens per micro-batch puts 1-2 rows in each (a 9-token row alone, over the budget).
BUDGET = 8
LR = 5e-4  # 8 AdamW updates move weights by up to 4e-3; float rounding moves them < 1e-6
ARMS = {
    "grpo": {"objective": "grpo"},
    "dapo": {"objective": "grpo", "agg": "token-mean", "beta": 0.04},
    "gspo": {"objective": "gspo"},
    "ppo": {"objective": "ppo"},
    "sapo": {"objective": "sapo"},
    "kl_cov": {"objective": "kl_cov", "kl_fraction": 0.2},  # selects on the whole minibatch
}
# Not Clip-Cov: its draw is seeded by the bits of the log-probs (`covariance.choose_tokens`), and a
# micro-batch's forward may round a log-prob differently in the last bit than the minibatch's, so
# it draws other tokens (objective-level exactness: tests/learner/test_micro_batch.py).


def two_steps(model_dir, arm_settings: dict, **options: object):
    """(policy and critic parameters, grad norms, metrics of both steps) after two steps."""
    arm = make_arm(name="arm", **arm_settings)
    settings = {"prompts_per_step": 4, "minibatches": 2, "ppo_epochs": 2, "lr": LR}
    cfg = LearnerConfig(old_logprobs="recompute", **settings, **options)
    models = build_step_models(model_dir, arm, cfg, total_steps=2)
    norms, metrics = [], []
    for step in range(2):
        batch = collate(random_groups(4, GROUP_SIZE, seed=step), pad_id=0)
        result = train_on_batch(
            models, batch, arm=arm, learner=cfg, group_size=GROUP_SIZE, max_len=8, version=step
        )
        norms += result.grad_norms
        metrics.append(result.metrics)
    modules = [models.policy.module] + ([models.value.module] if models.value else [])
    params = [p.detach().clone() for m in modules for p in m.parameters()]
    return params, norms, metrics


def test_the_budget_makes_several_micro_batches_with_a_row_over_it() -> None:
    batch = collate(random_groups(4, GROUP_SIZE, seed=0), pad_id=0)
    lengths = batch.attention_mask.sum(-1)
    parts = micro_batches(torch.arange(8).reshape(1, 8), 0, lengths, BUDGET)  # minibatch 1
    assert len(parts) >= 4 and any(lengths[p.rows].max() > BUDGET for p in parts)


@pytest.mark.parametrize("name", sorted(ARMS))
@pytest.mark.parametrize(
    "options",
    [{"micro_batch_tokens": BUDGET}, {"micro_batch_tokens": BUDGET, "logprob_chunk_tokens": 5}],
    ids=["micro", "micro+chunked"],
)
def test_micro_batches_train_the_same_weights(tmp_path, name: str, options: dict) -> None:
    model_dir = save_tiny_policy(tmp_path / "model")
    plain_params, plain_norms, plain_metrics = two_steps(model_dir, ARMS[name])
    params, norms, metrics = two_steps(model_dir, ARMS[name], **options)
    moved = max(float((a - b).abs().max()) for a, b in zip(params, plain_params, strict=True))
    assert moved <= 1e-6, moved
    torch.testing.assert_close(norms, plain_norms, rtol=1e-5, atol=1e-6)
    for split, whole in zip(metrics, plain_metrics, strict=True):
        assert split.keys() == whole.keys()
        for key, value in whole.items():
            if key.startswith("perf/") or math.isnan(value):
                assert key.startswith("perf/") or math.isnan(split[key]), key
                continue
            assert split[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key


def test_the_steps_move_the_weights(tmp_path) -> None:
    """The comparison above is between trained weights (moved by ~4e-3), not initial ones."""
    model_dir = save_tiny_policy(tmp_path / "model")
    trained, _, _ = two_steps(model_dir, ARMS["grpo"], micro_batch_tokens=BUDGET)
    arm = make_arm(name="a", objective="grpo")
    initial = build_step_models(model_dir, arm, LearnerConfig(), 1).policy.module.parameters()
    moved = (float((a - b.detach()).abs().max()) for a, b in zip(trained, initial, strict=True))
    assert max(moved) > 1e-3


def test_a_non_finite_micro_batch_loss_is_a_divergence(tmp_path) -> None:
    model_dir = save_tiny_policy(tmp_path / "model")
    arm = make_arm(name="grpo", objective="grpo")
    cfg = LearnerConfig(prompts_per_step=4, micro_batch_tokens=BUDGET, logprob_chunk_tokens=5)
    models = build_step_models(model_dir, arm, cfg, total_steps=1)
    with torch.no_grad():
        models.policy.module.get_output_embeddings().weight[5].fill_(float("nan"))
    batch = collate(random_groups(4, GROUP_SIZE), pad_id=0)
    with pytest.raises(DivergenceError, match="non-finite"):
        train_on_batch(
            models, batch, arm=arm, learner=cfg, group_size=GROUP_SIZE, max_len=8, version=0
        )
