"""`sampling_dist._dropped` decides the same nucleus as vLLM's sort-and-scatter, bit for bit.

The learner must score tokens under exactly the distribution the generator sampled from, and
fixed mode promises bitwise-identical metrics, so a faster `_dropped` may not move a single
token across the nucleus edge. Every test here compares it with `reference_dropped`, a verbatim
copy of the implementation it replaced (torch.sort with indices, softmax, float32 cumulative sum,
scatter), on inputs chosen to reach every path: continuous logits (no ties), bf16-rounded logits
(ties everywhere, so ties straddle the boundary), -inf entries, signed zeros, and rows with a
non-finite maximum, mixed in one batch so that some rows take the fallback and others do not.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import Tensor

from learner.algorithms.sampling_dist import (
    SamplingSettings,
    _boundary,
    _cumulative,
    _dropped,
    processed_logprobs,
)


def reference_dropped(scaled: Tensor, sampling: SamplingSettings) -> Tensor:
    """Verbatim copy of `_dropped` before the values-only sort (the definition of the result)."""
    vocab = scaled.shape[-1]
    top_k = sampling.top_k if 0 < sampling.top_k < vocab else 0
    if sampling.top_p >= 1.0:  # top-k only (vLLM's `apply_top_k_only`: no sort)
        if top_k == 0:
            return torch.zeros_like(scaled, dtype=torch.bool)
        kth = scaled.topk(top_k, dim=-1).values[..., -1:]  # (..., 1)
        return scaled < kth
    ascending, order = scaled.sort(dim=-1)  # (..., V)
    if top_k:
        kth = ascending[..., vocab - top_k : vocab - top_k + 1]  # (..., 1) k-th largest
        ascending = ascending.masked_fill(ascending < kth, float("-inf"))
    cumulative = ascending.softmax(dim=-1).cumsum(dim=-1)  # (..., V), last entry ~1
    # 1 - p in float32, exactly as vLLM compares (its p is a float32 tensor).
    threshold = 1.0 - torch.tensor(sampling.top_p, dtype=torch.float32, device=scaled.device)
    drop_sorted = (cumulative <= threshold) | (ascending == float("-inf"))
    drop_sorted[..., -1] = False  # the most likely token always stays
    return torch.zeros_like(drop_sorted).scatter_(-1, order, drop_sorted)


TOP_P = (0.1, 0.5, 0.9, 0.95, 0.999)
KINDS = ("peaked", "near_uniform", "peaked_bf16", "near_uniform_bf16", "zipf_bf16", "neg_inf")


def logits_of(kind: str, rows: int, vocab: int, seed: int) -> Tensor:
    """(rows, vocab) float32 logits of one kind: the shapes of a trained and a fresh model."""
    gen = torch.Generator().manual_seed(seed)
    noise = torch.randn(rows, vocab, generator=gen)
    if kind.startswith("peaked") or kind == "neg_inf":
        logits = 3.0 * noise  # a few hundred tokens hold most mass at 32k
    elif kind.startswith("near_uniform"):
        logits = 0.02 * noise  # a random-init model's head
    else:  # zipf: logit ~ -log(rank), ranks shuffled, as a language model's tail falls off
        ranks = torch.rand(rows, vocab, generator=gen).argsort(-1).float() + 1.0
        logits = 8.0 - 1.1 * ranks.log() + 0.3 * noise
    if kind == "neg_inf":  # a masked vocabulary slice, and a few isolated -inf entries
        logits[:, : vocab // 8] = float("-inf")
        logits[torch.rand(rows, vocab, generator=gen) < 0.05] = float("-inf")
    if kind.endswith("bf16"):  # a bf16 model's logits: many exact ties
        logits = logits.bfloat16().float()
    return logits


def assert_same(scaled: Tensor, sampling: SamplingSettings) -> None:
    got, want = _dropped(scaled, sampling), reference_dropped(scaled, sampling)
    assert got.dtype == want.dtype == torch.bool and got.shape == want.shape
    bad = (got != want).any(-1).nonzero().tolist()
    assert not bad, f"{sampling}: rows {bad[:5]} differ"


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("rows", "vocab"), [(64, 50), (32, 1000), (8, 32768)])
def test_same_mask_as_the_sort_and_scatter(kind: str, rows: int, vocab: int) -> None:
    logits = logits_of(kind, rows, vocab, seed=vocab + len(kind))
    for temperature, top_p, top_k in itertools.product((1.0, 0.7), TOP_P, (0, 5, 40)):
        scaled = logits / temperature  # as processed_logits scales them
        assert_same(scaled, SamplingSettings(temperature, top_p, top_k))


def test_same_mask_with_leading_dims_and_non_finite_rows() -> None:
    """(B, T, V) like the learner's logits; NaN, +inf and all -inf rows among ordinary ones,
    and rows of signed zeros (-0.0 == 0.0, but a values-only sort may trade them)."""
    logits = logits_of("peaked_bf16", 6 * 10, 1000, seed=3).reshape(6, 10, 1000)
    logits[0, 1, 7] = float("nan")
    logits[1, 2, 9] = float("inf")
    logits[2, 3] = float("-inf")
    logits[3, 4, 100:] = 0.0
    logits[3, 4, 100::3] = -0.0
    logits[4, 5] = torch.where(torch.arange(1000) % 2 == 0, 0.0, -0.0)
    logits[5, 6, :500] = -0.0  # the max ties at 0 with half the row
    logits[5, 6, 500:] = -1.0
    for top_p, top_k in itertools.product(TOP_P, (0, 5)):
        assert_same(logits, SamplingSettings(0.7, top_p, top_k))
        assert_same(logits[0, 0], SamplingSettings(0.7, top_p, top_k))  # one row (V,)


def test_processed_logprobs_unchanged_bitwise() -> None:
    """The distribution itself (the mask applied, renormalised) is the reference's."""
    logits = logits_of("zipf_bf16", 16, 32768, seed=5)
    settings_ = SamplingSettings(0.7, 0.9)
    scaled = logits / settings_.temperature
    want = scaled.masked_fill(reference_dropped(scaled, settings_), float("-inf")).log_softmax(-1)
    assert torch.equal(processed_logprobs(logits, settings_), want)


def test_continuous_logits_need_no_index_sort() -> None:
    """Without ties every row's mask is a comparison (`_boundary` exact): the saving holds."""
    logits = logits_of("peaked", 64, 32768, seed=7) / 0.7
    for top_p, top_k in itertools.product(TOP_P, (0, 40)):
        threshold = 1.0 - torch.tensor(top_p, dtype=torch.float32)
        ascending = logits.sort(dim=-1).values
        _, exact = _boundary(ascending, *_cumulative(ascending, top_k), threshold)
        assert bool(exact.all()), (top_p, top_k)


# Few distinct values (ties everywhere), signed zeros, infinities and NaN: the edge cases.
VALUES = st.sampled_from(
    [float("-inf"), -3.0, -1.0, -0.5, -0.0, 0.0, 0.25, 1.0, 1.5, 4.0, float("inf"), float("nan")]
)
ROWS = st.integers(1, 12).flatmap(
    lambda n: st.lists(st.lists(VALUES, min_size=n, max_size=n), min_size=1, max_size=6)
)


@settings(max_examples=400, deadline=None)
@given(
    rows=ROWS,
    top_p=st.sampled_from([0.05, 0.1, 0.3, 0.5, 0.7, 0.9, 0.95, 0.999, 0.9999999]),
    top_k=st.sampled_from([0, 1, 3, 11]),
    temperature=st.sampled_from([0.01, 0.7, 1.0, 2.0]),
)
def test_same_mask_on_tie_heavy_rows(
    rows: list[list[float]], top_p: float, top_k: int, temperature: float
) -> None:
    scaled = torch.tensor(rows, dtype=torch.float32) / temperature
    assert_same(scaled, SamplingSettings(temperature, top_p, top_k))
