"""Inputs shared by the objective tests: batches laid out like the learner's, and options.

Batches hold `prompt` prompt slots (mask 0), the response, then right padding (mask 0). Prompt
and padding slots hold junk so any leak shows up in the values.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import Tensor

from learner.algorithms.objectives import POLICY_LOSSES, PolicyLoss
from learner.algorithms.options import ObjectiveOptions
from learner.config import default_options

STAT_KEYS = {"loss", "clip_frac", "clip_frac_seq", "clip_frac_low", "clip_frac_high", "kl_old"}
STAT_KEYS |= {"ratio_mean", "ratio_min", "ratio_max", "ratio_seq_mean", "ratio_token_mean"}
NAMES = ["gspo", "gspo_token", "grpo", "ppo"]

# Identical policies: lengths 3, 1, 4 (8 tokens, 3 sequences), A = (0.5, -1, 2).
ADV = [0.5, -1.0, 2.0]
LENGTHS = [3, 1, 4]


def loss_of(name: str) -> PolicyLoss:
    """The registered loss of an objective."""
    return POLICY_LOSSES[name]


def opts(name: str, **overrides: object) -> ObjectiveOptions:
    """The objective's default options (registry clip range and aggregation), overridden."""
    return replace(default_options(name), **overrides)


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


def identical_batch() -> tuple[Tensor, Tensor, Tensor]:
    """(logprobs, mask, advantages [B]) of rows of LENGTHS with advantages ADV."""
    gen = torch.Generator().manual_seed(0)
    rows = [(-3 * torch.rand(n, generator=gen)).tolist() for n in LENGTHS]
    lp, mask = layout(rows)
    return lp, mask, torch.tensor(ADV)
