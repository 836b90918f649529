"""What an objective returns: its loss terms before aggregation, and its typed stats.

An objective computes per-token (or per-sequence) terms of the rows it is given and never
aggregates them: the update's one reducer (`learner.algorithms.objectives.reduce.reduce_loss`)
does, with the whole minibatch's totals, whether the rows are the minibatch or a part of it
(micro-batches, data-parallel ranks). The stats are tensors of the same rows, kept from that
one call, from which the step's metrics are computed once (`policy_metrics`), after the parts
of a minibatch are put back together.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from learner.algorithms.kl import kl_from_log_ratio
from learner.algorithms.objectives.inputs import PolicyBatch
from learner.algorithms.objectives.settings import PolicySettings
from learner.vocabulary import LossAggregation


class LossTerms(NamedTuple):
    """A loss before aggregation: the reducer's loss is

        scale * aggregate(terms) + beta * aggregate(kl)      (the second only when beta != 0)

    `terms` (B, T) per token, exactly 0 off the mask, aggregated by `agg`; or (B,) one per
    sequence, 0 for empty rows, averaged over the non-empty sequences (GSPO, GMPO). `kl` (B, T):
    the per-token KL(pi_theta || pi_ref) estimate, 0 off the mask, aggregated by `agg` too; None
    without reference log-probs. Only `terms` (and `kl` when beta != 0) carry a graph.
    """

    terms: Tensor
    agg: LossAggregation
    kl: Tensor | None = None
    beta: float = 0.0
    scale: float = 1.0

    def detach(self) -> LossTerms:
        """The same terms without their graph (kept for the stats, once per part)."""
        kl = None if self.kl is None else self.kl.detach()
        return self._replace(terms=self.terms.detach(), kl=kl)


class PolicyStats(NamedTuple):
    """The rows' tensors the policy metrics are computed from (`policy_metrics`), no graph.

    `ratio` (B, T), or (B,) for an objective that clips one ratio per sequence (GSPO): the ratio
    the objective clips, in its own units, exactly 1 off the mask (or for an empty row).
    `clipped`, shaped as `ratio`, float 0/1: 1 where the objective's mechanism acts on the
    token (or sequence): its clip is active, or its own flag (each objective's docstring).
    `log_ratio` (B, T): l_t = log pi_theta - log pi_old, 0 off the mask, unclamped.
    `is_token_ratio`: `ratio` is r_t = exp(l_t) itself (not GSPO's s_i or s_i,t).
    """

    ratio: Tensor
    clipped: Tensor
    log_ratio: Tensor
    is_token_ratio: bool = True


class PolicyTerms(NamedTuple):
    """A policy objective's result: its loss terms and its stats, of the rows it was given."""

    loss: LossTerms
    stats: PolicyStats

    def detach(self) -> PolicyTerms:
        return PolicyTerms(self.loss.detach(), self.stats)


def reference_kl(batch: PolicyBatch, settings: PolicySettings) -> Tensor | None:
    """Per-token KL(pi_theta || pi_ref) (B, T), 0 off the mask, or None without ref_logprobs.

    The penalty of GRPO (Shao et al. 2024, eq. 4). Tokens are sampled from the policy being
    trained, so per token log r = log pi_ref - log pi_theta (`learner.algorithms.kl.kl`). It has
    a graph only when penalised (beta != 0); it is measured whenever ref_logprobs are given.
    """
    beta, ref_logprobs = settings.beta, batch.ref_logprobs
    if ref_logprobs is None:
        if beta != 0.0:
            raise ValueError(f"beta={beta} needs ref_logprobs; pass them or set beta=0.0")
        return None
    with torch.set_grad_enabled(beta != 0.0 and torch.is_grad_enabled()):
        log_r = torch.where(batch.mask, ref_logprobs.detach().float() - batch.logprobs.float(), 0.0)
        return kl_from_log_ratio(log_r, settings.kl_estimator)  # (B, T)  0 off the mask


def policy_terms(
    batch: PolicyBatch,
    settings: PolicySettings,
    terms: Tensor,
    agg: LossAggregation,
    *,
    ratio: Tensor,
    clipped: Tensor,
    is_token_ratio: bool = True,
) -> PolicyTerms:
    """An objective's `terms` with the reference-KL term its arm asks for, and its stats (see
    `LossTerms` and `PolicyStats` for the shapes)."""
    loss = LossTerms(terms, agg, reference_kl(batch, settings), settings.beta)
    stats = PolicyStats(ratio.detach(), clipped.detach(), batch.log_ratio.detach(), is_token_ratio)
    return PolicyTerms(loss, stats)
