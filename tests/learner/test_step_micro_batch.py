"""Micro-batches and chunked log-probs through the real learner step: two steps of a tiny model
with `learner.micro_batch_tokens` (and `learner.logprob_chunk_tokens`) give the gradients, weights,
gradient norms and metrics of the same steps without them, up to float rounding bounded by the
computation (tests/learner/float_bounds.py), update by update (tests/learner/lockstep.py: the run
with micro-batches takes each update from the weights and AdamW state of the run without)."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import pytest
import torch
from transformers import AutoConfig

from buffer.collate import collate
from learner.config import LearnerConfig, make_arm
from learner.runtime import minibatch
from learner.runtime.models import build_step_models
from learner.runtime.step import DivergenceError, train_on_batch
from learner.runtime.update import micro_batches
from tests.learner.float_bounds import backward_chain, forward_chain
from tests.learner.lockstep import Update, check_lockstep, check_step_metrics, recording
from tests.learner.tiny import random_groups, save_tiny_policy

GROUP_SIZE = 4
PROMPTS = 4
MINIBATCHES = 2
# random_groups: prompts of 2-4 tokens, responses of 1-5, so rows of 3-9 real tokens; 8 padded
# tokens per micro-batch puts 1-2 rows in each (a 9-token row alone, over the budget).
BUDGET = 8
LR = 5e-4  # 8 AdamW updates move weights by up to 4e-3
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


def batches() -> list:
    """The two steps' batches."""
    return [collate(random_groups(PROMPTS, GROUP_SIZE, seed=step), pad_id=0) for step in (0, 1)]


class Steps(NamedTuple):
    """Two steps' policy and critic parameters, grad norms and metrics, and every AdamW update
    of each module (`lockstep.Recorder`: policy, then the critic if any)."""

    params: list[torch.Tensor]
    norms: list[float]
    metrics: list[dict[str, float]]
    updates: list[list[Update]]


def two_steps(
    model_dir: Path, arm_settings: dict, *, follow: Steps | None = None, **options: object
) -> Steps:
    """Two steps of `arm_settings` with the learner `options`; with `follow`, in lockstep with
    that run (each update starts from its weights and AdamW state)."""
    arm = make_arm(name="arm", **arm_settings)
    settings = {
        "prompts_per_step": PROMPTS,
        "minibatches": MINIBATCHES,
        "ppo_epochs": 2,
        "lr": LR,
    }
    cfg = LearnerConfig(old_logprobs="recompute", **settings, **options)
    models = build_step_models(model_dir, arm, cfg, total_steps=2)
    modules = [models.policy] + ([models.value] if models.value else [])
    norms, metrics = [], []
    with recording(modules, None if follow is None else follow.updates) as recorders:
        for step, batch in enumerate(batches()):
            result = train_on_batch(
                models, batch, arm=arm, learner=cfg, group_size=GROUP_SIZE, max_len=8, version=step
            )
            norms += result.grad_norms
            metrics.append(result.metrics)
    params = [p.detach().clone() for m in modules for p in m.module.parameters()]
    updates = [recorder.updates for recorder in recorders]
    assert [u.norm for u in updates[0]] == norms  # the recorder saw the step's gradients
    return Steps(params, norms, metrics, updates)


def assert_same_steps(model_dir: Path, plain: Steps, split: Steps) -> None:
    """`split` (which followed `plain`) computed every update's gradients, norms and weights,
    and both steps' metrics, within the bounds of the computation."""
    config = AutoConfig.from_pretrained(model_dir)
    width = max(batch.input_ids.shape[1] for batch in batches())
    # A gradient coordinate sums per-token terms over the minibatch's positions (rows x width),
    # each through one token's forward and backward chain; the parts' sum regroups the same terms.
    positions = PROMPTS // MINIBATCHES * GROUP_SIZE * width
    n = positions + forward_chain(config, width) + backward_chain(config, width)
    names = ["policy", "critic"][: len(plain.updates)]
    for name, a, b in zip(names, plain.updates, split.updates, strict=True):
        check_lockstep(a, b, n=n, max_norm=LearnerConfig().grad_clip, what=name)
    # A loss reduced with the whole minibatch's totals is the same sum as the other metrics.
    n = PROMPTS * GROUP_SIZE * width + forward_chain(config, width)
    check_step_metrics(split.metrics, plain.metrics, n)


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
    plain = two_steps(model_dir, ARMS[name])
    split = two_steps(model_dir, ARMS[name], follow=plain, **options)
    assert len(plain.updates[0]) == 8  # 2 steps x 2 epochs x 2 minibatches
    assert_same_steps(model_dir, plain, split)


def test_a_dropped_micro_batch_breaks_the_bounds(tmp_path, monkeypatch) -> None:
    """The bounds above are tight enough to matter: a learner that loses one micro-batch's
    gradient (the last part's loss scaled by 0 before its backward) fails them."""
    model_dir = save_tiny_policy(tmp_path / "model")
    plain = two_steps(model_dir, ARMS["grpo"])
    original = minibatch.accumulate

    def dropping_the_last(opt, parts, part_loss, **kwargs):
        def without_the_last(part):
            loss, kept = part_loss(part)
            return (loss * 0.0 if part is parts[-1] else loss), kept

        return original(opt, parts, without_the_last, **kwargs)

    monkeypatch.setattr(minibatch, "accumulate", dropping_the_last)
    split = two_steps(model_dir, ARMS["grpo"], follow=plain, micro_batch_tokens=BUDGET)
    with pytest.raises(AssertionError, match="gradient"):
        assert_same_steps(model_dir, plain, split)


def test_the_steps_move_the_weights(tmp_path) -> None:
    """The updates compared above train: two steps move the weights by ~4e-3."""
    model_dir = save_tiny_policy(tmp_path / "model")
    trained = two_steps(model_dir, ARMS["grpo"], micro_batch_tokens=BUDGET).params
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
