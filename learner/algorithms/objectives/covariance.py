"""Clip-Cov and KL-Cov: restrain the few tokens whose covariance drives entropy collapse.

Cui et al. 2025 (arXiv:2505.22617, sec. 4) show that under policy gradient the entropy change
follows the covariance of a token's log-probability and its advantage; a few high-covariance
tokens (confident and rewarded) collapse the entropy. Per response token of the batch:

    Cov_t = (log pi_theta(y_t) - mean log pi_theta) * (A_t - mean A)       (means over tokens)

Clip-Cov detaches the gradient of r N tokens drawn at random from those with
omega_low < Cov_t < omega_high; KL-Cov adds beta |log r_t| to the k N tokens of highest Cov_t.
Selection is deterministic: the same tensors give the same tokens (`choose_tokens`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from learner.algorithms.kl import LOG_RATIO_CLAMP
from learner.algorithms.masking import masked_mean
from learner.algorithms.objectives.inputs import PolicyBatch, masked_constant
from learner.algorithms.objectives.objective import PolicyObjective
from learner.algorithms.objectives.settings import ClipCovSettings, KLCovSettings
from learner.algorithms.objectives.surrogate import clipped_surrogate
from learner.algorithms.objectives.terms import PolicyTerms, policy_terms


@torch.no_grad()
def token_covariance(logprobs: Tensor, advantages: Tensor, mask: Tensor) -> Tensor:
    """Cov_t [B, T] of each response token (centred over the batch's response tokens); -inf off
    the mask, so padding is never selected."""
    logprobs = torch.where(mask, logprobs.detach().float(), 0.0)  # (B, T)
    centred_lp = logprobs - masked_mean(logprobs, mask)
    centred_adv = advantages - masked_mean(advantages, mask)
    return torch.where(mask, centred_lp * centred_adv, -torch.inf)  # (B, T)


def selection_count(fraction: float, n_tokens: int) -> int:
    """floor(fraction * N), at least 1 when fraction > 0 and N > 0 (the authors' rule)."""
    if fraction <= 0.0 or n_tokens == 0:
        return 0
    return max(1, int(fraction * n_tokens))


def choose_tokens(candidates: Tensor, count: int, keys: Tensor, mask: Tensor) -> Tensor:
    """`count` of the `candidates` [B, T] (bool, within the response `mask`) drawn uniformly
    without replacement, as a bool [B, T] mask; all of them when there are at most `count`.

    The draw is seeded by the candidates themselves, their ordinals among the response tokens and
    the bits of their `keys` (inputs such as log-probs, not reduced values, whose rounding could
    depend on the padded width), on a CPU generator: the same inputs choose the same tokens on
    any device and at any padding, different batches draw differently, and no global random
    state is touched.
    """
    flat = candidates.flatten().nonzero().squeeze(-1)  # (M,)  in response-token order
    if count < flat.numel():
        ordinals = mask.flatten().long().cumsum(0)[flat]  # (M,)  1-based, padding-free
        bits = keys.flatten()[flat].float().contiguous().view(torch.int32).long()
        seed = int(bits.sum() + ordinals.sum()) & (2**63 - 1)
        order = torch.randperm(flat.numel(), generator=torch.Generator().manual_seed(seed))
        flat = flat[order[:count].to(flat.device)]
    selected = torch.zeros(candidates.numel(), dtype=torch.bool, device=candidates.device)
    selected[flat] = True
    return selected.view_as(candidates)


def top_tokens(scores: Tensor, count: int) -> Tensor:
    """The `count` highest `scores` [B, T] as a bool mask; ties go to the earlier position."""
    order = torch.sort(scores.flatten(), descending=True, stable=True).indices[:count]
    selected = torch.zeros(scores.numel(), dtype=torch.bool, device=scores.device)
    selected[order] = True
    return selected.view_as(scores)


def _clip_cov_settings(settings: object) -> ClipCovSettings:
    if not isinstance(settings, ClipCovSettings):
        raise TypeError(f"clip_cov_loss needs ClipCovSettings; got {type(settings).__name__}")
    return settings


def clip_cov_selection(batch: PolicyBatch, settings: object) -> Tensor:
    """Clip-Cov's I over the batch's rows, bool [B, T]: r N tokens drawn from the tokens not
    PPO-clipped with omega_low < Cov_t < omega_high (`clip_cov_loss`). Covariance, N and the draw
    are of all the rows given, so a minibatch trained in parts selects on all of it
    (`PolicyObjective.selection`)."""
    settings = _clip_cov_settings(settings)
    mask = batch.mask
    token_adv = masked_constant(batch.advantages, mask, "advantages")  # (B, T)
    with torch.no_grad():
        _, _, clipped = clipped_surrogate(
            batch.log_ratio.detach(), token_adv, settings.eps_low, settings.eps_high
        )
    cov = token_covariance(batch.logprobs, token_adv, mask)  # (B, T)
    candidates = mask & (clipped == 0) & (cov > settings.cov_low) & (cov < settings.cov_high)
    count = selection_count(settings.clip_fraction, int(batch.lengths.sum()))
    return choose_tokens(candidates, count, batch.logprobs.detach(), mask)  # (B, T)


@PolicyObjective.selecting(clip_cov_selection)
def clip_cov_loss(batch: PolicyBatch, settings: ClipCovSettings) -> PolicyTerms:
    """Clip-Cov (Cui et al. 2025, sec. 4.3): PPO-clip with the gradient of a few tokens cut.

        L_t = max(-A_t r_t, -A_t clip(r_t, 1 - eps_low, 1 + eps_high))   for t not in I
        L_t = 0                                                           for t in I
        I   = r N tokens drawn from { t not clipped : omega_low < Cov_t < omega_high }

    one mean over the batch's N response tokens (token-mean, as the authors' DAPO recipes).
    advantages [B] or [B, T]; `is_weights` multiply each token's term. With no token selected
    (r = 0, or no candidate) it is GRPO's token-mean surrogate. `settings`: `ClipCovSettings`.

    Stats: clipped = PPO-clipped only, as GRPO's. The selected tokens (gradient zero too, about
    r of the tokens whenever there are candidates) are cut whatever their ratio, so counting them
    would break the sanity property that identical policies clip nothing (design section 6).
    """
    settings = _clip_cov_settings(settings)
    mask = batch.mask
    token_adv = masked_constant(batch.advantages, mask, "advantages")  # (B, T)
    pg_loss, ratio, clipped = clipped_surrogate(
        batch.log_ratio, token_adv, settings.eps_low, settings.eps_high
    )
    assert batch.selected is not None, "PolicyObjective fills it from clip_cov_selection"
    pg_loss = torch.where(batch.selected, 0.0, pg_loss)  # value and gradient 0 on I
    if batch.is_weights is not None:
        pg_loss = pg_loss * masked_constant(batch.is_weights, mask, "is_weights")
    return policy_terms(batch, settings, pg_loss, "token-mean", ratio=ratio, clipped=clipped)


def _kl_cov_settings(settings: object) -> KLCovSettings:
    if not isinstance(settings, KLCovSettings):
        raise TypeError(f"kl_cov_loss needs KLCovSettings; got {type(settings).__name__}")
    return settings


def kl_cov_selection(batch: PolicyBatch, settings: object) -> Tensor:
    """KL-Cov's I over the batch's rows, bool [B, T]: the k N tokens of highest Cov_t, none when
    beta = 0 (`kl_cov_loss`); of all the rows given, as `clip_cov_selection`."""
    settings = _kl_cov_settings(settings)
    token_adv = masked_constant(batch.advantages, batch.mask, "advantages")  # (B, T)
    cov = token_covariance(batch.logprobs, token_adv, batch.mask)  # (B, T)
    fraction = settings.kl_fraction if settings.kl_coef > 0 else 0.0  # beta 0: no penalty at all
    return top_tokens(cov, selection_count(fraction, int(batch.lengths.sum())))


@PolicyObjective.selecting(kl_cov_selection)
def kl_cov_loss(batch: PolicyBatch, settings: KLCovSettings) -> PolicyTerms:
    """KL-Cov (Cui et al. 2025, sec. 4.3): the unclipped surrogate, KL-penalised on a few tokens.

        L_t = -A_t r_t                               for t not in I
        L_t = -A_t r_t + beta |log r_t|              for t in I = the k N tokens of top Cov_t

    one mean over the batch's N response tokens (token-mean, as the authors' recipes). |log r_t|
    is the authors' per-token KL(pi_old || pi_theta); its gradient beta sign(log r_t) pulls the
    token back to pi_old (0 at r_t = 1). No clip range: eps_low/eps_high are unread. With no
    token selected (k = 0) or beta = 0 it is the plain policy-gradient surrogate. advantages [B]
    or [B, T]; `is_weights` multiply each token's term. `settings`: `KLCovSettings`.

    Stats: nothing is clipped (clip fractions 0). The penalised tokens are a share set by k, and
    |log r_t| is not smooth at 0: the penalty's gradient is a full beta sign(log r_t) even for an
    engine-rounding gap of 1e-7, so counting them would break the sanity property that identical
    policies clip nothing (design section 6). kl_old shows how far the ratios moved.
    """
    settings = _kl_cov_settings(settings)
    mask = batch.mask
    token_adv = masked_constant(batch.advantages, mask, "advantages")  # (B, T)
    log_ratio = batch.log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)  # (B, T)  0 off mask
    ratio = torch.exp(log_ratio)  # (B, T)
    assert batch.selected is not None, "PolicyObjective fills it from kl_cov_selection"
    penalty = torch.where(batch.selected, settings.kl_coef * log_ratio.abs(), 0.0)  # (B, T)
    pg_loss = -token_adv * ratio + penalty  # (B, T)  0 off the mask
    if batch.is_weights is not None:
        pg_loss = pg_loss * masked_constant(batch.is_weights, mask, "is_weights")
    none = torch.zeros_like(ratio.detach())  # (B, T)  nothing clipped
    return policy_terms(batch, settings, pg_loss, "token-mean", ratio=ratio, clipped=none)
