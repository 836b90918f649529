"""Advantage estimators: group-relative (GRPO/GSPO) and GAE with whitening (PPO).

Conventions shared with the objectives: per-token tensors are right-padded [B, T] with a response
mask (1 on response tokens, 0 on prompt and padding); response tokens of a row are contiguous.
Standard deviations are *population* std (divide by n): defined for a group of one, and the same
convention in `group_advantages` and `whiten`.
"""

from __future__ import annotations

from typing import get_args

import torch
from torch import Tensor

from learner.algorithms.masking import masked_mean, masked_var
from learner.vocabulary import AdvantageNorm

# AdvantageNorm (learner.config): `std` = (r - mean) / (std + eps) (GRPO, Shao et al. 2024,
# sec. 4.1.2); `mean_only` = r - mean (Dr. GRPO, Liu et al. 2025, drops the std division that
# over-weights near-constant groups).

ADVANTAGE_NORMS: tuple[str, ...] = get_args(AdvantageNorm)

ADV_EPS = 1e-6
"""Added to the group std before dividing (design section 6)."""


def group_advantages(rewards: Tensor, group_size: int, norm: AdvantageNorm = "std") -> Tensor:
    """Group-relative advantages A_i = (r_i - mean_g r) / (std_g r + 1e-6), float32 [B].

    `rewards` [B] are ordered group by group (B = n_groups * group_size). std is the population
    std (divide by group_size). A group whose rewards are all equal (including a group of one)
    gets exactly zero advantage: it carries no learning signal, and rounding in the mean must not
    turn into a spurious +-1e-3 advantage after the division by eps.
    """
    if group_size <= 0 or rewards.ndim != 1 or rewards.numel() % group_size != 0:
        raise ValueError(
            f"rewards must be 1-D with a length divisible by group_size; got shape "
            f"{tuple(rewards.shape)} and group_size={group_size}. Flatten rewards group by group."
        )
    if norm not in ADVANTAGE_NORMS:
        raise ValueError(f"unknown advantage norm {norm!r}; choose one of {ADVANTAGE_NORMS}")
    grouped = rewards.float().view(-1, group_size)  # (n_groups, G)
    centred = grouped - grouped.mean(dim=1, keepdim=True)  # (n_groups, G)
    if norm == "std":
        std = grouped.std(dim=1, correction=0, keepdim=True)  # (n_groups, 1) population std
        centred = centred / (std + ADV_EPS)
    constant = grouped.amax(dim=1, keepdim=True) == grouped.amin(dim=1, keepdim=True)
    return torch.where(constant, 0.0, centred).view(-1)  # (B,)


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
