"""The sampling distribution: temperature, then top-k, then top-p, as vLLM applies them."""

from __future__ import annotations

import math

import pytest
import torch

from learner.algorithms.sampling_dist import (
    PLAIN,
    SamplingSettings,
    processed_logits,
    processed_logprobs,
)

PROBS = torch.tensor([0.4, 0.3, 0.2, 0.1])


def sampled(probs: torch.Tensor, **settings: float) -> torch.Tensor:
    return processed_logprobs(probs.log(), SamplingSettings(**settings)).exp()


def test_plain_settings_are_the_model_softmax_bitwise() -> None:
    logits = torch.randn(3, 7, generator=torch.Generator().manual_seed(0))
    assert torch.equal(processed_logprobs(logits, PLAIN), logits.float().log_softmax(-1))


def test_temperature_divides_logits() -> None:
    # logits [0, ln 2] at T = 0.5 -> [0, 2 ln 2] -> probs [1, 4] / 5.
    got = processed_logprobs(torch.tensor([0.0, math.log(2.0)]), SamplingSettings(0.5)).exp()
    torch.testing.assert_close(got, torch.tensor([0.2, 0.8]), rtol=1e-6, atol=1e-7)


def test_top_p_keeps_the_smallest_head_over_p() -> None:
    # Ascending [0.1, 0.2, 0.3, 0.4], cumsum [0.1, 0.3, 0.6, 1.0]; p = 0.65 drops cumsum <= 0.35,
    # i.e. 0.1 and 0.2; keep {0.4, 0.3} -> 4/7, 3/7.
    got = sampled(PROBS, top_p=0.65)
    torch.testing.assert_close(got, torch.tensor([4 / 7, 3 / 7, 0, 0]), rtol=1e-6, atol=1e-7)


def test_top_p_always_keeps_the_most_likely_token() -> None:
    # p = 0.05 < 0.4: every cumsum but the last is <= 0.95, so only the argmax stays.
    torch.testing.assert_close(sampled(PROBS, top_p=0.05), torch.tensor([1.0, 0, 0, 0]))


def test_top_k_keeps_k_tokens_and_ties_at_the_kth() -> None:
    # k = 2: {0.4, 0.3} -> 4/7, 3/7.
    got = sampled(PROBS, top_k=2)
    torch.testing.assert_close(got, torch.tensor([4 / 7, 3 / 7, 0, 0]), rtol=1e-6, atol=1e-7)
    # Ties with the k-th value are all kept (vLLM masks logits < the k-th): k = 2 of
    # [0.4, 0.2, 0.2, 0.2] keeps everything.
    tied = torch.tensor([0.4, 0.2, 0.2, 0.2])
    torch.testing.assert_close(sampled(tied, top_k=2), tied, rtol=1e-6, atol=1e-7)
    # k >= vocabulary size is no restriction.
    torch.testing.assert_close(sampled(PROBS, top_k=9), PROBS, rtol=1e-6, atol=1e-7)


def test_top_k_comes_before_top_p() -> None:
    # k = 2 first: [4/7, 3/7]; ascending cumsum [3/7 = 0.43, 1]; p = 0.5 drops <= 0.5 -> only 0.4.
    # (Top-p first would keep {0.4, 0.3}: cumsum [0.1, 0.3, 0.6, 1] drops only <= 0.5.)
    torch.testing.assert_close(sampled(PROBS, top_k=2, top_p=0.5), torch.tensor([1.0, 0, 0, 0]))


def test_temperature_comes_before_the_nucleus() -> None:
    # T = 0.5 squares the odds: [16, 9, 4, 1] / 30. p = 0.8 drops cumsum <= 0.2:
    # ascending cumsum [1/30, 5/30, 14/30, 1] -> drop 1 and 4; keep [16, 9] / 25.
    got = sampled(PROBS, temperature=0.5, top_p=0.8)
    torch.testing.assert_close(got, torch.tensor([0.64, 0.36, 0, 0]), rtol=1e-6, atol=1e-7)


def test_gradient_flows_through_kept_tokens_only() -> None:
    logits = PROBS.log().clone().requires_grad_(True)
    out = processed_logits(logits, SamplingSettings(top_p=0.65))  # keeps tokens 0 and 1
    out.log_softmax(-1)[0].backward()
    assert torch.isfinite(logits.grad).all()
    # d log q_0 / d logit_j = 1[j=0] - q_j over the kept set {0: 4/7, 1: 3/7}; 0 for dropped.
    torch.testing.assert_close(logits.grad, torch.tensor([3 / 7, -3 / 7, 0, 0]), rtol=1e-6, atol=0)


@pytest.mark.parametrize(
    "bad",
    [
        {"temperature": 0.0},
        {"temperature": 0.005},  # vLLM would silently raise it to 0.01
        {"temperature": 2.5},  # vLLM rejects it
        {"top_p": 0.0},
        {"top_p": 1.5},
        {"top_k": -1},
    ],
)
def test_settings_the_engines_cannot_apply_are_refused(bad: dict[str, float]) -> None:
    field = next(iter(bad))
    with pytest.raises(ValueError, match=field):
        SamplingSettings(**bad)


@pytest.mark.slow
@pytest.mark.parametrize(("top_k", "top_p"), [(0, 0.9), (0, 0.5), (5, 1.0), (5, 0.9), (40, 0.3)])
def test_same_kept_sets_as_vllm(top_k: int, top_p: float) -> None:
    """Kept sets equal vLLM's own masking (the CPU path, `apply_top_k_top_p_pytorch` /
    `apply_top_k_only`) on random peaked float32 logits at T = 0.7. Slow: importing vLLM."""
    pytest.importorskip("vllm")
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p

    logits = 3.0 * torch.randn(256, 64, generator=torch.Generator().manual_seed(1))
    settings = SamplingSettings(0.7, top_p, top_k)
    scaled = logits / torch.full((256, 1), 0.7)  # vLLM divides by a (B, 1) temperature tensor
    k = torch.full((256,), top_k, dtype=torch.int32) if top_k else None
    p = torch.full((256,), top_p, dtype=torch.float32) if top_p < 1 else None
    theirs = apply_top_k_top_p(scaled.clone(), k, p)
    ours = processed_logits(logits, settings)
    assert torch.equal(torch.isinf(ours), torch.isinf(theirs))
    assert 0 < int(torch.isinf(ours).sum()) < ours.numel()  # the settings do cut something
    torch.testing.assert_close(ours.log_softmax(-1), theirs.log_softmax(-1), rtol=0, atol=1e-6)
