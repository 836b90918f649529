"""The one reducer: loss terms -> the loss, with the whole minibatch's totals.

Every objective hands its terms over unaggregated (`LossTerms`); this is the only place they are
divided by a count. A minibatch may be trained in parts (micro-batches, data-parallel ranks):
each part's terms are reduced with the *minibatch's* totals (`LossTotals`), so the parts'
losses, hence their gradients, add up to the whole minibatch's, for every aggregation.
"""

from __future__ import annotations

from torch import Tensor

from learner.algorithms.masking import LossTotals, aggregate_padded
from learner.algorithms.objectives.inputs import PolicyBatch
from learner.algorithms.objectives.objective import PolicyObjective
from learner.algorithms.objectives.stats import policy_metrics
from learner.algorithms.objectives.terms import LossTerms


def reduce_loss(
    loss: LossTerms,
    lengths: Tensor,
    totals: LossTotals | None = None,
    max_len: int | None = None,
) -> Tensor:
    """scale * aggregate(terms) + beta * aggregate(kl) (`LossTerms`), a float32 scalar with the
    terms' graph. `lengths` [B] are the rows' response lengths; `totals` the counts of the whole
    minibatch they belong to (None: these rows are the minibatch); `max_len` Dr. GRPO's constant
    divisor (the generation cap), read by `seq-mean-token-sum-norm` only. Per-sequence terms
    [B] are averaged over the minibatch's non-empty sequences."""
    totals = LossTotals.of_lengths(lengths) if totals is None else totals
    if loss.terms.ndim == 1:
        value = loss.terms.sum() / totals.sequences.clamp_min(1)
    else:
        value = aggregate_padded(loss.terms, lengths, loss.agg, max_len, totals)
    if loss.scale != 1.0:
        value = loss.scale * value
    if loss.kl is not None and loss.beta != 0.0:
        value = value + loss.beta * aggregate_padded(loss.kl, lengths, loss.agg, max_len, totals)
    return value


def evaluate(
    objective: PolicyObjective, batch: PolicyBatch, settings: object, max_len: int | None = None
) -> tuple[Tensor, dict[str, float]]:
    """(loss, metrics) of an objective on one whole minibatch in one process: its one call,
    reduced, and the metrics of its stats (`policy_metrics`). The learner's update does the
    same per part (`learner.runtime.minibatch`)."""
    terms = objective(batch, settings)
    loss = reduce_loss(terms.loss, batch.lengths, max_len=max_len)
    return loss, policy_metrics(terms, batch.mask, loss)
