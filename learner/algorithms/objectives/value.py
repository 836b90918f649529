"""PPO's clipped value loss, a pure function of tensors like the policy objectives."""

from __future__ import annotations

import torch
from torch import Tensor

from learner.algorithms.masking import LossTotals, masked_mean, masked_sum, masked_var
from learner.algorithms.objectives.inputs import Stats
from learner.algorithms.objectives.stats import pack


def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor,
    clip: float | None = 0.2,
    *,
    totals: LossTotals | None = None,
) -> tuple[Tensor, Stats]:
    """Clipped value loss (PPO2 baselines; CleanRL ppo.py), token mean over response tokens.

        V_clip = V_old + clip(V - V_old, -clip, clip)
        L      = 0.5 * mean_t max( (V - R)^2, (V_clip - R)^2 )

    `clip=None` gives the plain 0.5 * MSE. The mean divides by `totals.tokens`, the response
    tokens of the whole minibatch these rows are part of (micro-batches, data-parallel ranks;
    `learner.algorithms.masking.LossTotals`), None: these rows are the minibatch. Stats (of the
    rows passed): loss, clip_frac (tokens where the clipped error is the larger),
    explained_var = 1 - Var(R - V) / Var(R) of the current values (0 when Var(R) = 0),
    value_mean, return_mean.
    """
    mask = mask.bool()
    values = torch.where(mask, values.float(), 0.0)  # (B, T)
    old_values = torch.where(mask, old_values.detach().float(), 0.0)  # (B, T)
    returns = torch.where(mask, returns.detach().float(), 0.0)  # (B, T)
    v_loss_unclipped = (values - returns).square()  # (B, T)
    if clip is None:
        v_loss_max = v_loss_unclipped
    else:
        v_clipped = old_values + (values - old_values).clamp(-clip, clip)  # (B, T)
        v_loss_max = torch.maximum(v_loss_unclipped, (v_clipped - returns).square())
    if totals is None:
        loss = 0.5 * masked_mean(v_loss_max, mask)
    else:
        loss = 0.5 * (masked_sum(v_loss_max, mask) / totals.tokens.clamp_min(1))
    with torch.no_grad():
        var_returns = masked_var(returns, mask)
        var_residual = masked_var(returns - values, mask)
        stats = pack(
            loss=loss.detach(),
            clip_frac=masked_mean((v_loss_max > v_loss_unclipped).float(), mask),
            explained_var=torch.where(var_returns > 0, 1 - var_residual / var_returns, 0.0),
            value_mean=masked_mean(values, mask),
            return_mean=masked_mean(returns, mask),
        )
    return loss, stats
