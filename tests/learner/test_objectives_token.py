"""GRPO and PPO: hand-worked clipping cases, aggregation modes and input checks."""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor

from contract import metrics as M
from learner.algorithms.objectives import LossAggregation, grpo_loss, gspo_loss, ppo_loss
from tests.learner.objective_inputs import identical_batch, layout, leaf, opts, response, run

LN = math.log


def _grpo_hand_batch() -> tuple[Tensor, Tensor, Tensor]:
    # One row of 4 tokens with ratios r = (1.5, 0.5, 1.1, 1.0) against old logprobs of 0.
    lp, mask = layout([[LN(1.5), LN(0.5), LN(1.1), 0.0]])
    return leaf(lp), torch.where(mask, 0.0, -1.0), mask


def test_grpo_hand_positive_advantage() -> None:
    lp, old, mask = _grpo_hand_batch()
    loss, stats = run(grpo_loss, lp, old, torch.tensor([1.0]), mask, opts("grpo"))  # eps 0.2 / 0.2
    loss.backward()
    # A = +1: r=1.5 > 1.2 clipped high -> -1.2 (grad 0); r=0.5 -> -0.5 (grad -0.5 = -A r);
    # r=1.1 -> -1.1 (grad -1.1); r=1 -> -1 (grad -1). seq-mean-token-mean over 4 tokens:
    # loss = (-1.2 - 0.5 - 1.1 - 1.0) / 4 = -0.95; grads / 4 = (0, -0.125, -0.275, -0.25)
    assert loss.item() == pytest.approx(-0.95, rel=1e-6)
    assert response(lp.grad, mask) == [pytest.approx([0.0, -0.125, -0.275, -0.25], rel=1e-6)]
    assert stats[M.POLICY_CLIP_FRAC] == 0.25 and stats[M.POLICY_CLIP_FRAC_HIGH] == 0.25
    assert stats[M.POLICY_CLIP_FRAC_LOW] == 0.0 and stats[M.POLICY_CLIP_FRAC_SEQ] == 1.0
    assert stats[M.POLICY_RATIO_MEAN] == pytest.approx(1.025, rel=1e-6)  # (1.5 + 0.5 + 1.1 + 1) / 4
    assert stats[M.POLICY_RATIO_MIN] == pytest.approx(0.5) and stats[
        M.POLICY_RATIO_MAX
    ] == pytest.approx(1.5)
    # k3 per token r - 1 - ln r: 0.094534892 + 0.193147181 + 0.004689820 + 0 = 0.292371893; / 4
    assert stats[M.POLICY_KL_OLD] == pytest.approx(0.073092973, rel=1e-5)


def test_grpo_hand_negative_advantage() -> None:
    lp, old, mask = _grpo_hand_batch()
    loss, stats = run(grpo_loss, lp, old, torch.tensor([-1.0]), mask, opts("grpo"))
    loss.backward()
    # A = -1: r=1.5 -> +1.5 (grad +1.5); r=0.5 < 0.8 clipped low -> +0.8 (grad 0);
    # r=1.1 -> +1.1; r=1 -> +1. loss = 4.4 / 4 = 1.1; grads / 4 = (0.375, 0, 0.275, 0.25)
    assert loss.item() == pytest.approx(1.1, rel=1e-6)
    assert response(lp.grad, mask) == [pytest.approx([0.375, 0.0, 0.275, 0.25], rel=1e-6)]
    assert stats[M.POLICY_CLIP_FRAC_LOW] == 0.25 and stats[M.POLICY_CLIP_FRAC_HIGH] == 0.0


def test_grpo_clip_higher_is_asymmetric() -> None:
    # DAPO clip-higher eps_low 0.2, eps_high 0.28, A = +1: r = 1.25 is inside (grad -1.25),
    # r = 1.3 is clipped at 1.28 (grad 0). loss = (-1.25 - 1.28) / 2 = -1.265
    lp, mask = layout([[LN(1.25), LN(1.3)]])
    lp = leaf(lp)
    options = opts("grpo", eps_high=0.28)
    loss, stats = run(grpo_loss, lp, torch.zeros_like(lp), torch.tensor([1.0]), mask, options)
    loss.backward()
    assert loss.item() == pytest.approx(-1.265, rel=1e-6)
    assert response(lp.grad, mask) == [pytest.approx([-0.625, 0.0], rel=1e-6)]
    assert stats[M.POLICY_CLIP_FRAC_HIGH] == 0.5


def test_ppo_hand_all_four_regions() -> None:
    # Row 0: r = (1.5, 0.5, 1.5) with A = (2, 0.5, -1); row 1: r = 0.5 with A = -3.
    lp, mask = layout([[LN(1.5), LN(0.5), LN(1.5)], [LN(0.5)]])
    lp = leaf(lp)
    adv = torch.zeros_like(lp)
    adv[mask] = torch.tensor([2.0, 0.5, -1.0, -3.0])
    loss, stats = run(ppo_loss, lp, torch.zeros_like(lp), adv, mask, opts("ppo"))
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
    assert stats[M.POLICY_CLIP_FRAC] == 0.5
    assert stats[M.POLICY_CLIP_FRAC_LOW] == 0.25 and stats[M.POLICY_CLIP_FRAC_HIGH] == 0.25
    assert stats[M.POLICY_CLIP_FRAC_SEQ] == 1.0


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
    loss, _ = run(
        grpo_loss,
        lp,
        lp.detach(),
        torch.tensor([2.0, -1.0, 5.0]),
        mask,
        opts("grpo", agg=agg),
        max_len=max_len,
    )
    loss.backward()
    assert loss.item() == pytest.approx(expected_loss, rel=1e-6)
    got = response(lp.grad, mask)
    assert got[0] == pytest.approx(expected_grads[0], rel=1e-6)
    assert got[1] == pytest.approx(expected_grads[1], rel=1e-6)
    assert got[2] == []


def test_grpo_rejects_bad_aggregation() -> None:
    lp, mask, adv = identical_batch()
    with pytest.raises(ValueError, match="max_len"):
        run(grpo_loss, lp, lp, adv, mask, opts("grpo", agg="seq-mean-token-sum-norm"))
    with pytest.raises(ValueError, match="unknown loss aggregation"):
        run(grpo_loss, lp, lp, adv, mask, opts("grpo", agg="seq-sum"))
    with pytest.raises(ValueError, match="ref_logprobs"):
        run(grpo_loss, lp, lp, adv, mask, opts("grpo", beta=0.1))
    with pytest.raises(ValueError, match=r"\[B, T\]"):
        run(ppo_loss, lp, lp, adv, mask, opts("ppo"))
    with pytest.raises(ValueError, match=r"advantages \[B\]"):
        run(gspo_loss, lp, lp, torch.zeros_like(lp), mask, opts("gspo"))
