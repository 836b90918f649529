"""Policy objectives: sanity properties of design section 6 and hand-worked clipping cases.

Batches are laid out like the learner's: `prompt` prompt slots (mask 0), the response, then right
padding (mask 0). Prompt and padding slots hold junk so any leak shows up in the values.
"""

from __future__ import annotations

import math
from typing import get_args

import pytest
import torch
from torch import Tensor

from learner.objectives import (
    LOSS_AGGREGATIONS,
    OBJECTIVES,
    LossAggregation,
    Objective,
    clipped_surrogate,
    grpo_loss,
    gspo_loss,
    gspo_token_loss,
    ppo_loss,
)

LN = math.log
STAT_KEYS = {"loss", "clip_frac", "clip_frac_seq", "clip_frac_low", "clip_frac_high"}
STAT_KEYS |= {"ratio_mean", "ratio_min", "ratio_max", "kl_old"}


def layout(
    rows: list[list[float]], prompt: int = 2, width: int | None = None, junk: float = -7.5
) -> tuple[Tensor, Tensor]:
    """Rows of response values -> (values [B, T] with junk off the response, bool mask [B, T])."""
    width = width or prompt + max(len(r) for r in rows) + 1
    values = torch.full((len(rows), width), junk)
    mask = torch.zeros(len(rows), width, dtype=torch.bool)
    for i, row in enumerate(rows):
        values[i, prompt : prompt + len(row)] = torch.tensor(row)
        mask[i, prompt : prompt + len(row)] = True
    return values, mask


def response(grad: Tensor, mask: Tensor) -> list[list[float]]:
    """Per-row values on the response tokens, for comparison with hand-worked lists."""
    return [grad[i][mask[i]].tolist() for i in range(grad.shape[0])]


def leaf(x: Tensor) -> Tensor:
    return x.clone().requires_grad_()


def test_registry_matches_literal() -> None:
    assert set(OBJECTIVES) == set(get_args(Objective)) == {"gspo", "gspo_token", "grpo", "ppo"}
    assert set(LOSS_AGGREGATIONS) == set(get_args(LossAggregation))


# Identical policies: lengths 3, 1, 4 (8 tokens, 3 sequences), A = (0.5, -1, 2).
ADV = [0.5, -1.0, 2.0]
LENGTHS = [3, 1, 4]


def _identical_batch() -> tuple[Tensor, Tensor, Tensor]:
    gen = torch.Generator().manual_seed(0)
    rows = [(-3 * torch.rand(n, generator=gen)).tolist() for n in LENGTHS]
    lp, mask = layout(rows)
    return lp, mask, torch.tensor(ADV)


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
    lp, mask, adv = _identical_batch()
    logprobs = leaf(lp)
    loss, stats = OBJECTIVES[name](logprobs, lp.clone(), adv, mask, **kwargs)
    loss.backward()
    assert loss.dtype == torch.float32
    assert loss.item() == pytest.approx(expected_loss, rel=1e-6)
    assert set(stats) == STAT_KEYS
    assert stats["ratio_mean"] == stats["ratio_min"] == stats["ratio_max"] == 1.0
    for key in ("clip_frac", "clip_frac_seq", "clip_frac_low", "clip_frac_high", "kl_old"):
        assert stats[key] == 0.0, key
    expected = [[grad_of(a, n)] * n for a, n in zip(ADV, LENGTHS, strict=True)]
    for got_row, want_row in zip(response(logprobs.grad, mask), expected, strict=True):
        assert got_row == pytest.approx(want_row, rel=1e-6)
    assert torch.all(logprobs.grad[~mask] == 0)


def test_ppo_identical_policies_token_mean_gradient() -> None:
    lp, mask, _ = _identical_batch()
    token_adv = torch.randn(lp.shape, generator=torch.Generator().manual_seed(1))
    logprobs = leaf(lp)
    loss, stats = ppo_loss(logprobs, lp.clone(), token_adv, mask)
    loss.backward()
    # r = 1 everywhere: L = -sum_t A_t / 8 and dL/dlp_t = -A_t / 8 on the 8 response tokens.
    assert loss.item() == pytest.approx(-token_adv[mask].sum().item() / 8, rel=1e-6)
    torch.testing.assert_close(logprobs.grad, torch.where(mask, -token_adv / 8, 0.0))
    assert stats["clip_frac"] == 0.0 and stats["ratio_mean"] == 1.0


@pytest.mark.parametrize("length", [1, 3, 7, 64, 300])
def test_gspo_log_ratio_moves_by_k_d_over_length(length: int) -> None:
    d = 0.25
    for k in sorted({1, max(1, length // 2), length}):
        old = -torch.rand(length, generator=torch.Generator().manual_seed(length))
        new = old.clone()
        new[:k] += d
        lp, mask = layout([new.tolist()], width=length + 5)
        old_lp, _ = layout([old.tolist()], width=length + 5)
        _, stats = gspo_loss(lp, old_lp, torch.tensor([1.0]), mask, eps_low=0.9, eps_high=9.0)
        # One sequence: ratio_mean = s = exp(k d / |y|); 3e-7 is ~2 float32 ulps of s near 1.
        assert math.log(stats["ratio_mean"]) == pytest.approx(k * d / length, abs=3e-7)


def _gspo_hand_batch(adv: list[float]) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    # Row 0: l = (0.2, 0.0), mean 0.1, s0 = e^0.1 = 1.105170918
    # Row 1: l = (-0.3, 0, 0), mean -0.1, s1 = e^-0.1 = 0.904837418
    lp, mask = layout([[0.2, 0.0], [-0.3, 0.0, 0.0]])
    return leaf(lp), torch.where(mask, 0.0, 1.3), torch.tensor(adv), mask


def test_gspo_hand_positive_advantage_clips_high() -> None:
    lp, old, adv, mask = _gspo_hand_batch([1.0, 1.0])
    loss, stats = gspo_loss(lp, old, adv, mask)  # eps 3e-4 / 4e-4
    loss.backward()
    # Row 0: s0 > 1.0004, A > 0 -> clipped high: term -1.0004, zero gradient.
    # Row 1: s1 < 1, A > 0 -> unclipped: term -0.904837418, dL/dlp = -s1 / (2 * 3) = -0.150806236
    # loss = (-1.0004 - 0.904837418) / 2 = -0.952618709
    assert loss.item() == pytest.approx(-0.952618709, rel=1e-6)
    grads = response(lp.grad, mask)
    assert grads[0] == [0.0, 0.0]
    assert grads[1] == pytest.approx([-0.150806236] * 3, rel=1e-6)
    # Clipped row 0 holds 2 of 5 tokens.
    assert stats["clip_frac_seq"] == 0.5
    assert stats["clip_frac"] == pytest.approx(0.4) and stats["clip_frac_high"] == pytest.approx(
        0.4
    )
    assert stats["clip_frac_low"] == 0.0
    assert stats["ratio_mean"] == pytest.approx((1.105170918 + 0.904837418) / 2, rel=1e-6)
    assert stats["ratio_min"] == pytest.approx(0.904837418, rel=1e-6)
    assert stats["ratio_max"] == pytest.approx(1.105170918, rel=1e-6)
    # kl_old = mean over 5 tokens of k3: (e^0.2 - 1.2) + (e^-0.3 - 0.7) = 0.062220979; / 5
    assert stats["kl_old"] == pytest.approx(0.012444196, rel=1e-5)


def test_gspo_hand_negative_advantage_clips_low() -> None:
    lp, old, adv, mask = _gspo_hand_batch([-1.0, -1.0])
    loss, stats = gspo_loss(lp, old, adv, mask)
    loss.backward()
    # Row 0: A < 0, s0 > 1 -> unclipped: term +s0, dL/dlp = s0 / (2 * 2) = 0.276292730
    # Row 1: A < 0, s1 < 0.9997 -> clipped low: term +0.9997, zero gradient.
    # loss = (1.105170918 + 0.9997) / 2 = 1.052435459
    assert loss.item() == pytest.approx(1.052435459, rel=1e-6)
    grads = response(lp.grad, mask)
    assert grads[0] == pytest.approx([0.276292730] * 2, rel=1e-6)
    assert grads[1] == [0.0, 0.0, 0.0]
    assert stats["clip_frac_seq"] == 0.5
    assert stats["clip_frac_low"] == pytest.approx(0.6) and stats["clip_frac_high"] == 0.0


def test_gspo_token_hand_per_token_advantages() -> None:
    # One row, l = (0.2, 0.0): s = e^0.1 = 1.105170918 on both tokens; A = (+1, -1).
    lp, mask = layout([[0.2, 0.0]])
    lp = leaf(lp)
    adv = torch.where(mask, torch.tensor([[0.0, 0.0, 1.0, -1.0, 0.0]]), 0.0)
    loss, stats = gspo_token_loss(lp, torch.where(mask, 0.0, 2.0), adv, mask)
    loss.backward()
    # Token 0: A > 0, s > 1.0004 -> clipped high: -1.0004, no gradient.
    # Token 1: A < 0, s > 1 -> unclipped: +s; its gradient s / |y| = 0.552585459 goes to token 1
    # only (sg[s_i] blocks the path through the other tokens).
    # loss = (-1.0004 + 1.105170918) / 2 = 0.052385459
    assert loss.item() == pytest.approx(0.052385459, rel=1e-5)
    assert response(lp.grad, mask) == [pytest.approx([0.0, 0.552585459], rel=1e-6)]
    assert stats["clip_frac"] == 0.5 and stats["clip_frac_high"] == 0.5
    assert stats["clip_frac_seq"] == 1.0


def _grpo_hand_batch() -> tuple[Tensor, Tensor, Tensor]:
    # One row of 4 tokens with ratios r = (1.5, 0.5, 1.1, 1.0) against old logprobs of 0.
    lp, mask = layout([[LN(1.5), LN(0.5), LN(1.1), 0.0]])
    return leaf(lp), torch.where(mask, 0.0, -1.0), mask


def test_grpo_hand_positive_advantage() -> None:
    lp, old, mask = _grpo_hand_batch()
    loss, stats = grpo_loss(lp, old, torch.tensor([1.0]), mask)  # eps 0.2 / 0.2
    loss.backward()
    # A = +1: r=1.5 > 1.2 clipped high -> -1.2 (grad 0); r=0.5 -> -0.5 (grad -0.5 = -A r);
    # r=1.1 -> -1.1 (grad -1.1); r=1 -> -1 (grad -1). seq-mean-token-mean over 4 tokens:
    # loss = (-1.2 - 0.5 - 1.1 - 1.0) / 4 = -0.95; grads / 4 = (0, -0.125, -0.275, -0.25)
    assert loss.item() == pytest.approx(-0.95, rel=1e-6)
    assert response(lp.grad, mask) == [pytest.approx([0.0, -0.125, -0.275, -0.25], rel=1e-6)]
    assert stats["clip_frac"] == 0.25 and stats["clip_frac_high"] == 0.25
    assert stats["clip_frac_low"] == 0.0 and stats["clip_frac_seq"] == 1.0
    assert stats["ratio_mean"] == pytest.approx(1.025, rel=1e-6)  # (1.5 + 0.5 + 1.1 + 1) / 4
    assert stats["ratio_min"] == pytest.approx(0.5) and stats["ratio_max"] == pytest.approx(1.5)
    # k3 per token r - 1 - ln r: 0.094534892 + 0.193147181 + 0.004689820 + 0 = 0.292371893; / 4
    assert stats["kl_old"] == pytest.approx(0.073092973, rel=1e-5)


def test_grpo_hand_negative_advantage() -> None:
    lp, old, mask = _grpo_hand_batch()
    loss, stats = grpo_loss(lp, old, torch.tensor([-1.0]), mask)
    loss.backward()
    # A = -1: r=1.5 -> +1.5 (grad +1.5); r=0.5 < 0.8 clipped low -> +0.8 (grad 0);
    # r=1.1 -> +1.1; r=1 -> +1. loss = 4.4 / 4 = 1.1; grads / 4 = (0.375, 0, 0.275, 0.25)
    assert loss.item() == pytest.approx(1.1, rel=1e-6)
    assert response(lp.grad, mask) == [pytest.approx([0.375, 0.0, 0.275, 0.25], rel=1e-6)]
    assert stats["clip_frac_low"] == 0.25 and stats["clip_frac_high"] == 0.0


def test_grpo_clip_higher_is_asymmetric() -> None:
    # DAPO clip-higher eps_low 0.2, eps_high 0.28, A = +1: r = 1.25 is inside (grad -1.25),
    # r = 1.3 is clipped at 1.28 (grad 0). loss = (-1.25 - 1.28) / 2 = -1.265
    lp, mask = layout([[LN(1.25), LN(1.3)]])
    lp = leaf(lp)
    loss, stats = grpo_loss(lp, torch.zeros_like(lp), torch.tensor([1.0]), mask, eps_high=0.28)
    loss.backward()
    assert loss.item() == pytest.approx(-1.265, rel=1e-6)
    assert response(lp.grad, mask) == [pytest.approx([-0.625, 0.0], rel=1e-6)]
    assert stats["clip_frac_high"] == 0.5


def test_ppo_hand_all_four_regions() -> None:
    # Row 0: r = (1.5, 0.5, 1.5) with A = (2, 0.5, -1); row 1: r = 0.5 with A = -3.
    lp, mask = layout([[LN(1.5), LN(0.5), LN(1.5)], [LN(0.5)]])
    lp = leaf(lp)
    adv = torch.zeros_like(lp)
    adv[mask] = torch.tensor([2.0, 0.5, -1.0, -3.0])
    loss, stats = ppo_loss(lp, torch.zeros_like(lp), adv, mask)
    loss.backward()
    # A=2,   r=1.5: -min(3, 2.4) = -2.4 clipped high, grad 0
    # A=0.5, r=0.5: -min(0.25, 0.4) = -0.25, grad -A r = -0.25
    # A=-1,  r=1.5: -min(-1.5, -1.2) = 1.5, grad -A r = 1.5
    # A=-3,  r=0.5: -min(-1.5, -2.4) = 2.4 clipped low, grad 0
    # token-mean: (-2.4 - 0.25 + 1.5 + 2.4) / 4 = 0.3125; grads / 4
    assert loss.item() == pytest.approx(0.3125, rel=1e-6)
    assert response(lp.grad, mask) == [
        pytest.approx([0.0, -0.0625, 0.375], rel=1e-6),
        pytest.approx([0.0]),
    ]
    assert stats["clip_frac"] == 0.5
    assert stats["clip_frac_low"] == 0.25 and stats["clip_frac_high"] == 0.25
    assert stats["clip_frac_seq"] == 1.0


@pytest.mark.parametrize(
    ("agg", "max_len", "expected_loss", "expected_grads"),
    [
        # Rows of lengths 1 and 3 (and an empty row, A = 5, which must not count); r = 1, so
        # each token's term is -A_i with A = (2, -1).
        # seq-mean-token-mean: (-2 + 1) / 2 = -0.5; grads -A_i / (2 |y_i|) = -1, 1/6
        ("seq-mean-token-mean", None, -0.5, [[-1.0], [1 / 6] * 3]),
        # token-mean: (-2 + 3) / 4 = 0.25; grads -A_i / 4 = -0.5, 0.25
        ("token-mean", None, 0.25, [[-0.5], [0.25] * 3]),
        # Dr. GRPO, max_len 4: (-2 / 4 + 3 / 4) / 2 = 0.125; grads -A_i / (2 * 4)
        ("seq-mean-token-sum-norm", 4, 0.125, [[-0.25], [0.125] * 3]),
    ],
)
def test_grpo_aggregation_modes_on_ragged_lengths(
    agg: LossAggregation, max_len: int | None, expected_loss: float, expected_grads: list
) -> None:
    lp, mask = layout([[-0.1], [-0.2, -0.3, -0.4], []])
    lp = leaf(lp)
    loss, _ = grpo_loss(
        lp, lp.detach(), torch.tensor([2.0, -1.0, 5.0]), mask, agg=agg, max_len=max_len
    )
    loss.backward()
    assert loss.item() == pytest.approx(expected_loss, rel=1e-6)
    got = response(lp.grad, mask)
    assert got[0] == pytest.approx(expected_grads[0], rel=1e-6)
    assert got[1] == pytest.approx(expected_grads[1], rel=1e-6)
    assert got[2] == []


def test_grpo_rejects_bad_aggregation() -> None:
    lp, mask, adv = _identical_batch()
    with pytest.raises(ValueError, match="max_len"):
        grpo_loss(lp, lp, adv, mask, agg="seq-mean-token-sum-norm")
    with pytest.raises(ValueError, match="unknown loss aggregation"):
        grpo_loss(lp, lp, adv, mask, agg="seq-sum")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="ref_logprobs"):
        grpo_loss(lp, lp, adv, mask, beta=0.1)
    with pytest.raises(ValueError, match=r"\[B, T\]"):
        ppo_loss(lp, lp, adv, mask)
    with pytest.raises(ValueError, match=r"advantages \[B\]"):
        gspo_loss(lp, lp, torch.zeros_like(lp), mask)


def test_gspo_token_equals_gspo_with_sequence_constant_advantages() -> None:
    gen = torch.Generator().manual_seed(3)
    rows = [(-2 * torch.rand(n, generator=gen)).tolist() for n in (5, 1, 12, 7, 30, 2)]
    lp, mask = layout(rows)
    old = lp + 0.01 * torch.randn(lp.shape, generator=gen)
    adv = torch.tensor([1.0, -0.5, 2.0, -1.5, 0.7, -0.2])
    lp_a, lp_b = leaf(lp), leaf(lp)
    loss_a, stats_a = gspo_loss(lp_a, old, adv, mask)
    loss_b, stats_b = gspo_token_loss(lp_b, old, adv, mask)
    loss_a.backward()
    loss_b.backward()
    assert 0.0 < stats_a["clip_frac_seq"] < 1.0  # both branches are exercised
    assert loss_b.item() == pytest.approx(loss_a.item(), rel=1e-5)
    torch.testing.assert_close(lp_b.grad, lp_a.grad, rtol=1e-5, atol=1e-8)
    for key in ("clip_frac", "clip_frac_seq", "clip_frac_low", "clip_frac_high", "kl_old"):
        assert stats_b[key] == pytest.approx(stats_a[key], rel=1e-6), key


def test_is_weights_scale_token_terms_and_gspo_sequence_mean() -> None:
    lp, mask = layout([[-0.5, -0.6], [-0.7]])
    weights = torch.where(mask, torch.tensor([[0, 0, 2.0, 0.5, 0], [0, 0, 1.5, 0, 0]]), 9.0)
    adv = torch.tensor([1.0, -2.0])
    # r = 1. GRPO token-mean: -(1*2 + 1*0.5 - 2*1.5) / 3 = 0.5 / 3
    loss, _ = grpo_loss(lp, lp, adv, mask, agg="token-mean", is_weights=weights)
    assert loss.item() == pytest.approx(0.5 / 3, rel=1e-6)
    # GSPO: sequence means of the weights are 1.25 and 1.5: -(1 * 1.25 - 2 * 1.5) / 2 = 0.875
    loss, _ = gspo_loss(lp, lp, adv, mask, is_weights=weights)
    assert loss.item() == pytest.approx(0.875, rel=1e-6)
    # GSPO-token weights tokens, so the value matches GSPO's: (-(2 + 0.5) / 2 + 2 * 1.5) / 2
    loss, _ = gspo_token_loss(lp, lp, adv, mask, is_weights=weights)
    assert loss.item() == pytest.approx(0.875, rel=1e-6)


@pytest.mark.parametrize("name", ["gspo", "gspo_token", "grpo", "ppo"])
def test_kl_reference_term_added_with_beta(name: str) -> None:
    lp, mask = layout([[-0.5, -0.6], [-0.7]])
    logprobs = leaf(lp)
    ref = lp + LN(2.0)  # log r = log ref - log pi = ln 2 on every token: k3 = 2 - 1 - ln 2
    adv = torch.zeros_like(lp) if name == "ppo" else torch.zeros(2)
    loss, stats = OBJECTIVES[name](logprobs, lp, adv, mask, ref_logprobs=ref, beta=0.1)
    loss.backward()
    # A = 0, so the loss is 0.1 * k3 = 0.1 * 0.306852819 under every aggregation.
    assert stats["kl_ref"] == pytest.approx(0.306852819, rel=1e-6)
    assert loss.item() == pytest.approx(0.0306852819, rel=1e-6)
    # d k3 / d log pi = 1 - r = -1, times beta and the aggregation weight of each token.
    weights = [[1 / 4, 1 / 4], [1 / 2]] if name != "ppo" else [[1 / 3, 1 / 3], [1 / 3]]
    expected = [[-0.1 * w for w in row] for row in weights]
    got = response(logprobs.grad, mask)
    for got_row, want_row in zip(got, expected, strict=True):
        assert got_row == pytest.approx(want_row, rel=1e-6)
    _, stats = OBJECTIVES[name](lp, lp, adv, mask, ref_logprobs=ref)  # beta 0: measured only
    assert stats["kl_ref"] == pytest.approx(0.306852819, rel=1e-6)


@pytest.mark.parametrize("name", ["gspo", "gspo_token", "grpo", "ppo"])
def test_bf16_inputs_give_float32_loss(name: str) -> None:
    lp, mask, adv = _identical_batch()
    old = (lp + 0.05).bfloat16()
    adv = torch.ones_like(lp) if name == "ppo" else adv
    low = leaf(lp.bfloat16())
    loss, _ = OBJECTIVES[name](low, old, adv.bfloat16(), mask)
    loss.backward()
    assert loss.dtype == torch.float32 and low.grad.dtype == torch.bfloat16
    # Same as computing in float32 from the bf16-rounded values.
    ref, _ = OBJECTIVES[name](low.detach().float(), old.float(), adv.bfloat16().float(), mask)
    assert loss.item() == pytest.approx(ref.item(), rel=1e-6)


@pytest.mark.parametrize("name", ["gspo", "gspo_token", "grpo", "ppo"])
def test_batch_without_response_tokens_gives_zero_loss_with_graph(name: str) -> None:
    lp = leaf(torch.full((2, 4), -1.0))
    mask = torch.zeros(2, 4, dtype=torch.bool)
    adv = torch.ones(2, 4) if name == "ppo" else torch.ones(2)
    loss, stats = OBJECTIVES[name](lp, lp.detach() + 3.0, adv, mask)
    assert loss.item() == 0.0 and loss.requires_grad
    loss.backward()
    assert torch.all(lp.grad == 0)
    assert all(math.isfinite(v) for v in stats.values())
    assert stats["ratio_mean"] == stats["ratio_min"] == stats["ratio_max"] == 1.0


def test_clipped_surrogate_gradient_matches_autograd_reference() -> None:
    gen = torch.Generator().manual_seed(5)
    log_ratio = (0.5 * torch.randn(4000, generator=gen, dtype=torch.float64)).requires_grad_()
    adv = torch.randn(4000, generator=gen, dtype=torch.float64)
    loss, ratio, clipped = clipped_surrogate(log_ratio, adv, 0.2, 0.28)
    loss.sum().backward()
    ref_log_ratio = log_ratio.detach().clone().requires_grad_()
    r = ref_log_ratio.exp()
    ref = torch.maximum(-adv * r, -adv * r.clamp(0.8, 1.28))
    ref.sum().backward()
    torch.testing.assert_close(loss, ref.detach(), rtol=1e-12, atol=0)
    torch.testing.assert_close(ratio, r.detach(), rtol=1e-12, atol=0)
    torch.testing.assert_close(log_ratio.grad, ref_log_ratio.grad, rtol=1e-12, atol=0)
    expected_clipped = ((adv > 0) & (r > 1.28)) | ((adv < 0) & (r < 0.8))
    assert torch.equal(clipped.bool(), expected_clipped)
    assert 0 < expected_clipped.sum() < 4000


def test_clipped_surrogate_passes_gradcheck_away_from_kinks() -> None:
    log_ratio = torch.tensor([-0.5, -0.1, 0.05, 0.3, 0.6, 25.0], dtype=torch.float64)
    adv = torch.tensor([1.0, -2.0, 0.5, -1.0, 3.0, -1.0], dtype=torch.float64)
    assert torch.autograd.gradcheck(
        lambda x: clipped_surrogate(x, adv[:5], 0.2, 0.2)[0], log_ratio[:5].requires_grad_()
    )
    # Beyond the +-20 clamp the gradient is finite: -A e^20 (r taken at the clamp).
    x = log_ratio[5:].clone().requires_grad_()
    clipped_surrogate(x, adv[5:], 0.2, 0.2)[0].sum().backward()
    assert x.grad.item() == pytest.approx(math.exp(20.0), rel=1e-12)
