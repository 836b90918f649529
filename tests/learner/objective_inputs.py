"""Inputs shared by the objective tests: batches laid out like the learner's, and settings.

Batches hold `prompt` prompt slots (mask 0), the response, then right padding (mask 0). Prompt
and padding slots hold junk so any leak shows up in the values.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from contract import metrics as M
from learner.algorithms.objectives import (
    POLICY_LOSSES,
    POLICY_METRICS,
    PolicyBatch,
    PolicyObjective,
    evaluate,
    reduce_loss,
    value_loss,
    value_metrics,
)
from learner.config import ArmBase, make_arm

STAT_KEYS = set(POLICY_METRICS)
RATIO_METRICS = (
    M.POLICY_RATIO_MEAN,
    M.POLICY_RATIO_MIN,
    M.POLICY_RATIO_MAX,
    M.POLICY_RATIO_SEQ_MEAN,
    M.POLICY_RATIO_TOKEN_MEAN,
)
"""The ratio statistics: all 1 at identical policies."""
CLIP_METRICS = (
    M.POLICY_CLIP_FRAC,
    M.POLICY_CLIP_FRAC_SEQ,
    M.POLICY_CLIP_FRAC_LOW,
    M.POLICY_CLIP_FRAC_HIGH,
    M.POLICY_KL_OLD,
)
"""The clip fractions and kl_old: all 0 at identical policies."""
NAMES = ["gspo", "gspo_token", "grpo", "ppo"]

# Identical policies: lengths 3, 1, 4 (8 tokens, 3 sequences), A = (0.5, -1, 2).
ADV = [0.5, -1.0, 2.0]
LENGTHS = [3, 1, 4]


def loss_of(name: str) -> PolicyObjective:
    """The registered objective of a name."""
    return POLICY_LOSSES[name]


def opts(name: str, **overrides: Any) -> ArmBase:
    """The objective's default arm (registry clip range and aggregation), with `overrides`
    set as they are, unvalidated (the objectives read any value, e.g. a clip range of 50)."""
    return make_arm(name="t", objective=name).model_copy(update=overrides)


def run(  # noqa: PLR0917 (the order of the tensors a whole-minibatch call takes)
    objective: PolicyObjective | str,
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    settings: object,
    *,
    is_weights: Tensor | None = None,
    ref_logprobs: Tensor | None = None,
    max_len: int | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """(loss, metrics) of an objective on one whole minibatch: its one call, reduced."""
    objective = loss_of(objective) if isinstance(objective, str) else objective
    batch = PolicyBatch.of(
        logprobs, old_logprobs, advantages, mask, is_weights=is_weights, ref_logprobs=ref_logprobs
    )
    return evaluate(objective, batch, settings, max_len=max_len)


def run_value(
    values: Tensor, old_values: Tensor, returns: Tensor, mask: Tensor, clip: float | None = 0.2
) -> tuple[Tensor, dict[str, float]]:
    """(loss, metrics) of PPO's value loss on one whole minibatch."""
    terms = value_loss(values, old_values, returns, mask, clip)
    loss = reduce_loss(terms.loss, mask.bool().sum(-1))
    return loss, value_metrics(terms.stats, mask, loss)


def layout(
    rows: list[list[float]], prompt: int = 2, width: int | None = None, junk: float = -7.5
) -> tuple[Tensor, Tensor]:
    """Rows of response values -> (values [B, T] with junk off the response, bool mask [B, T])."""
    width = width or prompt + max(len(r) for r in rows) + 1
    values = torch.full((len(rows), width), junk)
    mask = torch.zeros(len(rows), width, dtype=torch.bool)
    for i, row in enumerate(rows):
        values[i, prompt : prompt + len(row)] = torch.tensor(row)
        mask[i, prompt : prompt + len(row)] = True
    return values, mask


def response(grad: Tensor, mask: Tensor) -> list[list[float]]:
    """Per-row values on the response tokens, for comparison with hand-worked lists."""
    return [grad[i][mask[i]].tolist() for i in range(grad.shape[0])]


def leaf(x: Tensor) -> Tensor:
    return x.clone().requires_grad_()


def assert_identical_policy_stats(stats: dict[str, float]) -> None:
    """The stats of any objective at identical policies: every standard key, every ratio
    statistic 1 and every clip fraction (and kl_old) 0."""
    assert set(stats) == STAT_KEYS
    for key in RATIO_METRICS:
        assert stats[key] == 1.0, key
    for key in CLIP_METRICS:
        assert stats[key] == 0.0, key


def identical_batch() -> tuple[Tensor, Tensor, Tensor]:
    """(logprobs, mask, advantages [B]) of rows of LENGTHS with advantages ADV."""
    gen = torch.Generator().manual_seed(0)
    rows = [(-3 * torch.rand(n, generator=gen)).tolist() for n in LENGTHS]
    lp, mask = layout(rows)
    return lp, mask, torch.tensor(ADV)
