"""Chunked log-probs (`learner.logprob_chunk_tokens`) equal the full-logits ones, values and
gradients, under the sampling distribution (temperature, top-k, top-p): the output embedding
applied per chunk of hidden states is the model's own head, and checkpointed chunks backpropagate
exactly what the full logits would."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from learner.algorithms.sampling_dist import PLAIN, SamplingSettings, processed_logprobs
from learner.runtime.forward import policy_logprobs, scoring
from tests.tiny_models import DENSE_POLICY, MOE_POLICY, TinyArch, TokenIds, tiny_model

# 200 ids and a wide init: top-k 5 and top-p 0.9 drop most of the vocabulary, and differently
# per position, so a chunk that renormalised over the wrong set would show.
WIDE = TinyArch(initializer_range=0.2, tie_embeddings=False)
IDS = TokenIds(vocab_size=200, pad=0, eos=1, bos=2)
SAMPLED = SamplingSettings(temperature=0.7, top_p=0.9, top_k=5)
MODELS = {
    "wide": lambda: tiny_model(WIDE, IDS),
    "tied": lambda: tiny_model(DENSE_POLICY),
    "moe": lambda: tiny_model(MOE_POLICY),
}


Rows = tuple[torch.Tensor, torch.Tensor]


@torch.no_grad()
def batch(model: nn.Module, sampling: SamplingSettings) -> Rows:
    """(input_ids, attention_mask) [3, 12], right-padded: rows of 12, 7 and 4 real tokens, each
    a random 3-token prompt and tokens sampled from the model under `sampling` (so they are
    inside its top-k / top-p set and have gradients)."""
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(3, model.config.vocab_size, (3, 3), generator=gen)
    for _ in range(9):
        logits = model(input_ids=ids, use_cache=False).logits[:, -1]  # (B, V)
        probs = processed_logprobs(logits, sampling).exp()
        ids = torch.cat([ids, torch.multinomial(probs, 1, generator=gen)], dim=1)
    attn = torch.ones_like(ids)
    attn[1, 7:], attn[2, 4:] = 0, 0
    return ids.masked_fill(attn == 0, 0), attn


def scored(model: nn.Module, rows: Rows, sampling: SamplingSettings, chunk: int | None):
    """(logprobs, entropy, gradient of every parameter) of a weighted sum of real-token logprobs."""
    ids, attn = rows
    model.zero_grad(set_to_none=True)
    logprobs, entropy = policy_logprobs(model, ids, attn, sampling, chunk)
    real = attn.bool() & (torch.arange(12) > 0)  # (B, L) the scored positions
    weights = torch.linspace(-1.0, 2.0, real.numel()).reshape(real.shape)
    (torch.where(real, logprobs * weights, 0.0)).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    grads["head"] = model.get_output_embeddings().weight.grad.clone()  # tied or not
    return torch.where(real, logprobs, 0.0).detach(), torch.where(real, entropy, 0.0), grads


@pytest.mark.parametrize("kind", sorted(MODELS))
@pytest.mark.parametrize("sampling", [SAMPLED, PLAIN], ids=["T0.7-p0.9-k5", "plain"])
def test_chunked_logprobs_and_gradients_equal_the_full_logits_ones(kind, sampling) -> None:
    model = MODELS[kind]()
    rows = batch(model, SAMPLED)
    full_lp, full_entropy, full_grads = scored(model, rows, sampling, None)
    assert full_grads["head"].abs().max() > 1e-3
    # 20 positions are scored: chunks of 1, of 7 (the last one 6), and one chunk of all.
    for chunk in (1, 7, 64):
        lp, entropy, grads = scored(model, rows, sampling, chunk)
        torch.testing.assert_close(lp, full_lp, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(entropy, full_entropy, rtol=1e-5, atol=1e-6)
        assert grads.keys() == full_grads.keys()
        for name, grad in grads.items():
            # Float32 sums in another order (per chunk): 1e-6 of the tensor's scale (up to ~7).
            scale = max(1.0, float(full_grads[name].abs().max()))
            torch.testing.assert_close(grad, full_grads[name], rtol=1e-5, atol=1e-6 * scale)


def test_top_k_and_top_p_cut_the_vocabulary_in_this_comparison() -> None:
    """The sampled comparison above is not a plain softmax in disguise."""
    model = MODELS["wide"]()
    rows = batch(model, SAMPLED)
    sampled, _, _ = scored(model, rows, SAMPLED, 7)
    plain, _, _ = scored(model, rows, PLAIN, 7)
    assert (sampled - plain).abs().max() > 0.5


def test_padding_holds_zero_and_scoring_passes_match() -> None:
    model = MODELS["wide"]()
    ids, attn = batch(model, SAMPLED)
    with scoring(model):
        lp, entropy = policy_logprobs(model, ids, attn, SAMPLED, 5)
    graph_lp, _ = policy_logprobs(model, ids, attn, SAMPLED, 5)
    assert torch.all(lp[attn == 0] == 0) and torch.all(entropy[attn == 0] == 0)
    assert torch.all(lp[:, 0] == 0)
    assert torch.equal(lp, graph_lp.detach())


def test_a_model_that_post_processes_its_logits_is_refused() -> None:
    """Chunking applies the bare head: a logit scale (or soft-cap) would be lost, so the
    forward's one computed position is checked against it."""
    model = MODELS["wide"]()
    forward = model.forward

    def scaled(*args, **kwargs):
        out = forward(*args, **kwargs)
        out.logits = out.logits * 2.0
        return out

    ids, attn = batch(model, SAMPLED)
    model.forward = scaled
    with pytest.raises(ValueError, match="logprob_chunk_tokens"):
        policy_logprobs(model, ids, attn, SAMPLED, 4)
