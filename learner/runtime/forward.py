"""Per-token log-probabilities and entropies of a causal LM on collated rollouts.

Tokens are scored under the *sampling* distribution (`learner.algorithms.sampling_dist`: logits / T,
then top-k and top-p), the one the generator sampled from and whose log-probs it stored as behaviour
log-probs, so identical weights give ratio 1 at any temperature and nucleus. Every learner
log-prob pass (pi_old recompute, the current policy in the loss, the reference) goes through here.

Position convention (shared with `buffer.schema.collate`): `input_ids[b, p]` is token p of the
sequence prompt + response; the model's logits at position p - 1 predict token p, so the logprob of
token p is read from logits[:, p - 1]. Outputs are aligned with `input_ids`: position 0 (never a
response token) holds 0. Logits are materialised once, in float32, and only response positions
matter to the caller (the response mask zeroes the rest).

Chunked (`chunk_tokens`, `learner.logprob_chunk_tokens`): the full [B, L, V] logits never exist.
The base model's last hidden states are projected by the output embedding `chunk_tokens`
positions at a time, each chunk scored and dropped; in a gradient pass each chunk runs under
`torch.utils.checkpoint`, so autograd keeps only the chunk's hidden states and recomputes its
logits in backward, one chunk at a time (the price: a second head projection and sampling
transform per chunk). Largest float32 buffer: [chunk_tokens, V] instead of [B, L, V] (and the
log-softmax, top-k/top-p copies of the same size). A chunk's logits in the compute dtype are
freed once its float32 log-softmax exists (`_score`), and the entropy, a detached metric, is
reduced `ENTROPY_ROWS` positions at a time, so its temporaries are [ENTROPY_ROWS, V] beside the
log-softmax (`_entropy`). Only real tokens are scored; padding positions hold 0.

Passes that only score (no gradient) run inside `scoring(...)`: eval mode and no_grad, so a module
with dropout (or any other train-time randomness) scores deterministically; each module's mode is
restored afterwards, so gradient passes run in train mode.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from learner.algorithms.sampling_dist import (
    LOGPROB_FLOOR,
    PLAIN,
    SamplingSettings,
    processed_logprobs,
)
from learner.runtime.distributed import unwrap


def token_logprobs_from_logits(
    logits: Tensor, input_ids: Tensor, sampling: SamplingSettings = PLAIN
) -> tuple[Tensor, Tensor]:
    """(logprobs, entropy), each [B, L], aligned with input_ids (position 0 is 0).

    Both are of the sampling distribution. A token outside its top-k / top-p set (log-prob -inf)
    is floored at `LOGPROB_FLOOR` with zero gradient (see there); entropy counts kept tokens only.
    """
    chosen, entropy = _score(logits[:, :-1], input_ids[:, 1:], sampling)  # (B, L-1) each
    pad = chosen.new_zeros(chosen.shape[0], 1)  # (B, 1)
    return torch.cat([pad, chosen], dim=1), torch.cat([pad, entropy], dim=1)


ENTROPY_ROWS = 128
"""Positions whose entropy `_entropy` reduces at once (at least 2, `_row_spans`): its temporaries
(exp * log p, the `where`, the finite mask) are [ENTROPY_ROWS, V], not [positions, V]
(`harness.planning.logits` counts them so)."""


def _score(logits: Tensor, targets: Tensor, sampling: SamplingSettings) -> tuple[Tensor, Tensor]:
    """(log-prob of each target, entropy) under the sampling distribution; logits (..., V),
    targets (...). Once the float32 log-softmax exists, `logits` is dropped: a caller that
    keeps no reference to them (`_head_score`) frees a chunk's compute-dtype logits there."""
    log_probs = processed_logprobs(logits, sampling)  # (..., V) float32
    del logits
    chosen = log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # (...), may be -inf
    # clamp_min has zero gradient below the floor, so a -inf never reaches the graph as a NaN.
    chosen = chosen.clamp_min(LOGPROB_FLOOR)
    # Last: a checkpointed chunk's recompute stops once the log-prob's graph is rebuilt.
    entropy = _entropy(log_probs.detach())  # (...)
    return chosen, entropy


def _entropy(log_probs: Tensor) -> Tensor:
    """-sum_v p_v log p_v over the last dim; tokens with p = 0 (log p = -inf) add 0, not NaN.

    `ENTROPY_ROWS` positions at a time (`_row_spans`), each row's sum the one the whole tensor
    would give it, bit for bit."""
    flat = log_probs.reshape(-1, log_probs.shape[-1])  # (N, V): a view of the log-softmax
    pieces = [_rows_entropy(flat[start:end]) for start, end in _row_spans(flat.shape[0])]
    return torch.cat(pieces).reshape(log_probs.shape[:-1])


def _rows_entropy(log_probs: Tensor) -> Tensor:
    """The entropy of each row of log_probs (n, V) -> (n,).

    One (n, V) temporary, updated in place: p log p is finite wherever log p is (log p <= 0),
    and NaN where log p = -inf (0 * -inf), which becomes the 0 it stands for. Bit for bit the
    masked form `where(isfinite(log p), p log p, 0)`, at a quarter of its time on CPU and
    without its mask and second copy."""
    terms = log_probs.exp()  # (n, V)
    terms.mul_(log_probs).nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0)
    return -terms.sum(-1)


def _row_spans(rows: int) -> list[tuple[int, int]]:
    """[start, end) spans of `ENTROPY_ROWS` rows covering `rows`; a last span of one row joins
    the one before it. Why: a sum with a single output is the one reduction whose CPU kernel
    splits the row itself over threads (two passes), so a lone row's bits could differ from
    the same row's among others; every sum of two or more rows reduces each row alike."""
    starts = list(range(0, max(rows, 1), ENTROPY_ROWS))
    if len(starts) > 1 and rows - starts[-1] == 1:
        starts.pop()
    return list(zip(starts, [*starts[1:], rows], strict=True))


def policy_logprobs(
    model: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    sampling: SamplingSettings = PLAIN,
    chunk_tokens: int | None = None,
) -> tuple[Tensor, Tensor]:
    """Forward the policy and return (logprobs, entropy) aligned with input_ids, both [B, L].

    `chunk_tokens` None: from the model's full logits; else from its hidden states, that many
    positions at a time (module docstring), padding positions 0.
    """
    if chunk_tokens is None:
        out = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
        return token_logprobs_from_logits(out.logits, input_ids, sampling)
    hidden, head = final_hidden_states(model, input_ids, attention_mask)  # (B, L, H)
    return chunked_token_logprobs(
        hidden, head, input_ids, attention_mask, sampling=sampling, chunk_tokens=chunk_tokens
    )


def final_hidden_states(
    model: nn.Module, input_ids: Tensor, attention_mask: Tensor
) -> tuple[Tensor, nn.Module]:
    """(the base model's last hidden states [B, L, H], the output embedding).

    The forward runs through `model` itself, so a DistributedDataParallel wrapper still syncs
    the gradients; `logits_to_keep=1` has the causal LM project only the last position, and a
    forward hook on its base (`get_decoder()`) keeps the hidden states. That one position also
    checks that the model's logits are the output embedding of the hidden states and nothing
    more (a logit scale or soft-cap would be skipped by chunking).
    """
    causal_lm = unwrap(model)
    base, head = causal_lm.get_decoder(), causal_lm.get_output_embeddings()
    kept: list[Tensor] = []
    handle = base.register_forward_hook(lambda _module, _args, output: kept.append(output[0]))
    try:
        out = model(
            input_ids=input_ids, attention_mask=attention_mask, use_cache=False, logits_to_keep=1
        )
    finally:
        handle.remove()
    hidden = kept[-1]  # (B, L, H)
    with torch.no_grad():
        last = head(hidden[:, -1:]).float()  # (B, 1, V)
        # equal_nan: diverged weights are the step's DivergenceError to report, not this check's.
        if not torch.allclose(last, out.logits.float(), rtol=1e-5, atol=1e-5, equal_nan=True):
            raise ValueError(
                f"{type(causal_lm).__name__}'s logits are not its output embedding of the base "
                "model's hidden states (a logit scale or soft-cap?), so chunked log-probs would "
                "differ; leave learner.logprob_chunk_tokens unset for this model"
            )
    return hidden, head


def chunked_token_logprobs(
    hidden: Tensor,
    head: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    *,
    sampling: SamplingSettings,
    chunk_tokens: int,
) -> tuple[Tensor, Tensor]:
    """(logprobs, entropy) [B, L] of `token_logprobs_from_logits(head(hidden), ...)` with the
    logits made `chunk_tokens` positions at a time, of real tokens only (padding holds 0).

    With a graph, each chunk is checkpointed: backward keeps its hidden states and recomputes
    its logits, so no two chunks' [chunk, V] tensors are alive at once.
    """
    scored = attention_mask[:, 1:].bool()  # (B, L-1): token p + 1 is real, predicted at p
    states = hidden[:, :-1][scored]  # (N, H)
    targets = input_ids[:, 1:][scored]  # (N,)
    graph = torch.is_grad_enabled() and states.requires_grad
    pieces = []
    for start in range(0, states.shape[0], chunk_tokens):
        piece = (states[start : start + chunk_tokens], targets[start : start + chunk_tokens])
        if graph:
            pieces.append(checkpoint(_head_score, *piece, head, sampling, use_reentrant=False))
        else:
            pieces.append(_head_score(*piece, head, sampling))
    if not pieces:  # no token to score: empty, still on the graph
        pieces = [(states.sum(-1).float(), states.new_zeros(0, dtype=torch.float32))]
    chosen, entropy = (torch.cat(parts) for parts in zip(*pieces, strict=True))  # (N,) each
    zeros = torch.zeros(input_ids.shape, dtype=torch.float32, device=hidden.device)  # (B, L)
    logprobs = zeros[:, 1:].masked_scatter(scored, chosen)  # (B, L-1)
    entropies = zeros[:, 1:].masked_scatter(scored, entropy)  # (B, L-1)
    return torch.cat([zeros[:, :1], logprobs], 1), torch.cat([zeros[:, :1], entropies], 1)


def _head_score(
    states: Tensor, targets: Tensor, head: nn.Module, sampling: SamplingSettings
) -> tuple[Tensor, Tensor]:
    """(log-probs, entropies) [n] of n positions' next tokens from their hidden states [n, H]."""
    # No name holds the logits (n, V) here: `_score` frees them after their log-softmax.
    return _score(head(states), targets, sampling)


@contextmanager
def scoring(*modules: nn.Module | None) -> Iterator[None]:
    """no_grad with every given module in eval mode; each module's own mode is restored after.

    For passes that are not gradient passes (pi_old, reference, old values, diagnostics): eval
    mode turns off dropout and similar train-time noise, so the score is the policy's. None
    entries are skipped (an absent reference or critic).
    """
    present = [module for module in modules if module is not None]
    # Per submodule, so a part that was deliberately in another mode gets that mode back.
    modes = [(sub, sub.training) for module in present for sub in module.modules()]
    for module in present:
        module.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        for sub, was_training in modes:
            sub.training = was_training
