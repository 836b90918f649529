"""Routing's share of the token log-ratio's variance (`learner.runtime.moe.logratio`).

Hand-worked values of the pure functions, the split invariance of their sums, and, on the tiny
Qwen3-MoE of test_moe.py: the metrics after a step, exactly 0 when no weight moved (and exactly
1 under R3, whose pi_old is on the sampler's experts), a micro-batched metric pass equal to the
whole batch's, and a step's training untouched by the metric's forwards (weights, gradient
norms, every other metric and the RNG, bit for bit, with dropout in the model).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch

from buffer.collate import RolloutBatch
from contract import metrics as M
from learner.algorithms.sampling_dist import PLAIN
from learner.config import LearnerConfig, make_arm
from learner.runtime.forward import policy_logprobs, scoring
from learner.runtime.models import build_step_models
from learner.runtime.moe.logratio import (
    LOGRATIO_METRICS,
    LogRatioTally,
    logratio_metrics,
    logratio_sums,
    routing_variance_share,
    variance_of_sums,
)
from learner.runtime.moe.routing import StepRouting
from learner.runtime.step import _score, train_on_batch
from tests.learner.test_moe import GROUP_SIZE, moe_batch_routed_by_another, tiny_moe

# ---- the pure functions ------------------------------------------------------------------------


def test_share_hand_worked() -> None:
    """4 scored tokens and a masked one (whose huge values must not count):
    a (free)     =  0.5, -0.5, 1.5, -1.5     mean 0, Var(a) = (0.25 + 0.25 + 2.25 + 2.25) / 4 = 1.25
    b (replayed) =  0.5, -0.5, 0.5, -0.5     (tokens 2 and 3 re-routed)
    c = a - b    =  0,    0,   1,   -1       mean 0, Var(c) = (1 + 1) / 4 = 0.5
    share = 0.5 / 1.25 = 0.4. (1 - Var(b) / Var(a) would say 1 - 0.25 / 1.25 = 0.8: it also
    credits routing with 2 Cov(b, c) = 2 x 0.25, the covariance of the two parts.)"""
    free = torch.tensor([[0.5, -0.5, 1.5, -1.5, 9.0]])
    replayed = torch.tensor([[0.5, -0.5, 0.5, -0.5, -9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0]])
    sums = logratio_sums(free, replayed, mask)
    assert sums.dtype == torch.float64
    assert sums.tolist() == [4.0, 0.0, 5.0, 0.0, 2.0]  # n, sum a, sum a^2, sum c, sum c^2
    assert logratio_metrics(sums) == {
        M.MOE_LOGRATIO_VAR: 1.25,
        M.MOE_ROUTING_LOGRATIO_VAR: 0.5,
        M.MOE_ROUTING_LOGRATIO_VAR_FRAC: 0.4,
    }


def test_share_edge_cases_are_deliberate() -> None:
    # Nothing varies (no update): routing explains none of it.
    assert routing_variance_share(0.0, 0.0) == 0.0
    # Only routing's part varies while a is constant: the clip of c / 0.
    assert routing_variance_share(0.0, 0.25) == 1.0
    # Anti-correlated parts: a = (1, -1), b = (3, -3), c = (-2, 2): Var(c) = 4 > Var(a) = 1.
    free, replayed = torch.tensor([[1.0, -1.0]]), torch.tensor([[3.0, -3.0]])
    metrics = logratio_metrics(logratio_sums(free, replayed, torch.ones(1, 2)))
    assert metrics[M.MOE_LOGRATIO_VAR] == 1.0 and metrics[M.MOE_ROUTING_LOGRATIO_VAR] == 4.0
    assert metrics[M.MOE_ROUTING_LOGRATIO_VAR_FRAC] == 1.0  # clipped; the 4.0 says by how much
    # No scored token: NaN, as every moe/* metric then.
    empty = logratio_metrics(logratio_sums(free, replayed, torch.zeros(1, 2)))
    assert all(math.isnan(value) for value in empty.values())
    assert math.isnan(routing_variance_share(math.nan, 0.0))
    assert variance_of_sums(1, 0.3, 0.09) == 0.0  # one token: no spread (clamped, not -1e-18)


def test_parts_add_up_to_the_whole_batch_to_float64_rounding() -> None:
    """Rows split into parts as micro-batches take them (narrower widths, any order): the added
    sums give the whole batch's variances up to float64 rounding; and they are torch.var's."""
    gen = torch.Generator().manual_seed(0)
    free = torch.randn(6, 10, generator=gen) * 0.1 + 0.02  # (B, L)
    replayed = free + torch.randn(6, 10, generator=gen) * 0.01
    mask = (torch.rand(6, 10, generator=gen) < 0.7).float()
    whole = logratio_metrics(logratio_sums(free, replayed, mask))
    tally = LogRatioTally(torch.device("cpu"))
    for rows, width in (([4, 1], 7), ([0, 5, 2], 10), ([3], 4)):
        cut = (torch.tensor(rows), slice(None, width))
        tally.add(free[cut[0]][:, cut[1]], replayed[cut[0]][:, cut[1]], mask[cut[0]][:, cut[1]])
    cut_off = mask.clone()  # what the parts left out beyond their widths is not scored
    cut_off[[4, 1], 7:], cut_off[3, 4:] = 0.0, 0.0
    split = tally.metrics()
    expected = logratio_metrics(logratio_sums(free, replayed, cut_off))
    for name in LOGRATIO_METRICS:
        assert split[name] == pytest.approx(expected[name], rel=1e-12, abs=0.0), name
    kept = mask.bool()
    a, c = free[kept].double(), (free[kept].double() - replayed[kept].double())
    assert whole[M.MOE_LOGRATIO_VAR] == pytest.approx(float(a.var(unbiased=False)), rel=1e-12)
    assert whole[M.MOE_ROUTING_LOGRATIO_VAR] == pytest.approx(
        float(c.var(unbiased=False)), rel=1e-12
    )


# ---- on the tiny MoE policy --------------------------------------------------------------------


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("moe_logratio")
    tiny_moe().save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def batch() -> RolloutBatch:
    return moe_batch_routed_by_another()


def step(moe_dir: Path, batch: RolloutBatch, replay: str, *, flat: bool) -> dict[str, float]:
    """One GRPO step's metrics; `flat`: equal rewards, so every advantage, gradient and AdamW
    step is exactly 0 and the weights after the step are pi_old's."""
    arm = make_arm(name="grpo", objective="grpo", routing_replay=replay)
    cfg = LearnerConfig(prompts_per_step=4, lr=1e-2, old_logprobs="recompute")
    models = build_step_models(moe_dir, arm, cfg, total_steps=1)
    if flat:
        batch = dataclasses.replace(batch, rewards=torch.ones_like(batch.rewards))
    return train_on_batch(
        models, batch, arm=arm, learner=cfg, group_size=GROUP_SIZE, max_len=8, version=0
    ).metrics


def test_no_update_no_routing_share_and_an_update_measured(
    moe_dir: Path, batch: RolloutBatch
) -> None:
    # Unchanged weights: the free and replayed passes are pi_old's pass, bit for bit (same
    # parts, and a replayed router's own choice is its forward), so a = b = 0 at every token.
    still = step(moe_dir, batch, "off", flat=True)
    assert [still[name] for name in LOGRATIO_METRICS] == [0.0, 0.0, 0.0]
    moved = step(moe_dir, batch, "off", flat=False)
    assert moved[M.MOE_LOGRATIO_VAR] > 0.0 and moved[M.MOE_ROUTING_LOGRATIO_VAR] > 0.0
    assert 0.0 < moved[M.MOE_ROUTING_LOGRATIO_VAR_FRAC] < 1.0
    assert moved[M.MOE_TOKEN_REROUTED_FRAC] > 0.0  # what the routing part comes from


def test_under_r3_with_no_update_all_of_the_spread_is_routing(
    moe_dir: Path, batch: RolloutBatch
) -> None:
    """R3's pi_old is scored on the generator's experts, and so is the replayed pass: b = 0
    exactly, a = c = the learner's own routing against the sampler's, so the share is 1."""
    still = step(moe_dir, batch, "rollout", flat=True)
    assert still[M.MOE_LOGRATIO_VAR] > 0.0
    assert still[M.MOE_ROUTING_LOGRATIO_VAR] == pytest.approx(still[M.MOE_LOGRATIO_VAR], rel=1e-9)
    assert still[M.MOE_ROUTING_LOGRATIO_VAR_FRAC] == pytest.approx(1.0, rel=1e-9)


def metric_pass(moe_dir: Path, batch: RolloutBatch, budget: int | None) -> dict[str, float]:
    """pi_old's pass, then every router and output weight moved by a fixed amount, then the
    step's metric pass, in micro-batches of `budget` tokens (None: the whole batch)."""
    arm = make_arm(name="grpo", objective="grpo")
    cfg = LearnerConfig(prompts_per_step=4, old_logprobs="recompute", micro_batch_tokens=budget)
    models = build_step_models(moe_dir, arm, cfg, total_steps=1)
    policy = models.policy.module
    scores = _score(models, batch, cfg, PLAIN)  # the step's routing starts: replay off
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, param in policy.named_parameters():
            if "gate" in name or "lm_head" in name:
                param.add_(torch.randn(param.shape, generator=gen) * 0.3)
    with scoring(policy):
        return models.routing.metrics(
            batch.response_mask,
            lambda i, a: policy_logprobs(policy, i, a, PLAIN, None)[0],
            scores.learner_lp,
        )


def test_micro_batched_metric_pass_is_the_whole_batchs(moe_dir: Path, batch: RolloutBatch) -> None:
    whole = metric_pass(moe_dir, batch, None)
    split = metric_pass(moe_dir, batch, 8)  # 16 rows of 3-9 tokens: 1-2 rows a part
    assert whole[M.MOE_ROUTING_CHANGE_FRAC] > 0.0  # the moved routers re-route some tokens
    assert split[M.MOE_ROUTING_CHANGE_FRAC] == whole[M.MOE_ROUTING_CHANGE_FRAC]  # counts: exact
    # The sums add exactly up to float64 rounding; a part's forward rounds each float32
    # log-prob its own way (measured: 1e-7 relative here), hence the tolerance.
    for name in LOGRATIO_METRICS:
        assert split[name] == pytest.approx(whole[name], rel=1e-6), name
    assert 0.0 < whole[M.MOE_ROUTING_LOGRATIO_VAR_FRAC] < 1.0


def two_steps(
    moe_dir: Path, batch: RolloutBatch
) -> tuple[list[torch.Tensor], list[float], list[dict[str, float]], torch.Tensor]:
    """(weights, gradient norms, metrics of both steps, the RNG's state) after two GRPO steps.

    The learner loads a policy without dropout (`learner.runtime.dropout`); it is put back in
    the attention here, so the updates draw from the RNG in train mode, and a metric forward
    that ran in train mode would draw too and change the second step's dropout masks."""
    torch.manual_seed(0)
    arm = make_arm(name="grpo", objective="grpo")
    cfg = LearnerConfig(prompts_per_step=4, lr=1e-2, old_logprobs="recompute")
    models = build_step_models(moe_dir, arm, cfg, total_steps=2)
    for module in models.policy.module.modules():
        if hasattr(module, "attention_dropout"):
            module.attention_dropout = 0.5
    norms, metrics = [], []
    for version in range(2):
        result = train_on_batch(
            models, batch, arm=arm, learner=cfg, group_size=GROUP_SIZE, max_len=8, version=version
        )
        norms += result.grad_norms
        metrics.append(result.metrics)
    weights = [p.detach().clone() for p in models.policy.module.parameters()]
    return weights, norms, metrics, torch.get_rng_state()


def test_the_metric_leaves_training_bit_for_bit_unchanged(
    moe_dir: Path, batch: RolloutBatch, monkeypatch: pytest.MonkeyPatch
) -> None:
    with_metric = two_steps(moe_dir, batch)
    original = StepRouting.metrics

    def routing_only(self: StepRouting, mask: torch.Tensor, *_: object) -> dict[str, float]:
        return original(self, mask)  # the routing forward alone, as before the metric

    monkeypatch.setattr(StepRouting, "metrics", routing_only)
    without = two_steps(moe_dir, batch)
    weights, norms, metrics, rng = with_metric
    assert all(torch.equal(a, b) for a, b in zip(weights, without[0], strict=True))
    assert norms == without[1]
    for kept, plain in zip(metrics, without[2], strict=True):
        assert set(kept) - set(plain) == set(LOGRATIO_METRICS)
        for name, value in plain.items():  # NaN-aware: the unmeasured gaps are NaN in both
            assert value == kept[name] or (math.isnan(value) and math.isnan(kept[name])), name
    assert torch.equal(rng, without[3])  # dropout drew the same numbers: none in the metric
    torch.manual_seed(0)
    assert not torch.equal(rng, torch.get_rng_state())  # ... and it did draw in the updates
