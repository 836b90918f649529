"""Token logprobs are aligned with input_ids: position p scores token p from logits at p - 1."""

from __future__ import annotations

import math

import torch

from buffer.collate import collate
from learner.algorithms.sampling_dist import LOGPROB_FLOOR, SamplingSettings
from learner.runtime.forward import policy_logprobs, scoring, token_logprobs_from_logits
from tests.learner.tiny import random_groups, tiny_policy


def test_alignment_matches_a_per_position_loop() -> None:
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 7)
    ids = torch.randint(0, 7, (2, 5))
    logprobs, entropy = token_logprobs_from_logits(logits, ids)
    assert torch.equal(logprobs[:, 0], torch.zeros(2))
    for b in range(2):
        for p in range(1, 5):
            expected = torch.log_softmax(logits[b, p - 1], -1)[ids[b, p]]
            torch.testing.assert_close(logprobs[b, p], expected, rtol=1e-6, atol=1e-6)
            dist = torch.softmax(logits[b, p - 1], -1)
            torch.testing.assert_close(
                entropy[b, p], -(dist * dist.log()).sum(), rtol=1e-5, atol=1e-6
            )


def test_policy_logprobs_of_a_response_ignore_right_padding() -> None:
    """A row's response logprobs are the same alone and batched with longer rows."""
    model = tiny_policy().eval()
    groups = random_groups(2, 3)
    batch = collate(groups, pad_id=0)
    with torch.no_grad():
        full, _ = policy_logprobs(model, batch.input_ids, batch.attention_mask)
        for row in range(batch.batch_size):
            length = int(batch.attention_mask[row].sum())
            alone, _ = policy_logprobs(
                model,
                batch.input_ids[row : row + 1, :length],
                batch.attention_mask[row : row + 1, :length],
            )
            mask = batch.response_mask[row, :length].bool()
            torch.testing.assert_close(
                full[row, :length][mask], alone[0][mask], rtol=1e-5, atol=1e-5
            )


def test_logprobs_and_entropy_are_of_the_sampling_distribution() -> None:
    # Position 1 is predicted from logits log [0.5, 0.3, 0.15, 0.05]; top_p 0.7 keeps {0.5, 0.3}
    # (ascending cumsum [0.05, 0.2, 0.5, 1] drops <= 0.3), renormalised [0.625, 0.375].
    logits = torch.tensor([0.5, 0.3, 0.15, 0.05]).log().expand(1, 2, 4)
    sampling = SamplingSettings(top_p=0.7)
    logprobs, entropy = token_logprobs_from_logits(logits, torch.tensor([[0, 1]]), sampling)
    torch.testing.assert_close(logprobs[0, 1], torch.tensor(math.log(0.375)))
    # H = -(0.625 ln 0.625 + 0.375 ln 0.375) = 0.661563; the dropped tokens add 0, not NaN.
    torch.testing.assert_close(entropy[0, 1], torch.tensor(0.661563), rtol=1e-5, atol=0)


def test_a_token_outside_the_nucleus_is_floored_without_nan_gradients() -> None:
    """Token 3 (p = 0.05) is outside the top-p 0.7 nucleus: log-prob -inf under the sampling
    distribution. It is floored at LOGPROB_FLOOR and passes no gradient; a kept token next to it
    still gets its exact gradient, and nothing is NaN."""
    logits = torch.tensor([0.5, 0.3, 0.15, 0.05]).log().repeat(1, 3, 1).requires_grad_(True)
    ids = torch.tensor([[0, 3, 1]])  # position 1 scores token 3 (dropped), 2 scores token 1
    logprobs, entropy = token_logprobs_from_logits(logits, ids, SamplingSettings(top_p=0.7))
    assert logprobs[0, 1].item() == LOGPROB_FLOOR
    assert torch.isfinite(logprobs).all() and torch.isfinite(entropy).all()
    # A ratio against a behaviour log-prob and against another floored log-prob stay finite.
    assert math.isfinite(math.exp(logprobs[0, 1].item() - math.log(0.05)))
    assert logprobs[0, 1].item() - LOGPROB_FLOOR == 0.0
    logprobs.sum().backward()
    assert torch.isfinite(logits.grad).all()
    assert torch.equal(logits.grad[0, 0], torch.zeros(4))  # the floored token: no gradient
    # d log q_1 / d logit_j = 1[j=1] - q_j over the kept set {0: 0.625, 1: 0.375}.
    expected = torch.tensor([-0.625, 0.625, 0.0, 0.0])
    torch.testing.assert_close(logits.grad[0, 1], expected, rtol=1e-6, atol=1e-7)


def test_scoring_is_eval_and_no_grad_and_restores_each_mode() -> None:
    model = tiny_policy().train()
    frozen = model.model.norm.eval()  # a part deliberately in eval mode keeps it
    seen = []
    model.register_forward_hook(lambda m, *_: seen.append((m.training, torch.is_grad_enabled())))
    ids = torch.tensor([[3, 4, 5]])
    with scoring(model, None):
        policy_logprobs(model, ids, torch.ones_like(ids))
    policy_logprobs(model, ids, torch.ones_like(ids))
    assert seen == [(False, False), (True, True)]
    assert model.training and not frozen.training
