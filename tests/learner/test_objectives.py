"""Policy objectives: sanity properties of design section 6 and GSPO's hand-worked cases.

Batch layout and options: `tests/learner/objective_inputs.py`.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor

from contract import metrics as M
from learner.algorithms.objectives import grpo_loss, gspo_loss, gspo_token_loss, ppo_loss
from tests.learner.objective_inputs import (
    ADV,
    CLIP_METRICS,
    LENGTHS,
    assert_identical_policy_stats,
    identical_batch,
    layout,
    leaf,
    opts,
    response,
    run,
)


@pytest.mark.parametrize(
    ("name", "kwargs", "expected_loss", "grad_of"),
    [
        # seq-mean: loss = -mean_i A_i = -(0.5 - 1 + 2) / 3 = -0.5; dL/dlp_it = -A_i / (3 |y_i|)
        ("gspo", {}, -0.5, lambda a, n: -a / (3 * n)),
        ("gspo_token", {}, -0.5, lambda a, n: -a / (3 * n)),
        ("grpo", {}, -0.5, lambda a, n: -a / (3 * n)),
        # token-mean: -(0.5*3 - 1*1 + 2*4) / 8 = -8.5 / 8 = -1.0625; dL/dlp_it = -A_i / 8
        ("grpo", {"agg": "token-mean"}, -1.0625, lambda a, n: -a / 8),
        # Dr. GRPO, max_len 5: -(1.5 - 1 + 8) / 5 / 3 = -0.5666...; dL/dlp_it = -A_i / (3 * 5)
        (
            "grpo",
            {"agg": "seq-mean-token-sum-norm", "max_len": 5},
            -8.5 / 15,
            lambda a, n: -a / 15,
        ),
    ],
)
def test_identical_policies_ratio_one_and_analytic_gradient(
    name: str, kwargs: dict, expected_loss: float, grad_of
) -> None:
    lp, mask, adv = identical_batch()
    logprobs = leaf(lp)
    settings = {key: value for key, value in kwargs.items() if key != "max_len"}
    max_len = kwargs.get("max_len")  # the reducer's constant, not an arm setting
    loss, stats = run(
        name, logprobs, lp.clone(), adv, mask, opts(name, **settings), max_len=max_len
    )
    loss.backward()
    assert loss.dtype == torch.float32
    assert loss.item() == pytest.approx(expected_loss, rel=1e-6)
    assert_identical_policy_stats(stats)
    expected = [[grad_of(a, n)] * n for a, n in zip(ADV, LENGTHS, strict=True)]
    for got_row, want_row in zip(response(logprobs.grad, mask), expected, strict=True):
        assert got_row == pytest.approx(want_row, rel=1e-6)
    assert torch.all(logprobs.grad[~mask] == 0)


def test_ppo_identical_policies_token_mean_gradient() -> None:
    lp, mask, _ = identical_batch()
    token_adv = torch.randn(lp.shape, generator=torch.Generator().manual_seed(1))
    logprobs = leaf(lp)
    loss, stats = run(ppo_loss, logprobs, lp.clone(), token_adv, mask, opts("ppo"))
    loss.backward()
    # r = 1 everywhere: L = -sum_t A_t / 8 and dL/dlp_t = -A_t / 8 on the 8 response tokens.
    assert loss.item() == pytest.approx(-token_adv[mask].sum().item() / 8, rel=1e-6)
    torch.testing.assert_close(logprobs.grad, torch.where(mask, -token_adv / 8, 0.0))
    assert stats[M.POLICY_CLIP_FRAC] == 0.0 and stats[M.POLICY_RATIO_MEAN] == 1.0


@pytest.mark.parametrize("length", [1, 3, 7, 64, 300])
def test_gspo_log_ratio_moves_by_k_d_over_length(length: int) -> None:
    d = 0.25
    for k in sorted({1, max(1, length // 2), length}):
        old = -torch.rand(length, generator=torch.Generator().manual_seed(length))
        new = old.clone()
        new[:k] += d
        lp, mask = layout([new.tolist()], width=length + 5)
        old_lp, _ = layout([old.tolist()], width=length + 5)
        options = opts("gspo", eps_low=0.9, eps_high=9.0)
        _, stats = run(gspo_loss, lp, old_lp, torch.tensor([1.0]), mask, options)
        # One sequence: ratio_mean = s = exp(k d / |y|); 3e-7 is ~2 float32 ulps of s near 1.
        assert math.log(stats[M.POLICY_RATIO_MEAN]) == pytest.approx(k * d / length, abs=3e-7)


def _gspo_hand_batch(adv: list[float]) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    # Row 0: l = (0.2, 0.0), mean 0.1, s0 = e^0.1 = 1.105170918
    # Row 1: l = (-0.3, 0, 0), mean -0.1, s1 = e^-0.1 = 0.904837418
    lp, mask = layout([[0.2, 0.0], [-0.3, 0.0, 0.0]])
    return leaf(lp), torch.where(mask, 0.0, 1.3), torch.tensor(adv), mask


def test_gspo_hand_positive_advantage_clips_high() -> None:
    lp, old, adv, mask = _gspo_hand_batch([1.0, 1.0])
    loss, stats = run(gspo_loss, lp, old, adv, mask, opts("gspo"))  # eps 3e-4 / 4e-4
    loss.backward()
    # Row 0: s0 > 1.0004, A > 0 -> clipped high: term -1.0004, zero gradient.
    # Row 1: s1 < 1, A > 0 -> unclipped: term -0.904837418, dL/dlp = -s1 / (2 * 3) = -0.150806236
    # loss = (-1.0004 - 0.904837418) / 2 = -0.952618709
    assert loss.item() == pytest.approx(-0.952618709, rel=1e-6)
    grads = response(lp.grad, mask)
    assert grads[0] == [0.0, 0.0]
    assert grads[1] == pytest.approx([-0.150806236] * 3, rel=1e-6)
    # Clipped row 0 holds 2 of 5 tokens.
    assert stats[M.POLICY_CLIP_FRAC_SEQ] == 0.5
    assert stats[M.POLICY_CLIP_FRAC] == pytest.approx(0.4) and stats[
        M.POLICY_CLIP_FRAC_HIGH
    ] == pytest.approx(0.4)
    assert stats[M.POLICY_CLIP_FRAC_LOW] == 0.0
    assert stats[M.POLICY_RATIO_MEAN] == pytest.approx((1.105170918 + 0.904837418) / 2, rel=1e-6)
    assert stats[M.POLICY_RATIO_MIN] == pytest.approx(0.904837418, rel=1e-6)
    assert stats[M.POLICY_RATIO_MAX] == pytest.approx(1.105170918, rel=1e-6)
    # kl_old = mean over 5 tokens of k3: (e^0.2 - 1.2) + (e^-0.3 - 0.7) = 0.062220979; / 5
    assert stats[M.POLICY_KL_OLD] == pytest.approx(0.012444196, rel=1e-5)


def test_gspo_hand_negative_advantage_clips_low() -> None:
    lp, old, adv, mask = _gspo_hand_batch([-1.0, -1.0])
    loss, stats = run(gspo_loss, lp, old, adv, mask, opts("gspo"))
    loss.backward()
    # Row 0: A < 0, s0 > 1 -> unclipped: term +s0, dL/dlp = s0 / (2 * 2) = 0.276292730
    # Row 1: A < 0, s1 < 0.9997 -> clipped low: term +0.9997, zero gradient.
    # loss = (1.105170918 + 0.9997) / 2 = 1.052435459
    assert loss.item() == pytest.approx(1.052435459, rel=1e-6)
    grads = response(lp.grad, mask)
    assert grads[0] == pytest.approx([0.276292730] * 2, rel=1e-6)
    assert grads[1] == [0.0, 0.0, 0.0]
    assert stats[M.POLICY_CLIP_FRAC_SEQ] == 0.5
    assert (
        stats[M.POLICY_CLIP_FRAC_LOW] == pytest.approx(0.6)
        and stats[M.POLICY_CLIP_FRAC_HIGH] == 0.0
    )


def test_gspo_token_hand_per_token_advantages() -> None:
    # One row, l = (0.2, 0.0): s = e^0.1 = 1.105170918 on both tokens; A = (+1, -1).
    lp, mask = layout([[0.2, 0.0]])
    lp = leaf(lp)
    adv = torch.where(mask, torch.tensor([[0.0, 0.0, 1.0, -1.0, 0.0]]), 0.0)
    loss, stats = run(
        gspo_token_loss, lp, torch.where(mask, 0.0, 2.0), adv, mask, opts("gspo_token")
    )
    loss.backward()
    # Token 0: A > 0, s > 1.0004 -> clipped high: -1.0004, no gradient.
    # Token 1: A < 0, s > 1 -> unclipped: +s; its gradient s / |y| = 0.552585459 goes to token 1
    # only (sg[s_i] blocks the path through the other tokens).
    # loss = (-1.0004 + 1.105170918) / 2 = 0.052385459
    assert loss.item() == pytest.approx(0.052385459, rel=1e-5)
    assert response(lp.grad, mask) == [pytest.approx([0.0, 0.552585459], rel=1e-6)]
    assert stats[M.POLICY_CLIP_FRAC] == 0.5 and stats[M.POLICY_CLIP_FRAC_HIGH] == 0.5
    assert stats[M.POLICY_CLIP_FRAC_SEQ] == 1.0


def test_gspo_token_equals_gspo_with_sequence_constant_advantages() -> None:
    gen = torch.Generator().manual_seed(3)
    rows = [(-2 * torch.rand(n, generator=gen)).tolist() for n in (5, 1, 12, 7, 30, 2)]
    lp, mask = layout(rows)
    old = lp + 0.01 * torch.randn(lp.shape, generator=gen)
    adv = torch.tensor([1.0, -0.5, 2.0, -1.5, 0.7, -0.2])
    lp_a, lp_b = leaf(lp), leaf(lp)
    loss_a, stats_a = run(gspo_loss, lp_a, old, adv, mask, opts("gspo"))
    loss_b, stats_b = run(gspo_token_loss, lp_b, old, adv, mask, opts("gspo_token"))
    loss_a.backward()
    loss_b.backward()
    assert 0.0 < stats_a[M.POLICY_CLIP_FRAC_SEQ] < 1.0  # both branches are exercised
    assert loss_b.item() == pytest.approx(loss_a.item(), rel=1e-5)
    torch.testing.assert_close(lp_b.grad, lp_a.grad, rtol=1e-5, atol=1e-8)
    for key in CLIP_METRICS:
        assert stats_b[key] == pytest.approx(stats_a[key], rel=1e-6), key


def test_is_weights_scale_token_terms_and_gspo_sequence_mean() -> None:
    lp, mask = layout([[-0.5, -0.6], [-0.7]])
    weights = torch.where(mask, torch.tensor([[0, 0, 2.0, 0.5, 0], [0, 0, 1.5, 0, 0]]), 9.0)
    adv = torch.tensor([1.0, -2.0])
    # r = 1. GRPO token-mean: -(1*2 + 1*0.5 - 2*1.5) / 3 = 0.5 / 3
    options = opts("grpo", agg="token-mean")
    loss, _ = run(grpo_loss, lp, lp, adv, mask, options, is_weights=weights)
    assert loss.item() == pytest.approx(0.5 / 3, rel=1e-6)
    # GSPO: sequence means of the weights are 1.25 and 1.5: -(1 * 1.25 - 2 * 1.5) / 2 = 0.875
    loss, _ = run(gspo_loss, lp, lp, adv, mask, opts("gspo"), is_weights=weights)
    assert loss.item() == pytest.approx(0.875, rel=1e-6)
    # GSPO-token weights tokens, so the value matches GSPO's: (-(2 + 0.5) / 2 + 2 * 1.5) / 2
    loss, _ = run(gspo_token_loss, lp, lp, adv, mask, opts("gspo_token"), is_weights=weights)
    assert loss.item() == pytest.approx(0.875, rel=1e-6)
