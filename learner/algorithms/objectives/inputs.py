"""What every policy objective starts from: checked inputs, constants, the reference-KL term."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
from torch import Tensor

from learner.algorithms.kl import kl_from_log_ratio
from learner.algorithms.masking import LossTotals, aggregate_padded
from learner.algorithms.options import ObjectiveOptions

Stats = dict[str, float]


@dataclass(frozen=True)
class PolicyBatch:
    """The checked tensors of one objective call. Only `logprobs` carries a grad graph."""

    logprobs: Tensor  # (B, T) log pi_theta, any float dtype
    log_ratio: Tensor  # (B, T) l_t = log pi_theta - log pi_old in float32, exactly 0 off the mask
    mask: Tensor  # (B, T) bool, response tokens
    lengths: Tensor  # (B,) response lengths
    is_weights: Tensor | None  # (B, T) truncated IS weights, constants
    ref_logprobs: Tensor | None  # (B, T) reference policy, constants
    totals: LossTotals  # what the loss divides by: the whole minibatch's counts
    selected: Tensor | None = None  # (B, T) bool: the tokens a selecting loss acts on


def prepare(
    logprobs: Tensor,
    old_logprobs: Tensor,
    mask: Tensor,
    is_weights: Tensor | None,
    ref_logprobs: Tensor | None,
    *,
    totals: LossTotals | None = None,
) -> PolicyBatch:
    """Check shapes and take l_t in float32, exactly 0 off the mask, so every later per-token
    term is 0 there and plain sums are masked sums. `totals` None: the rows are the whole
    minibatch."""
    if logprobs.shape != old_logprobs.shape or logprobs.shape != mask.shape or logprobs.ndim != 2:
        raise ValueError(
            f"logprobs, old_logprobs and mask must share one [B, T] shape; got "
            f"{tuple(logprobs.shape)}, {tuple(old_logprobs.shape)}, {tuple(mask.shape)}"
        )
    mask = mask.bool()
    log_ratio = torch.where(mask, logprobs.float() - old_logprobs.detach().float(), 0.0)
    lengths = mask.sum(-1)  # (B,)
    totals = LossTotals.of_lengths(lengths) if totals is None else totals
    return PolicyBatch(logprobs, log_ratio, mask, lengths, is_weights, ref_logprobs, totals)


BatchObjective = Callable[[PolicyBatch, Tensor, ObjectiveOptions], tuple[Tensor, Stats]]
TokenSelection = Callable[[PolicyBatch, Tensor, ObjectiveOptions], Tensor]
"""(batch, advantages, options) -> bool [B, T]: the tokens a loss singles out by statistics of
the whole minibatch (Clip-Cov, KL-Cov), so a part of the minibatch cannot choose them alone."""


class PolicyLoss:
    """The shape of every policy objective: (tensors..., options) -> (loss, stats).

    Made by decorating the objective's core, a function of the checked `PolicyBatch`, so that
    the call signature, the shape checks and l_t (`prepare`) are written once for all objectives.

    A minibatch trained in parts (micro-batches, data-parallel ranks) calls the loss once per
    part with `totals`, the whole minibatch's counts (`learner.algorithms.masking.LossTotals`):
    the core divides by them (`batch.totals`), so the parts' losses and gradients add up to the
    minibatch's. A loss that also selects tokens by statistics of the whole minibatch declares
    its `select` (`PolicyLoss.selecting`); the caller computes `selection` once on the whole
    minibatch and passes each part its rows as `selected`. Stats always describe the rows
    passed (their own counts), so the caller takes a minibatch's stats from one call on all of
    it. Unsplit calls (no totals, no selection) are what every objective computed before.
    """

    __name__: str

    def __init__(self, core: BatchObjective, select: TokenSelection | None = None) -> None:
        self.core = core
        self.select = select
        self.__name__ = core.__name__
        self.__doc__ = core.__doc__

    @classmethod
    def selecting(cls, select: TokenSelection) -> Callable[[BatchObjective], PolicyLoss]:
        """Decorator of a core that reads `batch.selected`, chosen by `select` over the whole
        minibatch (by the loss itself when called on all of it)."""
        return lambda core: cls(core, select)

    def __repr__(self) -> str:
        return f"PolicyLoss({self.__name__})"

    def __call__(
        self,
        logprobs: Tensor,
        old_logprobs: Tensor,
        advantages: Tensor,
        mask: Tensor,
        options: ObjectiveOptions,
        *,
        is_weights: Tensor | None = None,
        ref_logprobs: Tensor | None = None,
        totals: LossTotals | None = None,
        selected: Tensor | None = None,
    ) -> tuple[Tensor, Stats]:
        batch = prepare(logprobs, old_logprobs, mask, is_weights, ref_logprobs, totals=totals)
        if self.select is not None:
            if selected is None:
                selected = self.select(batch, advantages, options)
            elif selected.shape != batch.mask.shape:
                raise ValueError(
                    f"{self.__name__}: selected must be [B, T] = {tuple(batch.mask.shape)} (these "
                    f"rows of the minibatch's selection); got {tuple(selected.shape)}"
                )
            batch = replace(batch, selected=selected.bool() & batch.mask)
        return self.core(batch, advantages, options)

    @torch.no_grad()
    def selection(
        self,
        logprobs: Tensor,
        old_logprobs: Tensor,
        advantages: Tensor,
        mask: Tensor,
        options: ObjectiveOptions,
    ) -> Tensor | None:
        """The tokens [B, T] this loss selects over these rows (the whole minibatch), None for a
        loss that selects none; pass each part its rows as `selected`."""
        if self.select is None:
            return None
        return self.select(prepare(logprobs, old_logprobs, mask, None, None), advantages, options)


def masked_constant(x: Tensor, mask: Tensor, name: str) -> Tensor:
    """A [B] or [B, T] constant as float32 [B, T], 0 off the mask (so never counted as clipped)."""
    if x.shape == mask.shape[:1]:
        x = x[:, None]  # (B, 1)
    elif x.shape != mask.shape:
        raise ValueError(f"{name} must be [B] or [B, T] = {tuple(mask.shape)}; got {x.shape}")
    return torch.where(mask, x.detach().float(), 0.0)  # (B, T)


def kl_ref_term(
    batch: PolicyBatch, options: ObjectiveOptions
) -> tuple[Tensor | None, Tensor | None]:
    """(beta * aggregated KL(pi_theta || pi_ref) or None, token-mean KL for stats or None).

    The penalty of GRPO (Shao et al. 2024, eq. 4), aggregated like the policy terms
    (`options.agg`). Tokens are sampled from the policy being trained, so per token
    log r = log pi_ref - log pi_theta (`learner.algorithms.kl.kl`). The KL is measured whenever
    ref_logprobs are given, even with beta = 0.
    """
    beta, ref_logprobs, mask, lengths = options.beta, batch.ref_logprobs, batch.mask, batch.lengths
    if ref_logprobs is None:
        if beta != 0.0:
            raise ValueError(f"beta={beta} needs ref_logprobs; pass them or set beta=0.0")
        return None, None
    with torch.set_grad_enabled(beta != 0.0 and torch.is_grad_enabled()):
        log_r = torch.where(mask, ref_logprobs.detach().float() - batch.logprobs.float(), 0.0)
        kl_t = kl_from_log_ratio(log_r, options.kl_estimator)  # (B, T)  0 off the mask
    kl_ref = kl_t.detach().sum() / lengths.sum().clamp_min(1)
    if beta == 0.0:
        return None, kl_ref
    kl_term = aggregate_padded(kl_t, lengths, options.agg, options.max_len, batch.totals)
    return beta * kl_term, kl_ref
