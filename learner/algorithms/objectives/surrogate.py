"""The PPO-clip surrogate every policy objective shares, with a closed-form backward."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from learner.algorithms.kl import LOG_RATIO_CLAMP


class _ClippedSurrogate(torch.autograd.Function):
    """Elementwise PPO-clip loss of a log-ratio with its analytic gradient.

    Autograd through max/clamp/exp costs ~6 full-size passes in backward (ties, range masks);
    the closed form below is one multiply. dL/dl = -A r on the unclipped branch and 0 on the
    clipped one; for |l| > 20, r is evaluated at the clamp, so the gradient stays finite.
    Indicators are float 0/1 rather than bool: on CPU, bool tensors cost 3-5x a float op.
    """

    @staticmethod
    def forward(
        ctx: Any, log_ratio: Tensor, advantages: Tensor, eps_low: float, eps_high: float
    ) -> tuple[Tensor, Tensor, Tensor]:
        ratio = torch.exp(log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
        neg_advantages = -advantages
        pg_loss1 = neg_advantages * ratio  # also d pg_loss1 / d log_ratio, since dr/dl = r
        pg_loss2 = neg_advantages * ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
        # 1.0 where the clipped branch strictly wins the max (its gradient is zero), else 0.0.
        clipped = (pg_loss2 - pg_loss1).sign_().clamp_min_(0.0)
        ctx.save_for_backward(torch.addcmul(pg_loss1, pg_loss1, clipped, value=-1.0))
        ctx.mark_non_differentiable(ratio, clipped)
        ctx.set_materialize_grads(False)
        return torch.maximum(pg_loss1, pg_loss2), ratio, clipped

    @staticmethod
    def backward(
        ctx: Any, grad_loss: Tensor | None, *_: Tensor | None
    ) -> tuple[Tensor | None, None, None, None]:
        (dloss_dlog_ratio,) = ctx.saved_tensors  # -A r, or 0 where clipped
        grad = None if grad_loss is None else grad_loss * dloss_dlog_ratio
        return grad, None, None, None


def clipped_surrogate(
    log_ratio: Tensor, advantages: Tensor, eps_low: float, eps_high: float
) -> tuple[Tensor, Tensor, Tensor]:
    """PPO-clip per element (Schulman et al. 2017, eq. 7), as a loss to minimise:

        r = exp(l),   L = max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high))

    `advantages` must broadcast to `log_ratio` and are constants. Returns (L, r, clipped), shapes
    as `log_ratio`; `clipped` is 1.0 where the clipped branch strictly wins (gradient zero):
    A > 0 and r > 1 + eps_high (clip high) or A < 0 and r < 1 - eps_low (clip low).
    """
    return _ClippedSurrogate.apply(log_ratio, advantages.detach(), eps_low, eps_high)
