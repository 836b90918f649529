"""PPO's clipped value loss, terms and stats like the policy objectives."""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from contract import metrics as M
from learner.algorithms.masking import masked_mean, masked_var
from learner.algorithms.objectives.stats import pack
from learner.algorithms.objectives.terms import LossTerms


class ValueStats(NamedTuple):
    """The rows' tensors the value metrics are computed from (`value_metrics`), no graph; each
    (B, T), float32, 0 off the mask: the current values V, the returns R, and 1.0 where the
    clipped error is the larger."""

    values: Tensor
    returns: Tensor
    clipped: Tensor


class ValueTerms(NamedTuple):
    """The value loss's terms (0.5 x token mean of the larger squared error) and stats."""

    loss: LossTerms
    stats: ValueStats

    def detach(self) -> ValueTerms:
        return ValueTerms(self.loss.detach(), self.stats)


def value_loss(
    values: Tensor, old_values: Tensor, returns: Tensor, mask: Tensor, clip: float | None = 0.2
) -> ValueTerms:
    """Clipped value loss (PPO2 baselines; CleanRL ppo.py), token mean over response tokens.

        V_clip = V_old + clip(V - V_old, -clip, clip)
        L      = 0.5 * mean_t max( (V - R)^2, (V_clip - R)^2 )

    `clip=None` gives the plain 0.5 * MSE. The terms are max(...) per token [B, T]; the
    reducer (`reduce_loss`) takes their token mean over the whole minibatch, times 0.5.
    """
    mask = mask.bool()
    values = torch.where(mask, values.float(), 0.0)  # (B, T)
    old_values = torch.where(mask, old_values.detach().float(), 0.0)  # (B, T)
    returns = torch.where(mask, returns.detach().float(), 0.0)  # (B, T)
    v_loss_unclipped = (values - returns).square()  # (B, T)
    if clip is None:
        v_loss_max = v_loss_unclipped
        clipped = torch.zeros_like(values)
    else:
        moved = values - old_values  # (B, T)
        v_clipped = old_values + moved.clamp(-clip, clip)  # (B, T)
        v_loss_max = torch.maximum(v_loss_unclipped, (v_clipped - returns).square())
        # A token is clipped when V left the trust region *and* the clipped error won. Inside
        # the region V_old + (V - V_old) can differ from V in the last bit, so the second test
        # alone counted rounding as clipping (and differently per micro-batch split).
        clipped = ((moved.abs() > clip) & (v_loss_max > v_loss_unclipped)).float().detach()
    stats = ValueStats(values.detach(), returns, clipped)
    return ValueTerms(LossTerms(v_loss_max, "token-mean", scale=0.5), stats)


@torch.no_grad()
def value_metrics(stats: ValueStats, mask: Tensor, loss: Tensor) -> dict[str, float]:
    """The value metrics of rows with response `mask` [B, T] and reduced `loss`: loss,
    clip_frac (tokens where the clipped error is the larger), explained_var =
    1 - Var(R - V) / Var(R) of the current values (0 when Var(R) = 0), value_mean, return_mean.
    """
    var_returns = masked_var(stats.returns, mask)
    var_residual = masked_var(stats.returns - stats.values, mask)
    return pack(
        {
            M.VALUE_LOSS: loss.detach(),
            M.VALUE_CLIP_FRAC: masked_mean(stats.clipped, mask),
            M.VALUE_EXPLAINED_VAR: torch.where(
                var_returns > 0, 1 - var_residual / var_returns, 0.0
            ),
            M.VALUE_MEAN: masked_mean(stats.values, mask),
            M.VALUE_RETURN_MEAN: masked_mean(stats.returns, mask),
        }
    )
