"""Advantage estimators: sequence-level ones for group arms (group mean/std, RLOO, REINFORCE++,
REINFORCE++-baseline; `ADVANTAGE_ESTIMATORS`) and GAE with whitening (PPO).

Conventions shared with the objectives: per-token tensors are right-padded [B, T] with a response
mask (1 on response tokens, 0 on prompt and padding); response tokens of a row are contiguous.
The group std of `group_advantages` is Bessel-corrected by default (divide by G - 1: torch's
`std`, verl's `compute_grpo_outcome_advantage`, TRL's `GRPOTrainer`), the population std (divide
by G) on request (`adv_std`); the batch statistics of `batch_whiten` and `whiten` (REINFORCE++,
PPO) are population statistics, where verl's `masked_whiten` corrects the variance too (a
factor n / (n - 1) over thousands of tokens: negligible). Rewards [B] are ordered group by
group (B = n_groups * group_size); every sequence-level estimator returns float32 [B].
"""

from __future__ import annotations

from typing import Protocol, get_args

import torch
from torch import Tensor

from learner.algorithms.masking import masked_mean, masked_var
from learner.vocabulary import AdvantageEstimator, AdvantageNorm, AdvantageStd

# AdvantageNorm (learner.config): `std` = (r - mean) / (std + eps) (GRPO, Shao et al. 2024,
# sec. 4.1.2); `mean_only` = r - mean (Dr. GRPO, Liu et al. 2025, drops the std division that
# over-weights near-constant groups).

ADVANTAGE_NORMS: tuple[str, ...] = get_args(AdvantageNorm)
ADVANTAGE_STDS: tuple[str, ...] = get_args(AdvantageStd)
STD_CORRECTION: dict[str, int] = {"unbiased": 1, "population": 0}
"""`AdvantageStd` -> torch's `correction` (subtracted from n in the variance's denominator)."""

ADV_EPS = 1e-6
"""Added to a std before dividing by it: the group std (design section 6), the batch std of
REINFORCE++ and PPO's whitening."""


def _grouped(rewards: Tensor, group_size: int) -> Tensor:
    """Rewards [B] as float32 (n_groups, G), after checking that they split into whole groups."""
    if group_size <= 0 or rewards.ndim != 1 or rewards.numel() % group_size != 0:
        raise ValueError(
            f"rewards must be 1-D with a length divisible by group_size; got shape "
            f"{tuple(rewards.shape)} and group_size={group_size}. Flatten rewards group by group."
        )
    return rewards.float().view(-1, group_size)  # (n_groups, G)


def _constant_groups(grouped: Tensor) -> Tensor:
    """(n_groups, 1) True where every reward of the group is equal (a group of one included):
    such a group carries no learning signal, and its advantage is set to exactly 0 so that rounding
    in a mean never turns into a spurious +-1e-3 after a division by eps."""
    return grouped.amax(dim=1, keepdim=True) == grouped.amin(dim=1, keepdim=True)


def group_advantages(
    rewards: Tensor,
    group_size: int,
    norm: AdvantageNorm = "std",
    std: AdvantageStd = "unbiased",
) -> Tensor:
    """Group-relative advantages A_i = (r_i - mean_g r) / (std_g r + 1e-6), float32 [B].

    `norm="mean_only"` drops the division (Dr. GRPO). `std`: the Bessel-corrected group std
    (divide by group_size - 1), as verl and TRL, or the population std (divide by group_size).
    A group whose rewards are all equal gets exactly zero advantage, a group of one included
    (verl gives it r / (1 + 1e-6): mean 0, std 1; here it carries no signal).
    """
    grouped = _grouped(rewards, group_size)  # (n_groups, G)
    if norm not in ADVANTAGE_NORMS:
        raise ValueError(f"unknown advantage norm {norm!r}; choose one of {ADVANTAGE_NORMS}")
    if std not in ADVANTAGE_STDS:
        raise ValueError(f"unknown advantage std {std!r}; choose one of {ADVANTAGE_STDS}")
    centred = grouped - grouped.mean(dim=1, keepdim=True)  # (n_groups, G)
    if norm == "std" and group_size > 1:  # a group of one is constant: 0 below, never 0 / 0
        spread = grouped.std(dim=1, correction=STD_CORRECTION[std], keepdim=True)  # (n_groups, 1)
        centred = centred / (spread + ADV_EPS)
    return torch.where(_constant_groups(grouped), 0.0, centred).view(-1)  # (B,)


def rloo_advantages(rewards: Tensor, group_size: int) -> Tensor:
    """REINFORCE leave-one-out: A_i = r_i - 1/(G-1) sum_{j != i} r_j over i's group, float32 [B].

    Kool et al. 2019 ("Buy 4 REINFORCE samples, get a baseline for free!"); Ahmadian et al.
    2024 ("Back to Basics", arXiv:2402.14740). The baseline of sample i is the mean of the *other*
    G - 1 rewards of its group, so it does not depend on r_i and the gradient stays unbiased.
    Algebraically A_i = G / (G - 1) * (r_i - mean_g r): Dr. GRPO's mean-only advantage scaled
    up, no std division. A group whose rewards are all equal gets exactly 0, and so does a group
    of one, which has no other sample to form a baseline from (verl keeps r_i there).
    """
    grouped = _grouped(rewards, group_size)  # (n_groups, G)
    if group_size == 1:
        return torch.zeros_like(grouped).view(-1)  # (B,)
    others_mean = (grouped.sum(dim=1, keepdim=True) - grouped) / (group_size - 1)  # (n_groups, G)
    advantages = grouped - others_mean  # (n_groups, G)
    return torch.where(_constant_groups(grouped), 0.0, advantages).view(-1)  # (B,)


def batch_whiten(x: Tensor, lengths: Tensor, shift_mean: bool = True) -> Tensor:
    """Sequence values [B] whitened over the batch's response tokens: (x_i - mean) / (std + 1e-6).

    Each sequence counts once per response token (`lengths` [B], its response length): the
    statistics are those of x broadcast over the response mask, as `whiten` would take them on
    [B, T], while the result stays one value per sequence. `shift_mean=False` only divides by the
    std (the std itself is still taken around the token mean). Rows with no response token get 0,
    and so does every row when the non-empty rows all hold the same value (no learning signal;
    never NaN, never a rounding residue blown up by the division by eps).
    """
    if x.ndim != 1 or lengths.shape != x.shape:
        raise ValueError(
            f"x and lengths must both be [B]; got {tuple(x.shape)} and {tuple(lengths.shape)}"
        )
    x = x.float()
    weights = lengths.float()  # (B,) response tokens per sequence
    present = weights > 0  # (B,)
    total = weights.sum().clamp_min(1.0)  # all-empty batch: 0 / 1, never 0 / 0
    mean = (weights * x).sum() / total  # token mean
    std = ((weights * (x - mean) ** 2).sum() / total).sqrt()  # token population std
    whitened = ((x - mean) if shift_mean else x) / (std + ADV_EPS)  # (B,)
    highest = torch.where(present, x, -torch.inf).amax()
    lowest = torch.where(present, x, torch.inf).amin()
    informative = present & (highest != lowest)  # (B,)
    return torch.where(informative, whitened, 0.0)  # (B,)


def reinforce_pp_advantages(rewards: Tensor, lengths: Tensor) -> Tensor:
    """REINFORCE++ (Hu et al. 2025, arXiv:2501.03262): A_i = (r_i - mean_batch) / (std_batch + eps).

    With an outcome reward, gamma = 1 and no KL in the reward (this harness keeps the KL to the
    reference in the loss, `beta`), the return of every response token is its sequence's reward
    r_i. The paper normalises those token advantages over the whole global batch (global
    advantage normalisation, not per group); verl's `compute_reinforce_plus_plus_outcome_advantage`
    whitens them over every response token of the batch, so here a sequence weighs once per
    response token (`batch_whiten`). Differences from verl, both negligible at batch scale:
    population std with eps = 1e-6 added to the std (this repo's convention, as PPO's `whiten`),
    where verl uses the Bessel-corrected variance and rsqrt(var + 1e-8). Groups play no part, and
    `learner.gamma` (PPO's GAE discount) is not read: gamma = 1 keeps the advantage per sequence.
    """
    return batch_whiten(rewards, lengths, shift_mean=True)  # (B,)


def reinforce_pp_baseline_advantages(rewards: Tensor, group_size: int, lengths: Tensor) -> Tensor:
    """REINFORCE++-baseline (Hu et al. 2025, arXiv:2501.03262): A_i = (r_i - mean_g r) / std_batch.

    The group mean is the baseline (k > 1 samples per prompt); the group-centred rewards are then
    divided by their std over every response token of the batch (global, not per group), plus
    1e-6. The paper whitens, (A - mean_batch A) / std_batch A; per sequence the batch mean of
    group-centred rewards is exactly 0, so only the division is left, and it is all that is done
    here. Over tokens that mean is not 0 when lengths differ: verl's
    `compute_reinforce_plus_plus_baseline_outcome_advantage` re-centres on it, giving every
    constant group a small nonzero advantage -mean / std; here a group whose rewards are all
    equal keeps exactly 0. A group of one gets 0 (verl: its mean taken as 0, A = r / std).
    """
    centred = group_advantages(rewards, group_size, norm="mean_only")  # (B,) exact 0 if constant
    return batch_whiten(centred, lengths, shift_mean=False)  # (B,)


class SequenceAdvantages(Protocol):
    """One sequence-level estimator as the runtime calls it: float32 advantages [B] from the
    rewards [B], the response lengths [B] (tokens per sequence), the group size and the arm's
    `adv_norm` and `adv_std`, which only the `group` estimator reads."""

    def __call__(
        self,
        rewards: Tensor,
        lengths: Tensor,
        group_size: int,
        norm: AdvantageNorm,
        std: AdvantageStd,
    ) -> Tensor: ...


ADVANTAGE_ESTIMATORS: dict[AdvantageEstimator, SequenceAdvantages] = {
    "group": lambda rewards, lengths, group_size, norm, std: group_advantages(
        rewards, group_size, norm, std
    ),
    "rloo": lambda rewards, lengths, group_size, norm, std: rloo_advantages(rewards, group_size),
    "reinforce_pp": lambda rewards, lengths, group_size, norm, std: reinforce_pp_advantages(
        rewards, lengths
    ),
    "reinforce_pp_baseline": lambda rewards, lengths, group_size, norm, std: (
        reinforce_pp_baseline_advantages(rewards, group_size, lengths)
    ),
}
"""`learner.vocabulary.AdvantageEstimator` name -> its estimator: the one place a group arm's
`adv_estimator` is looked up (`learner.runtime.step.compute_advantages`)."""


def terminal_token_rewards(rewards: Tensor, mask: Tensor) -> Tensor:
    """Place each sequence's scalar reward on its last response token: [B] -> [B, T] float32.

    PPO's outcome reward arrives only at the end of the answer (design section 6); every other
    position gets 0. An empty response receives nothing (its row stays 0).
    """
    mask = mask.bool()
    positions = torch.arange(mask.shape[-1], device=mask.device)  # (T,)
    last = torch.where(mask, positions, -1).amax(dim=-1)  # (B,)  -1 for an empty row
    is_last = positions[None, :] == last[:, None]  # (B, T)
    return torch.where(is_last, rewards.float()[:, None], 0.0)  # (B, T)


def gae(
    token_rewards: Tensor, values: Tensor, mask: Tensor, gamma: float, lam: float
) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation (Schulman et al. 2016, eq. 11-16), batched.

        delta_t = r_t + gamma * V_{t+1} - V_t
        A_t     = delta_t + gamma * lam * A_{t+1}
        R_t     = A_t + V_t            (the value target, a lambda-return)

    V_{t+1} and A_{t+1} are 0 after the last response token (episode end), so values stored in
    padding never leak in. Inputs [B, T]; returns (advantages, returns), float32, 0 off the mask.
    """
    mask = mask.bool()
    rewards = torch.where(mask, token_rewards.float(), 0.0)  # (B, T)
    values = torch.where(mask, values.float(), 0.0)  # (B, T)  0 past the end = terminal
    advantages = torch.zeros_like(rewards)  # (B, T)
    next_value = rewards.new_zeros(rewards.shape[0])  # (B,)
    next_adv = rewards.new_zeros(rewards.shape[0])  # (B,)
    for t in reversed(range(rewards.shape[1])):
        delta = rewards[:, t] + gamma * next_value - values[:, t]  # (B,)
        # Off-mask positions restart the recursion, so prompt tokens never see the response.
        next_adv = torch.where(mask[:, t], delta + gamma * lam * next_adv, 0.0)
        next_value = values[:, t]
        advantages[:, t] = next_adv
    returns = torch.where(mask, advantages + values, 0.0)  # (B, T)
    return advantages, returns


def whiten(x: Tensor, mask: Tensor, shift_mean: bool = True) -> Tensor:
    """Masked whitening (x - mean) / (std + 1e-6) over response tokens; 0 off the mask.

    Mean and population std are taken over every masked token of the batch (PPO's advantage
    normalisation, Andrychowicz et al. 2021, "What matters in on-policy RL", C.3). With
    `shift_mean=False` only the scale changes (keeps the sign of every advantage).
    """
    x = x.float()
    mean = masked_mean(x, mask)
    std = masked_var(x, mask).sqrt()
    centred = x - mean if shift_mean else x
    return torch.where(mask.bool(), centred / (std + ADV_EPS), 0.0)
