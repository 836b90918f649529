"""Masked reductions shared by every objective, advantage and KL estimator.

All per-token tensors in the learner are right-padded [B, T] with a response mask that is 1 on
response tokens and 0 on prompt and padding. Reductions here use `torch.where` rather than a
multiply so that a NaN or inf parked in a padded slot can never leak into a sum (0 * inf = NaN).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import get_args

import torch
from torch import Tensor

from learner.vocabulary import LossAggregation


def masked_sum(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Sum of `x` over positions where `mask` is nonzero; padded values never propagate."""
    kept = torch.where(mask.bool(), x, 0.0)
    return kept.sum() if dim is None else kept.sum(dim)


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of `x` over masked positions: sum(mask * x) / max(sum(mask), 1).

    The denominator is clamped to 1 so an all-padding row (or batch) gives 0, not NaN, while the
    result still carries a grad graph back to `x`.
    """
    count = mask.bool().sum() if dim is None else mask.bool().sum(dim)
    return masked_sum(x, mask, dim) / count.clamp_min(1)


def masked_var(x: Tensor, mask: Tensor) -> Tensor:
    """Population variance (divide by n, not n - 1) of `x` over masked positions.

    The population convention is used throughout the learner (group advantages, whitening):
    it is defined for a single element (variance 0) where the sample variance is NaN.
    """
    centred = x - masked_mean(x, mask)
    return masked_mean(centred * centred, mask)


# LossAggregation (learner.config), the single definition of the choices:
"""How per-token loss terms become one scalar (re-exported by `learner.algorithms.objectives`).

- `seq-mean-token-mean`: mean over each sequence's tokens, then over sequences (original GRPO,
  Shao et al. 2024, eq. 3). Long answers get less weight per token.
- `token-mean`: one mean over all response tokens of the batch (DAPO, Yu et al. 2025, eq. 8).
- `seq-mean-token-sum-norm`: token sums divided by a constant `max_len`, then mean over sequences
  (Dr. GRPO, Liu et al. 2025, sec. 3.1): removes the length bias without a per-sample divisor.
"""

LOSS_AGGREGATIONS: tuple[str, ...] = get_args(LossAggregation)


@dataclass(frozen=True)
class LossTotals:
    """What a loss divides by, counted over the whole minibatch its rows belong to.

    A minibatch may be trained in parts: micro-batches (gradient accumulation,
    `learner.micro_batch_tokens`) and data-parallel ranks. When every part divides its sums by
    the minibatch's counts instead of its own, the parts' losses, hence their gradients, add up
    to the whole minibatch's, for every aggregation: token-mean divides by `tokens`, the
    seq-mean modes (and GSPO's and GMPO's means over sequences) by `sequences`, and Dr. GRPO's
    max_len is a constant anyway. Counted as the aggregation counts (masked tokens stay in):
    response tokens, and rows with at least one response token.
    """

    tokens: Tensor  # () int64: response tokens of the minibatch
    sequences: Tensor  # () int64: its non-empty rows

    @classmethod
    def of(cls, mask: Tensor) -> LossTotals:
        """The totals of a [B, T] response mask."""
        return cls.of_lengths(mask.bool().sum(-1))

    @classmethod
    def of_lengths(cls, lengths: Tensor) -> LossTotals:
        """The totals of [B] response lengths."""
        return cls(lengths.sum(), (lengths > 0).sum())


def check_aggregation(agg: str, max_len: int | None) -> None:
    """Validate an aggregation mode and Dr. GRPO's constant; the error says how to fix it."""
    if agg not in LOSS_AGGREGATIONS:
        raise ValueError(f"unknown loss aggregation {agg!r}; choose one of {LOSS_AGGREGATIONS}")
    if agg == "seq-mean-token-sum-norm" and (max_len is None or max_len <= 0):
        raise ValueError(
            f"agg='seq-mean-token-sum-norm' (Dr. GRPO) divides token sums by a constant max_len, "
            f"got max_len={max_len!r}; pass max_len=<generation max_new_tokens>, e.g. 1024"
        )


def aggregate_padded(
    per_token: Tensor,
    lengths: Tensor,
    agg: LossAggregation,
    max_len: int | None = None,
    totals: LossTotals | None = None,
) -> Tensor:
    """Reduce per-token terms [B, T] that are already exactly 0 off the mask to a scalar.

    `lengths` [B] are response lengths. Skipping a second masking pass is what keeps the
    objectives cheap; callers zero padding once, up front. seq-mean modes average over non-empty
    rows only, so an empty response changes nothing; no response tokens at all gives 0 (0 / 1)
    with a grad graph. `totals` are the counts of the whole minibatch these rows are part of
    (`LossTotals`); None: these rows are the whole minibatch.

    Masked tokens stay in the denominator. A filter on top of the response mask (a correction's
    rejection: `mis_*`, `icepop`, capped `decoupled`, by weight 0; Clip-Cov's detached tokens)
    zeroes its tokens' terms or gradients and leaves `lengths` alone, so token-mean still divides
    by every response token and the seq-mean modes by every token of the row and every non-empty
    row, a fully masked sequence included; as AReaL, which counts its loss mask before applying
    the behaviour-weight mask. Why: the per-token weight then does not depend on how many tokens
    a filter removes, so filtering cannot silently raise the weight of the survivors. Only prompt
    and padding positions are outside `lengths` (`tests/learner/test_masked_normaliser.py`).
    """
    check_aggregation(agg, max_len)
    totals = LossTotals.of_lengths(lengths) if totals is None else totals
    if agg == "token-mean":
        return per_token.sum() / totals.tokens.clamp_min(1)
    seq_sum = per_token.sum(-1)  # (B,)
    divisor = lengths.clamp_min(1) if agg == "seq-mean-token-mean" else max_len
    return (seq_sum / divisor).sum() / totals.sequences.clamp_min(1)
