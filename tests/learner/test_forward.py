"""Token logprobs are aligned with input_ids: position p scores token p from logits at p - 1."""

from __future__ import annotations

import torch

from buffer.collate import collate
from learner.forward import policy_logprobs, token_logprobs_from_logits
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
