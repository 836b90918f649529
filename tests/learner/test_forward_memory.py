"""The log-prob pass's memory savings change no number (`learner.runtime.forward`).

- The entropy is reduced `ENTROPY_ROWS` positions at a time: each row's value is bit for bit the
  one the whole tensor gives it (the formula it replaced, `whole_entropy` below), and the
  log-probs, entropies and gradients of a pass are identical with and without sub-chunks, under
  temperature, top-k and top-p, chunked or not.
- A chunk's compute-dtype logits are freed once its log-softmax exists, before the entropy's
  temporaries are made.
"""

from __future__ import annotations

import weakref

import pytest
import torch

from learner.algorithms.sampling_dist import PLAIN, SamplingSettings
from learner.runtime import forward
from learner.runtime.forward import ENTROPY_ROWS, policy_logprobs, scoring
from tests.learner.test_forward_chunked import IDS, MODELS, SAMPLED, WIDE, batch, scored
from tests.tiny_models import tiny_model

HOT = SamplingSettings(temperature=1.3)  # a temperature alone, no truncation
SETTINGS = {"T0.7-p0.9-k5": SAMPLED, "plain": PLAIN, "T1.3": HOT}
WHOLE = 10**9  # ENTROPY_ROWS that makes one sub-chunk of any pass: the formula it replaced


def whole_entropy(log_probs: torch.Tensor) -> torch.Tensor:
    """The entropy as `_entropy` computed it before sub-chunks: one reduction of everything."""
    kept = torch.isfinite(log_probs)
    return -torch.where(kept, log_probs.exp() * log_probs, 0.0).sum(-1)


def test_row_spans_never_leave_a_row_alone() -> None:
    assert ENTROPY_ROWS == 128
    assert forward._row_spans(0) == [(0, 0)]
    assert forward._row_spans(1) == [(0, 1)]
    assert forward._row_spans(256) == [(0, 128), (128, 256)]
    assert forward._row_spans(257) == [(0, 128), (128, 257)]  # not (256, 257)
    assert forward._row_spans(258) == [(0, 128), (128, 256), (256, 258)]


@pytest.mark.parametrize("rows", [2, 3, 5, 9])
def test_sub_chunked_entropy_is_the_whole_reductions_bit_for_bit(monkeypatch, rows) -> None:
    """40,000 entries a row: more than a CPU reduction's grain (32,768), so with two threads a
    one-row sum splits the row itself (and may round differently); spans never do that."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        gen = torch.Generator().manual_seed(rows)
        log_probs = (3 * torch.randn(rows, 40_000, generator=gen)).log_softmax(-1)
        log_probs[:, ::7] = float("-inf")  # tokens outside a top-k / top-p set
        for sub in (2, 3, 4):  # a last span of one row joins the one before
            monkeypatch.setattr(forward, "ENTROPY_ROWS", sub)
            got = forward._entropy(log_probs)
            assert torch.equal(got, whole_entropy(log_probs)), sub
        three_d = log_probs[: rows - rows % 2].reshape(2, -1, 40_000)  # (B, L, V)
        assert torch.equal(forward._entropy(three_d), whole_entropy(three_d))
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("setting", sorted(SETTINGS))
@pytest.mark.parametrize("chunk", [None, 7])
def test_log_probs_entropies_and_gradients_do_not_depend_on_sub_chunks(
    monkeypatch, setting, chunk
) -> None:
    sampling = SETTINGS[setting]
    model = MODELS["wide"]()
    rows = batch(model, SAMPLED)
    monkeypatch.setattr(forward, "ENTROPY_ROWS", WHOLE)
    lp, entropy, grads = scored(model, rows, sampling, chunk)
    assert entropy.abs().sum() > 0
    for sub in (2, 3):  # 20 scored positions (7 + 7 + 6 a chunk), 33 unchunked
        monkeypatch.setattr(forward, "ENTROPY_ROWS", sub)
        sub_lp, sub_entropy, sub_grads = scored(model, rows, sampling, chunk)
        assert torch.equal(sub_lp, lp) and torch.equal(sub_entropy, entropy)
        assert sub_grads.keys() == grads.keys()
        assert all(torch.equal(sub_grads[name], grad) for name, grad in grads.items())


@pytest.mark.parametrize("graph", [False, True], ids=["scoring", "gradient"])
def test_a_chunks_logits_are_freed_before_its_entropy(monkeypatch, graph) -> None:
    """bf16 model: each chunk's head output (n, V) is gone when `_entropy` starts."""
    model = tiny_model(WIDE, IDS).to(torch.bfloat16)
    ids, attn = batch(model, PLAIN)
    made: list[weakref.ref] = []
    hook = model.get_output_embeddings().register_forward_hook(
        lambda _m, _a, out: made.append(weakref.ref(out))
    )
    entropy, alive = forward._entropy, []

    def checked(log_probs: torch.Tensor) -> torch.Tensor:
        alive.append(made[-1]() is not None)
        return entropy(log_probs)

    monkeypatch.setattr(forward, "_entropy", checked)
    try:
        if graph:
            lp, _ = policy_logprobs(model, ids, attn, SAMPLED, 7)
            lp.sum().backward()
        else:
            with scoring(model):
                policy_logprobs(model, ids, attn, SAMPLED, 7)
    finally:
        hook.remove()
    assert alive == [False, False, False]  # 20 scored positions: chunks of 7, 7 and 6
