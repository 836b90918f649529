"""CISPO, SAPO and GMPO: hand-worked values and gradients, and the identities their papers state.

Batch layout (prompt junk, response, padding junk): `tests/learner/objective_inputs.py`. Each case
sets pi_old = pi_theta - l, so the log-ratios l are exact inputs.
"""

from __future__ import annotations

import math

import pytest
import torch

from contract import metrics as M
from learner.algorithms.objectives import cispo_loss, gmpo_loss, grpo_loss, gspo_loss, sapo_loss
from learner.algorithms.objectives.sapo import gate_weight
from tests.learner.objective_inputs import identical_batch, layout, leaf, opts, response, run

LN = math.log


def assert_rows(got: list[list[float]], want: list[list[float]]) -> None:
    for got_row, want_row in zip(got, want, strict=True):
        assert got_row == pytest.approx(want_row, rel=1e-5, abs=1e-7)


def cispo_case(**overrides):
    """Rows of 2 and 1 tokens, A = (2, -1); ratios 1.5, 1.1 | 0.5."""
    lp, mask = layout([[-1.0, -2.0], [-0.5]])
    l_rows, _ = layout([[LN(1.5), LN(1.1)], [LN(0.5)]], junk=0.0)
    logprobs = leaf(lp)
    return logprobs, lp - l_rows, torch.tensor([2.0, -1.0]), mask, opts("cispo", **overrides)


def test_cispo_hand_worked_truncated_high_and_untruncated() -> None:
    logprobs, old, adv, mask, options = cispo_case()  # eps_low 1 (no lower bound), eps_high 0.2
    loss, stats = run(cispo_loss, logprobs, old, adv, mask, options)
    loss.backward()
    # w = clip(r, 0, 1.2) = 1.2 (truncated), 1.1 | 0.5; N = 3 tokens (token-mean):
    # loss = -(1/3) [1.2*2*(-1) + 1.1*2*(-2) + 0.5*(-1)*(-0.5)] = -(-2.4 - 4.4 + 0.25) / 3
    assert loss.item() == pytest.approx(6.55 / 3, rel=1e-6)
    # dL/dlogpi = -w A / 3: -2.4/3, -2.2/3 | +0.5/3, whatever the truncation (never zeroed).
    assert_rows(response(logprobs.grad, mask), [[-0.8, -2.2 / 3], [0.5 / 3]])
    assert torch.all(logprobs.grad[~mask] == 0)
    # One of 3 tokens truncated, on the high side; 1 of 2 sequences has one.
    assert (
        stats[M.POLICY_CLIP_FRAC] == pytest.approx(1 / 3)
        and stats[M.POLICY_CLIP_FRAC_HIGH] == stats[M.POLICY_CLIP_FRAC]
    )
    assert stats[M.POLICY_CLIP_FRAC_LOW] == 0.0 and stats[M.POLICY_CLIP_FRAC_SEQ] == 0.5


def test_cispo_lower_bound_and_is_weights() -> None:
    logprobs, old, adv, mask, options = cispo_case(eps_low=0.2)
    is_weights, _ = layout([[0.5, 1.0], [2.0]], junk=float("nan"))
    loss, stats = run(cispo_loss, logprobs, old, adv, mask, options, is_weights=is_weights)
    loss.backward()
    # w = 1.2, 1.1 | 0.8 (0.5 raised to 1 - 0.2), times IS weights 0.5, 1 | 2:
    # loss = -(1/3) [0.5*1.2*2*(-1) + 1.1*2*(-2) + 2*0.8*(-1)*(-0.5)] = -(-1.2 - 4.4 + 0.8) / 3
    assert loss.item() == pytest.approx(4.8 / 3, rel=1e-6)
    # dL/dlogpi = -is w A / 3: -1.2/3, -2.2/3 | +1.6/3
    assert_rows(response(logprobs.grad, mask), [[-0.4, -2.2 / 3], [1.6 / 3]])
    assert stats[M.POLICY_CLIP_FRAC_LOW] == pytest.approx(1 / 3)
    assert stats[M.POLICY_CLIP_FRAC_HIGH] == pytest.approx(1 / 3)


def test_cispo_gradient_is_reinforce_at_ratio_one() -> None:
    """r = 1 and nothing truncated: grad = -A grad log pi / N (REINFORCE, token-mean), which is
    also DAPO's (GRPO token-mean) gradient there, with and without IS weights."""
    lp, mask, adv = identical_batch()
    weights = torch.rand(lp.shape, generator=torch.Generator().manual_seed(3)) + 0.5
    for is_weights in (None, weights):
        a, b = leaf(lp), leaf(lp)
        run(cispo_loss, a, lp, adv, mask, opts("cispo"), is_weights=is_weights)[0].backward()
        grpo = opts("grpo", agg="token-mean")
        run(grpo_loss, b, lp, adv, mask, grpo, is_weights=is_weights)[0].backward()
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-6, atol=0)
    a = leaf(lp)
    run(cispo_loss, a, lp, adv, mask, opts("cispo"))[0].backward()
    reinforce = torch.where(mask, -adv[:, None] / mask.sum(), 0.0)  # -A_i / 8 per token
    torch.testing.assert_close(a.grad, reinforce, rtol=1e-6, atol=0)


def sapo_case():
    """Rows of 2 and 1 tokens, A = (1, -1), tau_pos 1, tau_neg 2; ratios 1, 2 | 0.5."""
    lp, mask = layout([[-1.0, -2.0], [-0.5]])
    l_rows, _ = layout([[0.0, LN(2.0)], [LN(0.5)]], junk=0.0)
    options = opts("sapo", tau_pos=1.0, tau_neg=2.0)
    return leaf(lp), lp - l_rows, torch.tensor([1.0, -1.0]), mask, options


def test_sapo_hand_worked_both_signs() -> None:
    logprobs, old, adv, mask, options = sapo_case()
    loss, stats = run(sapo_loss, logprobs, old, adv, mask, options)
    loss.backward()
    s1 = 1 / (1 + math.exp(-1.0))  # sigma(1) = 0.7310586
    # f = (4/tau) sigma(tau (r - 1)): row 0 (tau 1): 4 sigma(0) = 2, 4 sigma(1) = 2.9242344;
    # row 1 (tau 2): 2 sigma(-1) = 2 (1 - sigma(1)) = 0.5378828.
    # loss = mean_i (1/|y_i|) sum_t -f A = ((-2 - 2.9242344) / 2 + 0.5378828) / 2 = -0.9621172
    assert loss.item() == pytest.approx(((-2 - 4 * s1) / 2 + 2 * (1 - s1)) / 2, rel=1e-6)
    # dL/dlogpi = -A 4 p (1 - p) r / (|y_i| 2): the weight 4 p (1 - p) is 1 at r = 1 and
    # 4 sigma(1) (1 - sigma(1)) = 0.7864477 at both other tokens (tau (r - 1) = 1 and -1).
    w = 4 * s1 * (1 - s1)
    assert_rows(response(logprobs.grad, mask), [[-1 / 4, -w * 2 / 4], [w * 0.5 / 2]])
    assert stats[M.POLICY_CLIP_FRAC] == 0.0  # both weights >= 1/2: nothing gated


@pytest.mark.parametrize(
    ("log_ratio", "tau", "side"),
    [
        # tau (r - 1) = 3: weight sech^2(1.5) = 0.1807 < 1/2: gated, high side.
        (LN(4.0), 1.0, M.POLICY_CLIP_FRAC_HIGH),
        # tau (r - 1) = 2 (0.1 - 1) = -1.8: weight sech^2(0.9) = 0.4869 < 1/2: gated, low side.
        (LN(0.1), 2.0, M.POLICY_CLIP_FRAC_LOW),
    ],
)
def test_sapo_gated_tokens(log_ratio: float, tau: float, side: str) -> None:
    lp, mask = layout([[-1.0, -1.0]])
    l_rows, _ = layout([[log_ratio, 0.0]], junk=0.0)
    adv = torch.tensor([1.0 if tau == 1.0 else -1.0])
    options = opts("sapo", tau_pos=tau, tau_neg=tau)
    _, stats = run(sapo_loss, lp, lp - l_rows, adv, mask, options)
    assert stats[M.POLICY_CLIP_FRAC] == stats[side] == 0.5 and stats[M.POLICY_CLIP_FRAC_SEQ] == 1.0


@pytest.mark.parametrize("tau", [0.5, 1.0, 1.05, 3.0])
def test_sapo_at_ratio_one_has_grpos_gradient_for_any_tau(tau: float) -> None:
    """The gate's slope is 4 sigma(0) (1 - sigma(0)) = 1 at r = 1 for every tau (SAPO sec. 3):
    the gradient is GRPO's (seq-mean-token-mean) and the value 2 / tau times GRPO's."""
    lp, mask, adv = identical_batch()
    a, b = leaf(lp), leaf(lp)
    sapo, _ = run(sapo_loss, a, lp, adv, mask, opts("sapo", tau_pos=tau, tau_neg=tau))
    grpo, _ = run(grpo_loss, b, lp, adv, mask, opts("grpo"))
    (sapo + grpo).backward()
    torch.testing.assert_close(a.grad, b.grad, rtol=1e-6, atol=0)
    assert sapo.item() == pytest.approx(2 / tau * grpo.item(), rel=1e-6)


def test_sapo_gate_weight_is_the_gates_slope() -> None:
    ratio = torch.linspace(0.05, 4.0, 200, dtype=torch.float64).requires_grad_()
    tau = torch.tensor(1.7, dtype=torch.float64)
    (torch.sigmoid(tau * (ratio - 1)) * 4 / tau).sum().backward()
    torch.testing.assert_close(ratio.grad, gate_weight(ratio.detach(), tau), rtol=1e-12, atol=0)
    assert gate_weight(torch.tensor(1.0), torch.tensor(9.0)).item() == 1.0


def test_gmpo_hand_worked_clipped_per_token_in_log_space() -> None:
    lp, mask = layout([[-1.0, -2.0, -0.5], [-0.3, -1.2]])
    l_rows, _ = layout([[0.2, 0.6, -0.5], [-0.6, 0.3]], junk=0.0)
    logprobs = leaf(lp)
    adv = torch.tensor([1.0, -2.0])
    loss, stats = run(gmpo_loss, logprobs, lp - l_rows, adv, mask, opts("gmpo"))  # eps 0.4, 0.4
    loss.backward()
    # A > 0 clips l above 0.4: (0.2, 0.4, -0.5), mean 0.1 / 3, s0 = e^(1/30) = 1.0338951.
    # A < 0 clips l below -0.4: (-0.4, 0.3), mean -0.05, s1 = e^-0.05 = 0.9512294.
    s0, s1 = math.exp(0.1 / 3), math.exp(-0.05)
    # loss = mean_i -A_i s_i = (-1.0338951 + 2 * 0.9512294) / 2 = 0.4342819
    assert loss.item() == pytest.approx((-s0 + 2 * s1) / 2, rel=1e-6)
    # dL/dlogpi = -A_i s_i / (|y_i| 2) on unclipped tokens, 0 on clipped ones.
    assert_rows(response(logprobs.grad, mask), [[-s0 / 6, 0.0, -s0 / 6], [0.0, s1 / 2]])
    # 2 of 5 tokens clipped, one each side; both sequences have one.
    assert stats[M.POLICY_CLIP_FRAC] == pytest.approx(0.4)
    assert stats[M.POLICY_CLIP_FRAC_HIGH] == pytest.approx(0.2) == stats[M.POLICY_CLIP_FRAC_LOW]
    assert stats[M.POLICY_CLIP_FRAC_SEQ] == 1.0
    assert stats[M.POLICY_RATIO_MAX] == pytest.approx(math.exp(0.6), rel=1e-6)  # token ratios


@pytest.mark.parametrize("with_weights", [False, True])
def test_gmpo_without_clipping_equals_gspo_without_clipping(with_weights: bool) -> None:
    """Both take A_i exp(mean_t l_t): with no token (GMPO) and no sequence (GSPO) clipped, value
    and gradient agree, IS weights included (both use the sequence's mean weight)."""
    lp, mask, adv = identical_batch()
    gen = torch.Generator().manual_seed(4)
    old = lp + 0.3 * torch.randn(lp.shape, generator=gen)
    weights = torch.rand(lp.shape, generator=gen) + 0.5 if with_weights else None
    a, b = leaf(lp), leaf(lp)
    wide = {"eps_low": 50.0, "eps_high": 50.0}
    gmpo, g_stats = run(gmpo_loss, a, old, adv, mask, opts("gmpo", **wide), is_weights=weights)
    gspo, _ = run(gspo_loss, b, old, adv, mask, opts("gspo", **wide), is_weights=weights)
    (gmpo + gspo).backward()
    assert gmpo.item() == pytest.approx(gspo.item(), rel=1e-6)
    torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-7)
    assert g_stats[M.POLICY_CLIP_FRAC] == 0.0


def test_gmpo_clipping_a_token_only_removes_that_tokens_gradient() -> None:
    """GMPO's clip is per token: a clipped token keeps the sequence's other tokens' gradients
    (GSPO would clip the whole sequence). Row 0's second token moves beyond e^0.4."""
    lp, mask = layout([[-1.0, -1.0, -1.0]])
    l_rows, _ = layout([[0.0, 1.0, 0.0]], junk=0.0)
    logprobs = leaf(lp)
    run(gmpo_loss, logprobs, lp - l_rows, torch.tensor([1.0]), mask, opts("gmpo"))[0].backward()
    s = math.exp(0.4 / 3)  # clipped log-ratios (0, 0.4, 0)
    assert_rows(response(logprobs.grad, mask), [[-s / 3, 0.0, -s / 3]])


def test_gmpo_needs_sequence_advantages() -> None:
    lp, mask, _ = identical_batch()
    with pytest.raises(ValueError, match=r"gmpo_loss needs advantages \[B\]"):
        run(gmpo_loss, lp, lp, torch.ones_like(lp), mask, opts("gmpo"))


def test_options_of_the_wrong_kind_are_refused() -> None:
    lp, mask, adv = identical_batch()
    with pytest.raises(TypeError, match="sapo_loss needs SAPOSettings"):
        run(sapo_loss, lp, lp, adv, mask, opts("grpo"))
