"""Clip-Cov and KL-Cov (Cui et al. 2025): covariance, selection, hand-worked values and gradients.

One batch serves both: rows of 3 and 2 tokens (uneven), A = (2, -1), current log-probs
(-0.2, -3.0, -1.5 | -0.4, -2.6). Over the N = 5 tokens: mean A = (3*2 - 2*1) / 5 = 0.8 and
mean log pi = -7.7 / 5 = -1.54, so

    Cov_t = (log pi_t + 1.54) (A_t - 0.8) = (1.34, -1.46, 0.04) * 1.2 | (1.14, -1.06) * -1.8
          = (1.608, -1.752, 0.048) | (-2.052, 1.908)
"""

from __future__ import annotations

import math

import pytest
import torch

from contract import metrics as M
from learner.algorithms.objectives import clip_cov_loss, grpo_loss, kl_cov_loss
from learner.algorithms.objectives.covariance import (
    choose_tokens,
    selection_count,
    token_covariance,
    top_tokens,
)
from tests.learner.objective_inputs import identical_batch, layout, leaf, opts, response, run

LN = math.log
COV = [[1.608, -1.752, 0.048], [-2.052, 1.908]]


def case(log_ratios: list[list[float]]):
    """(logprobs leaf, old logprobs, A [B], mask): pi_old = pi_theta - l."""
    lp, mask = layout([[-0.2, -3.0, -1.5], [-0.4, -2.6]])
    l_rows, _ = layout(log_ratios, junk=0.0)
    return leaf(lp), lp - l_rows, torch.tensor([2.0, -1.0]), mask


def assert_rows(got: list[list[float]], want: list[list[float]]) -> None:
    for got_row, want_row in zip(got, want, strict=True):
        assert got_row == pytest.approx(want_row, rel=1e-5, abs=1e-7)


def test_token_covariance_by_hand_and_minus_inf_off_the_mask() -> None:
    logprobs, _, adv, mask = case([[0, 0, 0], [0, 0]])
    token_adv = torch.where(mask, adv[:, None], 0.0)
    cov = token_covariance(logprobs, token_adv, mask)
    assert_rows(response(cov, mask), COV)
    assert torch.all(cov[~mask] == -math.inf)


def test_selection_count_follows_the_authors_rule() -> None:
    # floor(fraction N), at least 1 when fraction > 0; none without tokens or with fraction 0.
    assert [selection_count(2e-4, n) for n in (1, 4999, 10000, 15000)] == [1, 1, 2, 3]
    assert selection_count(0.0, 100) == 0 and selection_count(0.5, 0) == 0


def test_choose_tokens_is_deterministic_and_leaves_global_rng_alone() -> None:
    gen = torch.Generator().manual_seed(7)
    candidates = torch.rand(6, 50, generator=gen) < 0.4
    scores = torch.randn(6, 50, generator=gen)
    state = torch.get_rng_state()
    mask = torch.ones_like(candidates)
    first = choose_tokens(candidates, 5, scores, mask)
    assert torch.equal(first, choose_tokens(candidates.clone(), 5, scores.clone(), mask))
    assert torch.equal(torch.get_rng_state(), state)
    assert int(first.sum()) == 5 and not torch.any(first & ~candidates)
    # At most `count` candidates: all of them, no draw.
    assert torch.equal(choose_tokens(candidates, 10_000, scores, mask), candidates)
    # Other keys, another draw (the seed reads the candidates' input values).
    assert not torch.equal(first, choose_tokens(candidates, 5, scores + 1.0, mask))


def test_clip_cov_draw_ignores_padding() -> None:
    """The same rows at two layouts (prompt slots, padding) cut the same tokens, with many
    candidates (bounds wide open) and several draws."""
    gen = torch.Generator().manual_seed(5)
    rows = [(-3 * torch.rand(n, generator=gen)).tolist() for n in (7, 2, 9, 4)]
    adv = torch.tensor([1.0, -0.5, 0.3, -1.2])
    options = opts("clip_cov", clip_fraction=0.25, cov_low=-100.0, cov_high=100.0)
    cut = []
    for prompt, width in ((2, 12), (5, 20)):
        lp, mask = layout(rows, prompt=prompt, width=width)
        logprobs = leaf(lp)
        run(clip_cov_loss, logprobs, lp, adv, mask, options)[0].backward()
        cut.append([[g == 0.0 for g in row] for row in response(logprobs.grad, mask)])
    assert cut[0] == cut[1]
    assert sum(map(sum, cut[0])) == 5  # floor(0.25 * 22) = 5 of 22 candidates


def test_top_tokens_breaks_ties_by_position() -> None:
    scores = torch.tensor([[1.0, 3.0, 3.0], [3.0, -math.inf, 0.0]])
    assert top_tokens(scores, 2).tolist() == [[False, True, True], [False, False, False]]
    assert top_tokens(scores, 0).sum() == 0


def test_clip_cov_hand_worked() -> None:
    # Row 1's first token has r = 0.5; the rest r = 1. Bounds (1, 5) admit Cov 1.608 (row 0,
    # token 0) and 1.908 (row 1, token 1); r = 0.4 selects floor(0.4 * 5) = 2: both.
    logprobs, old, adv, mask = case([[0, 0, 0], [LN(0.5), 0]])
    options = opts("clip_cov", clip_fraction=0.4)  # eps 1, 1: no PPO clip engages here
    loss, stats = run(clip_cov_loss, logprobs, old, adv, mask, options)
    loss.backward()
    # Terms -A r: (0 selected, -2, -2) | (-(-1) 0.5 = 0.5, 0 selected); token mean over 5:
    assert loss.item() == pytest.approx(-3.5 / 5, rel=1e-6)
    # dL/dlogpi = -A r / 5 on kept tokens: -0.4, -0.4 | 0.1; 0 on selected ones.
    assert_rows(response(logprobs.grad, mask), [[0.0, -0.4, -0.4], [0.1, 0.0]])
    # Selected tokens are cut at any ratio, so clip_frac counts the PPO clip only: none here.
    assert stats[M.POLICY_CLIP_FRAC] == 0.0 and stats[M.POLICY_RATIO_MIN] == pytest.approx(0.5)


def test_clip_cov_ppo_clipped_tokens_are_not_candidates() -> None:
    # Row 0 token 0 (Cov 1.608) moves to r = 3 > 1 + 1 with A > 0: PPO clips it (gradient 0),
    # so only row 1 token 1 is a candidate; r = 0.4 asks for 2 tokens and gets that one.
    logprobs, old, adv, mask = case([[LN(3.0), 0, 0], [0, 0]])
    loss, stats = run(clip_cov_loss, logprobs, old, adv, mask, opts("clip_cov", clip_fraction=0.4))
    loss.backward()
    # Terms: -2 * clip(3, 0, 2) = -4, -2, -2 | 1, 0 (selected): (-8 + 1) / 5
    assert loss.item() == pytest.approx(-7 / 5, rel=1e-6)
    assert_rows(response(logprobs.grad, mask), [[0.0, -0.4, -0.4], [0.2, 0.0]])
    assert stats[M.POLICY_CLIP_FRAC] == pytest.approx(0.2) == stats[M.POLICY_CLIP_FRAC_HIGH]


def test_clip_cov_draws_one_of_the_candidates_reproducibly() -> None:
    # r = 0.2: floor(1.0) = 1 of the two candidates; the same tensors pick the same one.
    grads = []
    for _ in range(2):
        logprobs, old, adv, mask = case([[0, 0, 0], [0, 0]])
        options = opts("clip_cov", clip_fraction=0.2)
        run(clip_cov_loss, logprobs, old, adv, mask, options)[0].backward()
        grads.append(logprobs.grad)
    assert torch.equal(grads[0], grads[1])
    cut = (grads[0] == 0) & mask
    assert int(cut.sum()) == 1 and bool(cut[0, 2] or cut[1, 3])  # 2 prompt slots first


@pytest.mark.parametrize("overrides", [{"clip_fraction": 0.0}, {"cov_low": 10.0, "cov_high": 20}])
def test_clip_cov_without_selected_tokens_is_the_token_mean_surrogate(overrides: dict) -> None:
    lp, mask, adv = identical_batch()
    old = lp + 0.3 * torch.randn(lp.shape, generator=torch.Generator().manual_seed(2))
    weights = torch.rand(lp.shape, generator=torch.Generator().manual_seed(3)) + 0.5
    a, b = leaf(lp), leaf(lp)
    cc_opts = opts("clip_cov", eps_low=0.2, eps_high=0.28, **overrides)
    cc, cc_stats = run(clip_cov_loss, a, old, adv, mask, cc_opts, is_weights=weights)
    grpo_opts = opts("grpo", eps_low=0.2, eps_high=0.28, agg="token-mean")
    grpo, grpo_stats = run(grpo_loss, b, old, adv, mask, grpo_opts, is_weights=weights)
    (cc + grpo).backward()
    assert cc.item() == pytest.approx(grpo.item(), rel=1e-6)
    torch.testing.assert_close(a.grad, b.grad, rtol=1e-6, atol=0)
    assert cc_stats == pytest.approx(grpo_stats, rel=1e-6)


def test_kl_cov_hand_worked() -> None:
    # Ratios 1, 1, 1 | 0.5, 2. k = 0.2: floor(0.2 * 5) = 1 token, the top Cov: 1.908 (row 1,
    # token 1), which takes beta |log 2| with beta = 1.
    logprobs, old, adv, mask = case([[0, 0, 0], [LN(0.5), LN(2.0)]])
    loss, stats = run(kl_cov_loss, logprobs, old, adv, mask, opts("kl_cov", kl_fraction=0.2))
    loss.backward()
    # Terms -A r (+ penalty): -2, -2, -2 | 0.5, 2 + ln 2; token mean over 5:
    assert loss.item() == pytest.approx((-6 + 0.5 + 2 + LN(2.0)) / 5, rel=1e-6)
    # dL/dlogpi = (-A r + beta sign(l) on the selected token) / 5: -0.4 x 3 | 0.1, (2 + 1) / 5
    assert_rows(response(logprobs.grad, mask), [[-0.4, -0.4, -0.4], [0.1, 0.6]])
    # KL-Cov clips nothing: the penalised share is set by k (and kl_old shows the move).
    assert stats[M.POLICY_CLIP_FRAC] == stats[M.POLICY_CLIP_FRAC_SEQ] == 0.0
    assert stats[M.POLICY_KL_OLD] == pytest.approx(
        (0.5 - 1 - LN(0.5) + 2 - 1 - LN(2.0)) / 5, rel=1e-6
    )


def test_kl_cov_penalty_pulls_a_lowered_token_back_up() -> None:
    # Same selection with the selected token at r = 0.5: penalty ln 2, gradient -beta / 5.
    logprobs, old, adv, mask = case([[0, 0, 0], [0, LN(0.5)]])
    loss, _ = run(kl_cov_loss, logprobs, old, adv, mask, opts("kl_cov", kl_fraction=0.2))
    loss.backward()
    # Terms: -2 x 3 | 1, 0.5 + ln 2; gradient of the selected token (0.5 - 1) / 5 = -0.1
    assert loss.item() == pytest.approx((-6 + 1 + 0.5 + LN(2.0)) / 5, rel=1e-6)
    assert_rows(response(logprobs.grad, mask), [[-0.4, -0.4, -0.4], [0.2, -0.1]])


@pytest.mark.parametrize("overrides", [{"kl_fraction": 0.0}, {"kl_coef": 0.0}])
def test_kl_cov_without_penalty_is_the_plain_surrogate(overrides: dict) -> None:
    lp, mask, adv = identical_batch()
    old = lp + 0.3 * torch.randn(lp.shape, generator=torch.Generator().manual_seed(2))
    a, b = leaf(lp), leaf(lp)
    kl, kl_stats = run(kl_cov_loss, a, old, adv, mask, opts("kl_cov", **overrides))
    # GRPO's token-mean surrogate with a clip range that never engages: -A r.
    wide = opts("grpo", eps_low=50.0, eps_high=50.0, agg="token-mean")
    grpo, grpo_stats = run(grpo_loss, b, old, adv, mask, wide)
    (kl + grpo).backward()
    assert kl.item() == pytest.approx(grpo.item(), rel=1e-6)
    torch.testing.assert_close(a.grad, b.grad, rtol=1e-6, atol=0)
    assert kl_stats == pytest.approx(grpo_stats, rel=1e-6)


def test_options_of_the_wrong_kind_are_refused() -> None:
    lp, mask, adv = identical_batch()
    with pytest.raises(TypeError, match="clip_cov_loss needs ClipCovSettings"):
        run(clip_cov_loss, lp, lp, adv, mask, opts("grpo"))
    with pytest.raises(TypeError, match="kl_cov_loss needs KLCovSettings"):
        run(kl_cov_loss, lp, lp, adv, mask, opts("grpo"))
