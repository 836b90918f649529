"""Small pieces the objectives with a fixed aggregation share (CISPO, SAPO, GMPO, *-Cov)."""

from __future__ import annotations

from dataclasses import replace

from torch import Tensor

from learner.algorithms.objectives.inputs import PolicyBatch, kl_ref_term
from learner.algorithms.options import ObjectiveOptions
from learner.vocabulary import LossAggregation


def with_aggregation(options: ObjectiveOptions, agg: LossAggregation) -> ObjectiveOptions:
    """`options` with the objective's own aggregation (max_len then has no effect), so the
    optional reference-KL term is aggregated like the policy term."""
    if options.agg == agg and options.max_len is None:
        return options
    return replace(options, agg=agg, max_len=None)


def add_kl_ref(
    loss: Tensor, batch: PolicyBatch, options: ObjectiveOptions
) -> tuple[Tensor, Tensor | None]:
    """(loss + beta * KL(pi_theta || pi_ref) when beta > 0, the measured KL or None)."""
    kl_term, kl_ref = kl_ref_term(batch, options)
    return (loss if kl_term is None else loss + kl_term), kl_ref
