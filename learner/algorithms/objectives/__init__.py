"""Policy objectives as pure functions: GSPO, GSPO-token, GRPO, PPO, PPO's value loss, and
CISPO, SAPO, GMPO, Clip-Cov and KL-Cov (one module each: `cispo`, `sapo`, `gmpo`, `covariance`).

Every policy objective is a `PolicyObjective`: it takes the checked batch of the rows it trains
on (`PolicyBatch.of`: right-padded [B, T] tensors and a response mask, 1 on response tokens, 0
on prompt and padding) and its arm, the frozen config model (read through the `settings`
Protocols), and returns `PolicyTerms`: its loss terms per token (or per sequence), not yet
aggregated, and its stats (`PolicyStats`), tensors of the same rows. The update's one reducer
(`reduce.reduce_loss`) aggregates the terms with the whole minibatch's totals, so a minibatch
trained in parts (micro-batches, data-parallel ranks) gets the gradient of the whole; the
step's metrics are computed once from the stats of all its parts (`stats.policy_metrics`, by
their `contract.metrics` names). `evaluate` does both on one whole batch. Which objective an
arm trains, with which defaults, advantages and critic, is declared once per objective by its
arm model (`learner.config.arms`); `POLICY_LOSSES` maps each objective name to its objective.

Numerics: any float dtype is computed in float32; padded slots are replaced by 0 before any
arithmetic, so values parked there (even inf) change nothing; log-ratios are clamped to [-20, 20]
before exp; empty rows add nothing and a batch without response tokens gives loss 0 (still
differentiable). In the policy objectives only `logprobs` receives gradients; every other
tensor (old and reference logprobs, advantages, IS weights) is treated as a constant. Clip-Cov
and KL-Cov select tokens by statistics of the whole minibatch (`PolicyObjective.selection`).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import get_args

from learner.algorithms.masking import LOSS_AGGREGATIONS, LossAggregation, LossTotals
from learner.algorithms.objectives.cispo import cispo_loss
from learner.algorithms.objectives.covariance import clip_cov_loss, kl_cov_loss
from learner.algorithms.objectives.gmpo import gmpo_loss
from learner.algorithms.objectives.inputs import PolicyBatch, masked_constant
from learner.algorithms.objectives.objective import PolicyObjective
from learner.algorithms.objectives.policy import grpo_loss, gspo_loss, gspo_token_loss, ppo_loss
from learner.algorithms.objectives.reduce import evaluate, reduce_loss
from learner.algorithms.objectives.sapo import sapo_loss
from learner.algorithms.objectives.settings import (
    ClipCovSettings,
    KLCovSettings,
    PolicySettings,
    SAPOSettings,
)
from learner.algorithms.objectives.stats import POLICY_METRICS, policy_metrics
from learner.algorithms.objectives.surrogate import clipped_surrogate
from learner.algorithms.objectives.terms import LossTerms, PolicyStats, PolicyTerms, policy_terms
from learner.algorithms.objectives.value import ValueStats, ValueTerms, value_loss, value_metrics
from learner.vocabulary import Objective

_LOSSES: dict[str, PolicyObjective] = {
    "gspo": gspo_loss,
    "gspo_token": gspo_token_loss,
    "grpo": grpo_loss,
    "ppo": ppo_loss,
    "cispo": cispo_loss,
    "sapo": sapo_loss,
    "gmpo": gmpo_loss,
    "clip_cov": clip_cov_loss,
    "kl_cov": kl_cov_loss,
}
POLICY_LOSSES: Mapping[str, PolicyObjective] = MappingProxyType(_LOSSES)
"""Objective name -> its objective: the built-in ones (`learner.vocabulary.Objective`), then any
a plugin registered (`learner.plugins`). Read-only; `register_policy_loss` adds."""


def register_policy_loss(name: str, objective: PolicyObjective) -> None:
    """Add a plugin's objective under its name; a built-in or taken name is refused."""
    if name in _LOSSES and _LOSSES[name] is not objective:
        raise ValueError(f"objective {name!r} already has a loss ({_LOSSES[name].__name__})")
    _LOSSES[name] = objective


def unregister_policy_loss(name: str) -> None:
    """Drop an objective that failed its registration check (a plugin's only)."""
    if name not in get_args(Objective):
        _LOSSES.pop(name, None)


__all__ = [
    "LOSS_AGGREGATIONS",
    "POLICY_LOSSES",
    "POLICY_METRICS",
    "ClipCovSettings",
    "KLCovSettings",
    "LossAggregation",
    "LossTerms",
    "LossTotals",
    "PolicyBatch",
    "PolicyObjective",
    "PolicySettings",
    "PolicyStats",
    "PolicyTerms",
    "SAPOSettings",
    "ValueStats",
    "ValueTerms",
    "cispo_loss",
    "clip_cov_loss",
    "clipped_surrogate",
    "evaluate",
    "gmpo_loss",
    "grpo_loss",
    "gspo_loss",
    "gspo_token_loss",
    "kl_cov_loss",
    "masked_constant",
    "policy_metrics",
    "policy_terms",
    "ppo_loss",
    "reduce_loss",
    "register_policy_loss",
    "sapo_loss",
    "unregister_policy_loss",
    "value_loss",
    "value_metrics",
]
