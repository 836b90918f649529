"""Policy objectives as pure functions: GSPO, GSPO-token, GRPO, PPO, and PPO's value loss.

Every function takes right-padded [B, T] tensors and a response `mask` (1 on response tokens, 0 on
prompt and padding) and returns `(loss, stats)`: a float32 scalar with a grad graph and a dict of
python floats computed under no_grad. Stats keys (mapped to `policy/<key>` by the learner, design
section 7): loss, clip_frac, clip_frac_seq, clip_frac_low, clip_frac_high, ratio_mean, ratio_min,
ratio_max, kl_old, and kl_ref when `ref_logprobs` is given.

"Clipped" means the clip is active in the min, i.e. the token's (or sequence's) gradient is zero:
A > 0 and ratio > 1 + eps_high (clip high), or A < 0 and ratio < 1 - eps_low (clip low).
clip_frac, clip_frac_low and clip_frac_high are token-weighted (so low + high = clip_frac) for
every objective; clip_frac_seq is the fraction of non-empty sequences with any clipped token.

Numerics: any float dtype is computed in float32; padded slots are replaced by 0 before any
arithmetic, so values parked there (even inf) change nothing; log-ratios are clamped to [-20, 20]
before exp; empty rows add nothing and a batch without response tokens gives loss 0 (still
differentiable). In the policy objectives only `logprobs` receives gradients; every other
tensor (old and reference logprobs, advantages, IS weights) is treated as a constant.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from learner.config import Objective
from learner.kl import LOG_RATIO_CLAMP, KLEstimator, kl_from_log_ratio
from learner.masking import (
    LOSS_AGGREGATIONS,
    LossAggregation,
    aggregate_padded,
    check_aggregation,
    masked_mean,
    masked_var,
)

__all__ = [
    "LOSS_AGGREGATIONS",
    "OBJECTIVES",
    "LossAggregation",
    "Objective",
    "clipped_surrogate",
    "grpo_loss",
    "gspo_loss",
    "gspo_token_loss",
    "ppo_loss",
    "value_loss",
]


Stats = dict[str, float]


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


def _prepare(logprobs: Tensor, old_logprobs: Tensor, mask: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Check shapes; return (log_ratio, bool mask, lengths [B]).

    l_t = log pi_theta(y_t) - log pi_old(y_t) in float32 and exactly 0 off the mask, so every
    later per-token term is 0 there and plain sums are masked sums.
    """
    if logprobs.shape != old_logprobs.shape or logprobs.shape != mask.shape or logprobs.ndim != 2:
        raise ValueError(
            f"logprobs, old_logprobs and mask must share one [B, T] shape; got "
            f"{tuple(logprobs.shape)}, {tuple(old_logprobs.shape)}, {tuple(mask.shape)}"
        )
    mask = mask.bool()
    log_ratio = torch.where(mask, logprobs.float() - old_logprobs.detach().float(), 0.0)
    return log_ratio, mask, mask.sum(-1)


def _masked_constant(x: Tensor, mask: Tensor, name: str) -> Tensor:
    """A [B] or [B, T] constant as float32 [B, T], 0 off the mask (so never counted as clipped)."""
    if x.shape == mask.shape[:1]:
        x = x[:, None]  # (B, 1)
    elif x.shape != mask.shape:
        raise ValueError(f"{name} must be [B] or [B, T] = {tuple(mask.shape)}; got {x.shape}")
    return torch.where(mask, x.detach().float(), 0.0)  # (B, T)


def _kl_ref_term(
    logprobs: Tensor,
    ref_logprobs: Tensor | None,
    *,
    mask: Tensor,
    lengths: Tensor,
    beta: float,
    kind: KLEstimator,
    agg: LossAggregation,
    max_len: int | None,
) -> tuple[Tensor | None, Tensor | None]:
    """(beta * aggregated KL(pi_theta || pi_ref) or None, token-mean KL for stats or None).

    The penalty of GRPO (Shao et al. 2024, eq. 4). Tokens are sampled from the policy being
    trained, so per token log r = log pi_ref - log pi_theta (`learner.kl.kl`). The KL is measured
    whenever ref_logprobs are given, even with beta = 0.
    """
    if ref_logprobs is None:
        if beta != 0.0:
            raise ValueError(f"beta={beta} needs ref_logprobs; pass them or set beta=0.0")
        return None, None
    with torch.set_grad_enabled(beta != 0.0 and torch.is_grad_enabled()):
        log_r = torch.where(mask, ref_logprobs.detach().float() - logprobs.float(), 0.0)
        kl_t = kl_from_log_ratio(log_r, kind)  # (B, T)  0 off the mask
    kl_ref = kl_t.detach().sum() / lengths.sum().clamp_min(1)
    if beta == 0.0:
        return None, kl_ref
    return beta * aggregate_padded(kl_t, lengths, agg, max_len), kl_ref


def _pack(**values: Tensor) -> Stats:
    """0-dim tensors -> python floats in one device-to-host copy (one sync on GPU)."""
    floats = torch.stack([v.float() for v in values.values()]).tolist()
    return dict(zip(values, floats, strict=True))


@torch.no_grad()
def _policy_stats(
    loss: Tensor,
    log_ratio: Tensor,
    *,
    ratio_is_token_ratio: bool,
    lengths: Tensor,
    ratio: Tensor,
    clipped: Tensor,
    ratio_mask: Tensor,
    weight: Tensor | None,
    kl_ref: Tensor | None,
) -> Stats:
    """Diagnostics shared by all policy objectives, from the clipped unit's own outputs.

    `ratio` and `clipped` (float 0/1) come from the clipped unit ([B, T] per token or [B] per
    sequence); `ratio` is exactly 1 off `ratio_mask` (exp of a zeroed log-ratio), so plain sums
    of r - 1 are masked sums. `weight` [B] counts the tokens each entry stands for (GSPO: |y_i|;
    None: 1). kl_old is k3 of KL(pi_old || pi_theta) per token, r_t - 1 - l_t (CleanRL's
    approx_kl); `ratio_is_token_ratio` says `ratio` already is r_t = exp(l_t), saving an exp.
    kl_ref is added when the reference policy was given.
    """
    n_tokens = lengths.sum().clamp_min(1)
    if weight is not None:
        clipped = clipped * weight
    clipped_per_row = clipped.reshape(lengths.shape[0], -1).sum(-1)  # (B,)
    n_clipped = clipped_per_row.sum()
    ratio_minus_one = ratio - 1.0  # 0 off the mask
    # Clipped entries have r < 1 - eps_low (low) or r > 1 + eps_high (high), so the dot product
    # with sign(r - 1) counts high clips minus low clips.
    n_high_minus_low = torch.dot(clipped.flatten(), ratio_minus_one.sign().flatten())
    n_low = (n_clipped - n_high_minus_low) / 2
    # Token-level objectives have one ratio per response token; GSPO one per non-empty sequence.
    n_ratio = n_tokens if weight is None else ratio_mask.sum().clamp_min(1)
    ratio_mean = 1.0 + ratio_minus_one.sum() / n_ratio
    # The mean fills padding: it lies within [min, max], so one aminmax pass gives both.
    ratio_min, ratio_max = torch.where(ratio_mask, ratio, ratio_mean).aminmax()
    log_ratio = log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)  # as inside the clipped unit
    token_ratio_minus_one = ratio_minus_one if ratio_is_token_ratio else torch.expm1(log_ratio)
    optional = {} if kl_ref is None else {"kl_ref": kl_ref}
    return _pack(
        loss=loss.detach(),
        clip_frac=n_clipped / n_tokens,
        clip_frac_seq=(clipped_per_row > 0).sum() / (lengths > 0).sum().clamp_min(1),
        clip_frac_low=n_low / n_tokens,
        clip_frac_high=(n_clipped - n_low) / n_tokens,
        ratio_mean=ratio_mean,
        ratio_min=ratio_min,
        ratio_max=ratio_max,
        kl_old=(token_ratio_minus_one - log_ratio).sum() / n_tokens,  # 0 off the mask
        **optional,
    )


def gspo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    eps_low: float = 3e-4,
    eps_high: float = 4e-4,
    is_weights: Tensor | None = None,
    ref_logprobs: Tensor | None = None,
    beta: float = 0.0,
    kl_estimator: KLEstimator = "k3",
) -> tuple[Tensor, Stats]:
    """GSPO: sequence-level, length-normalised importance ratio (Zheng et al. 2025, eq. 5-7).

        s_i = exp( (1/|y_i|) sum_t (log pi_theta(y_i,t) - log pi_old(y_i,t)) )
        J   = mean_i min( s_i A_i, clip(s_i, 1 - eps_low, 1 + eps_high) A_i ),   loss = -J

    advantages [B]; the mean is over non-empty sequences. `is_weights` [B, T] (truncated IS,
    constants) multiply each sequence's surrogate by the sequence's mean weight over its
    response tokens. The optional KL penalty uses seq-mean-token-mean. Clip flags are per
    sequence (clip_frac weights each by |y_i|); ratio_* are over non-empty sequences.
    """
    log_ratio, mask, lengths = _prepare(logprobs, old_logprobs, mask)
    if advantages.shape != lengths.shape:
        raise ValueError(f"gspo_loss needs advantages [B]; got {tuple(advantages.shape)}")
    nonempty = lengths > 0  # (B,)
    clamped = log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)  # the sum stays finite
    seq_log_ratio = clamped.sum(-1) / lengths.clamp_min(1)  # (B,)  log s_i
    seq_adv = torch.where(nonempty, advantages.detach().float(), 0.0)  # (B,)  empty rows: 0
    pg_loss, seq_ratio, clipped = clipped_surrogate(seq_log_ratio, seq_adv, eps_low, eps_high)
    if is_weights is not None:
        pg_loss = pg_loss * masked_mean(is_weights.detach().float(), mask, dim=-1)  # (B,)
    loss = pg_loss.sum() / nonempty.sum().clamp_min(1)
    kl_term, kl_ref = _kl_ref_term(
        logprobs, ref_logprobs, mask=mask, lengths=lengths, beta=beta, kind=kl_estimator,
        agg="seq-mean-token-mean", max_len=None,
    )  # fmt: skip
    if kl_term is not None:
        loss = loss + kl_term
    stats = _policy_stats(
        loss, log_ratio, ratio_is_token_ratio=False, lengths=lengths, ratio=seq_ratio,
        clipped=clipped, ratio_mask=nonempty, weight=lengths, kl_ref=kl_ref,
    )  # fmt: skip
    return loss, stats


def _token_objective(
    token_log_ratio: Tensor,
    log_ratio: Tensor,
    logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    lengths: Tensor,
    ratio_is_token_ratio: bool,
    eps_low: float,
    eps_high: float,
    agg: LossAggregation,
    max_len: int | None,
    is_weights: Tensor | None,
    ref_logprobs: Tensor | None,
    beta: float,
    kl_estimator: KLEstimator,
) -> tuple[Tensor, Stats]:
    """Shared tail of the token-level objectives: clipped surrogate, weights, KL, aggregation."""
    check_aggregation(agg, max_len)
    token_adv = _masked_constant(advantages, mask, "advantages")  # (B, T)
    pg_loss, ratio, clipped = clipped_surrogate(token_log_ratio, token_adv, eps_low, eps_high)
    if is_weights is not None:
        pg_loss = pg_loss * _masked_constant(is_weights, mask, "is_weights")  # (B, T)
    loss = aggregate_padded(pg_loss, lengths, agg, max_len)
    kl_term, kl_ref = _kl_ref_term(
        logprobs, ref_logprobs, mask=mask, lengths=lengths, beta=beta, kind=kl_estimator,
        agg=agg, max_len=max_len,
    )  # fmt: skip
    if kl_term is not None:
        loss = loss + kl_term
    stats = _policy_stats(
        loss, log_ratio, ratio_is_token_ratio=ratio_is_token_ratio, lengths=lengths, ratio=ratio,
        clipped=clipped, ratio_mask=mask, weight=None, kl_ref=kl_ref,
    )  # fmt: skip
    return loss, stats


def gspo_token_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    eps_low: float = 3e-4,
    eps_high: float = 4e-4,
    is_weights: Tensor | None = None,
    ref_logprobs: Tensor | None = None,
    beta: float = 0.0,
    kl_estimator: KLEstimator = "k3",
) -> tuple[Tensor, Stats]:
    """GSPO-token: per-token advantages with GSPO's sequence ratio (Zheng et al. 2025, eq. 13-14).

        s_i,t = sg[s_i] * pi_theta(y_i,t) / sg[pi_theta(y_i,t)]
        J     = mean_i (1/|y_i|) sum_t min( s_i,t A_i,t, clip(s_i,t, 1-eps_low, 1+eps_high) A_i,t )

    s_i,t equals s_i in value and has gradient s_i * grad log pi_theta(y_i,t), so with A_i,t = A_i
    value and gradient equal `gspo_loss`. advantages [B] or [B, T]. `is_weights` multiply each
    token's term: with weights the value still matches GSPO's, but each token's gradient follows
    its own weight rather than the sequence mean.
    """
    log_ratio, mask, lengths = _prepare(logprobs, old_logprobs, mask)
    clamped = log_ratio.detach().clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    seq_log_ratio = clamped.sum(-1) / lengths.clamp_min(1)  # (B,)  sg[log s_i]
    # log s_i,t = sg[log s_i] + log pi - sg[log pi]; l_t - sg[l_t] stands in for the last two
    # terms because pi_old is a constant. Its value is exactly 0, so s_i,t == s_i bit for bit.
    seq_log_ratio = torch.where(mask, seq_log_ratio[:, None], 0.0)  # (B, T)  0 off the mask
    token_log_ratio = seq_log_ratio + (log_ratio - log_ratio.detach())  # (B, T)
    return _token_objective(
        token_log_ratio, log_ratio, logprobs, advantages, mask, lengths=lengths,
        ratio_is_token_ratio=False, eps_low=eps_low, eps_high=eps_high,
        agg="seq-mean-token-mean", max_len=None, is_weights=is_weights,
        ref_logprobs=ref_logprobs, beta=beta, kl_estimator=kl_estimator,
    )  # fmt: skip


def grpo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    agg: LossAggregation = "seq-mean-token-mean",
    max_len: int | None = None,
    is_weights: Tensor | None = None,
    ref_logprobs: Tensor | None = None,
    beta: float = 0.0,
    kl_estimator: KLEstimator = "k3",
) -> tuple[Tensor, Stats]:
    """GRPO: per-token ratio and clip, group-relative advantages (Shao et al. 2024, eq. 3).

        r_t = exp(log pi_theta(y_t) - log pi_old(y_t))
        L_t = max(-A r_t, -A clip(r_t, 1 - eps_low, 1 + eps_high))

    aggregated by `agg` (see `LossAggregation`; `max_len` is required by Dr. GRPO's
    `seq-mean-token-sum-norm`). eps_high > eps_low is DAPO's clip-higher. advantages [B] or [B, T].
    """
    log_ratio, mask, lengths = _prepare(logprobs, old_logprobs, mask)
    return _token_objective(
        log_ratio, log_ratio, logprobs, advantages, mask, lengths=lengths,
        ratio_is_token_ratio=True, eps_low=eps_low, eps_high=eps_high, agg=agg, max_len=max_len,
        is_weights=is_weights, ref_logprobs=ref_logprobs, beta=beta, kl_estimator=kl_estimator,
    )  # fmt: skip


def ppo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    agg: LossAggregation = "token-mean",
    max_len: int | None = None,
    is_weights: Tensor | None = None,
    ref_logprobs: Tensor | None = None,
    beta: float = 0.0,
    kl_estimator: KLEstimator = "k3",
) -> tuple[Tensor, Stats]:
    """PPO policy loss with per-token advantages [B, T] from GAE (Schulman et al. 2017, eq. 7).

    The per-token clipped surrogate of `grpo_loss`, by default a token mean over the batch
    (CleanRL; PPO as usually run for LLMs). Whiten the advantages beforehand (`whiten`).
    """
    if advantages.shape != mask.shape:
        raise ValueError(f"ppo_loss needs per-token advantages [B, T]; got {advantages.shape}")
    return grpo_loss(
        logprobs, old_logprobs, advantages, mask, eps_low=eps_low, eps_high=eps_high,
        agg=agg, max_len=max_len, is_weights=is_weights,
        ref_logprobs=ref_logprobs, beta=beta, kl_estimator=kl_estimator,
    )  # fmt: skip


def value_loss(
    values: Tensor, old_values: Tensor, returns: Tensor, mask: Tensor, clip: float | None = 0.2
) -> tuple[Tensor, Stats]:
    """Clipped value loss (PPO2 baselines; CleanRL ppo.py), token mean over response tokens.

        V_clip = V_old + clip(V - V_old, -clip, clip)
        L      = 0.5 * mean_t max( (V - R)^2, (V_clip - R)^2 )

    `clip=None` gives the plain 0.5 * MSE. Stats: loss, clip_frac (tokens where the clipped error
    is the larger), explained_var = 1 - Var(R - V) / Var(R) of the current values (0 when
    Var(R) = 0), value_mean, return_mean.
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
    loss = 0.5 * masked_mean(v_loss_max, mask)
    with torch.no_grad():
        var_returns = masked_var(returns, mask)
        var_residual = masked_var(returns - values, mask)
        stats = _pack(
            loss=loss.detach(),
            clip_frac=masked_mean((v_loss_max > v_loss_unclipped).float(), mask),
            explained_var=torch.where(var_returns > 0, 1 - var_residual / var_returns, 0.0),
            value_mean=masked_mean(values, mask),
            return_mean=masked_mean(returns, mask),
        )
    return loss, stats


OBJECTIVES: dict[str, Callable[..., tuple[Tensor, Stats]]] = {
    "gspo": gspo_loss,
    "gspo_token": gspo_token_loss,
    "grpo": grpo_loss,
    "ppo": ppo_loss,
}
"""Arm name -> objective. All take (logprobs, old_logprobs, advantages, mask) positionally and
options by keyword; `agg`/`max_len` exist only on grpo/ppo (GSPO's aggregation is fixed)."""
