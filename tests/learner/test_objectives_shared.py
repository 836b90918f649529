"""What every objective shares: the reference-KL term, dtypes, empty batches, and the
clipped surrogate's closed-form gradient.
"""

from __future__ import annotations

import math
from typing import get_args

import pytest
import torch

from contract import metrics as M
from learner.algorithms.objectives import clipped_surrogate
from learner.config import make_arm
from learner.vocabulary import Objective
from tests.learner import objective_inputs
from tests.learner.objective_inputs import identical_batch, layout, leaf, opts, response, run

LN = math.log
ALL_OBJECTIVES = get_args(Objective)  # the properties every objective shares, built-in or zoo


@pytest.mark.parametrize("name", ALL_OBJECTIVES)
def test_kl_reference_term_added_with_beta(name: str) -> None:
    lp, mask = layout([[-0.5, -0.6], [-0.7]])
    logprobs = leaf(lp)
    ref = lp + LN(2.0)  # log r = log ref - log pi = ln 2 on every token: k3 = 2 - 1 - ln 2
    arm = make_arm(name="a", objective=name)
    adv = torch.zeros_like(lp) if arm.advantages == "gae" else torch.zeros(2)
    loss, stats = run(name, logprobs, lp, adv, mask, opts(name, beta=0.1), ref_logprobs=ref)
    loss.backward()
    # A = 0, so the loss is 0.1 * k3 = 0.1 * 0.306852819 under every aggregation.
    assert stats[M.POLICY_KL_REF] == pytest.approx(0.306852819, rel=1e-6)
    assert loss.item() == pytest.approx(0.0306852819, rel=1e-6)
    # d k3 / d log pi = 1 - r = -1, times beta and the aggregation weight of each token: a
    # token mean (PPO, CISPO, Clip-Cov, KL-Cov) or a mean of sequence means (the others).
    token_mean = arm.loss_units == "tokens"
    weights = [[1 / 3, 1 / 3], [1 / 3]] if token_mean else [[1 / 4, 1 / 4], [1 / 2]]
    expected = [[-0.1 * w for w in row] for row in weights]
    got = response(logprobs.grad, mask)
    for got_row, want_row in zip(got, expected, strict=True):
        assert got_row == pytest.approx(want_row, rel=1e-6)
    _, stats = run(name, lp, lp, adv, mask, opts(name), ref_logprobs=ref)  # beta 0: measured
    assert stats[M.POLICY_KL_REF] == pytest.approx(0.306852819, rel=1e-6)


@pytest.mark.parametrize("name", ALL_OBJECTIVES)
def test_bf16_inputs_give_float32_loss(name: str) -> None:
    lp, mask, adv = identical_batch()
    old = (lp + 0.05).bfloat16()
    adv = torch.ones_like(lp) if name == "ppo" else adv
    low = leaf(lp.bfloat16())
    loss, _ = run(name, low, old, adv.bfloat16(), mask, opts(name))
    loss.backward()
    assert loss.dtype == torch.float32 and low.grad.dtype == torch.bfloat16
    # Same as computing in float32 from the bf16-rounded values.
    ref, _ = run(name, low.detach().float(), old.float(), adv.bfloat16().float(), mask, opts(name))
    assert loss.item() == pytest.approx(ref.item(), rel=1e-6)


@pytest.mark.parametrize("name", ALL_OBJECTIVES)
def test_batch_without_response_tokens_gives_zero_loss_with_graph(name: str) -> None:
    lp = leaf(torch.full((2, 4), -1.0))
    mask = torch.zeros(2, 4, dtype=torch.bool)
    adv = torch.ones(2, 4) if name == "ppo" else torch.ones(2)
    loss, stats = run(name, lp, lp.detach() + 3.0, adv, mask, opts(name))
    assert loss.item() == 0.0 and loss.requires_grad
    loss.backward()
    assert torch.all(lp.grad == 0)
    assert all(math.isfinite(v) for v in stats.values())
    for key in objective_inputs.RATIO_METRICS:
        assert stats[key] == 1.0, key
    assert stats[M.POLICY_CLIP_FRAC] == 0.0


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
