"""Policy objectives as pure functions: GSPO, GSPO-token, GRPO, PPO, PPO's value loss, and
CISPO, SAPO, GMPO, Clip-Cov and KL-Cov (one module each: `cispo`, `sapo`, `gmpo`, `covariance`).

Every policy objective is a `PolicyLoss`: it takes right-padded [B, T] tensors, a response
`mask` (1 on response tokens, 0 on prompt and padding) and one `ObjectiveOptions` value, and
returns `(loss, stats)`: a float32 scalar with a grad graph and a dict of python floats computed
under no_grad. Which objective an arm trains, with which defaults, advantages and critic, is
declared once per objective by its arm model (`learner.config.arms`); `POLICY_LOSSES` maps each
objective name to its loss.

Stats keys (mapped to `policy/<key>` by the learner, design section 7): loss, clip_frac,
clip_frac_seq, clip_frac_low, clip_frac_high, ratio_mean, ratio_min, ratio_max, ratio_seq_mean,
ratio_token_mean, kl_old, and kl_ref when `ref_logprobs` is given. The two kinds of ratio
statistics are defined in `learner.algorithms.objectives.stats`.

"Clipped" means the clip is active in the min, i.e. the token's (or sequence's) gradient is zero:
A > 0 and ratio > 1 + eps_high (clip high), or A < 0 and ratio < 1 - eps_low (clip low).
clip_frac, clip_frac_low and clip_frac_high are token-weighted (so low + high = clip_frac) for
every objective; clip_frac_seq is the fraction of non-empty sequences with any clipped token.
Objectives without a hard clip flag the tokens their own mechanism acts on, as each docstring
says: CISPO a truncated IS weight (gradient capped, not zeroed), SAPO a gate weight below 1/2,
GMPO a token clipped in log space (gradient zero), Clip-Cov its PPO clip only (not the tokens
it selects by covariance, which it cuts at any ratio); KL-Cov clips nothing (its penalised
tokens are a fixed share; see `covariance.kl_cov_loss`).

Numerics: any float dtype is computed in float32; padded slots are replaced by 0 before any
arithmetic, so values parked there (even inf) change nothing; log-ratios are clamped to [-20, 20]
before exp; empty rows add nothing and a batch without response tokens gives loss 0 (still
differentiable). In the policy objectives only `logprobs` receives gradients; every other
tensor (old and reference logprobs, advantages, IS weights) is treated as a constant.

Parts of a minibatch (micro-batches, data-parallel ranks): every loss, `value_loss` included,
takes `totals=LossTotals(...)`, the whole minibatch's token and sequence counts, and divides by
them instead of its rows' own, so the parts' losses and gradients sum to the minibatch's;
Clip-Cov and KL-Cov also take their token selection made on the whole minibatch (`selected`,
see `PolicyLoss`).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import get_args

from learner.algorithms.masking import LOSS_AGGREGATIONS, LossAggregation, LossTotals
from learner.algorithms.objectives.cispo import cispo_loss
from learner.algorithms.objectives.covariance import clip_cov_loss, kl_cov_loss
from learner.algorithms.objectives.gmpo import gmpo_loss
from learner.algorithms.objectives.inputs import PolicyLoss, Stats
from learner.algorithms.objectives.policy import grpo_loss, gspo_loss, gspo_token_loss, ppo_loss
from learner.algorithms.objectives.sapo import sapo_loss
from learner.algorithms.objectives.surrogate import clipped_surrogate
from learner.algorithms.objectives.value import value_loss
from learner.algorithms.options import ObjectiveOptions
from learner.vocabulary import Objective

_LOSSES: dict[str, PolicyLoss] = {
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
POLICY_LOSSES: Mapping[str, PolicyLoss] = MappingProxyType(_LOSSES)
"""Objective name -> its pure loss: the built-in ones (`learner.vocabulary.Objective`), then any
a plugin registered (`learner.plugins`). Read-only; `register_policy_loss` adds."""


def register_policy_loss(name: str, loss: PolicyLoss) -> None:
    """Add a plugin's loss under its objective name; a built-in or taken name is refused."""
    if name in _LOSSES and _LOSSES[name] is not loss:
        raise ValueError(f"objective {name!r} already has a loss ({_LOSSES[name].__name__})")
    _LOSSES[name] = loss


def unregister_policy_loss(name: str) -> None:
    """Drop a loss that failed its registration check (a plugin's only)."""
    if name not in get_args(Objective):
        _LOSSES.pop(name, None)


__all__ = [
    "LOSS_AGGREGATIONS",
    "POLICY_LOSSES",
    "LossAggregation",
    "LossTotals",
    "ObjectiveOptions",
    "PolicyLoss",
    "Stats",
    "cispo_loss",
    "clip_cov_loss",
    "clipped_surrogate",
    "gmpo_loss",
    "grpo_loss",
    "gspo_loss",
    "gspo_token_loss",
    "kl_cov_loss",
    "ppo_loss",
    "register_policy_loss",
    "sapo_loss",
    "unregister_policy_loss",
    "value_loss",
]
