"""Ratio statistics: the objective's own clipped ratio (ratio_mean/min/max) and the two
objective-independent means every arm logs (ratio_seq_mean, ratio_token_mean)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor

from contract import metrics as M
from tests.learner.objective_inputs import (
    NAMES,
    layout,
    opts,
    run,
)

# Rows l = (0.2, 0.0), (-0.3, 0.0, 0.0) and an empty row, against old logprobs 0:
#   per-token r = e^0.2 = 1.221402758, 1; e^-0.3 = 0.740818221, 1, 1
#   sequence s_0 = e^(0.2 / 2) = 1.105170918, s_1 = e^(-0.3 / 3) = 0.904837418
SEQ_MEAN = 1.005004168  # (1.105170918 + 0.904837418) / 2; the empty row does not count
TOKEN_MEAN = 0.992444196  # (1.221402758 + 1 + 0.740818221 + 1 + 1) / 5 = 4.962220979 / 5
OWN_UNITS = {
    # GSPO clips s_i: mean over the 2 non-empty sequences, extremes s_1 and s_0.
    "gspo": (SEQ_MEAN, 0.904837418, 1.105170918),
    # GSPO-token clips s_i,t = s_i on each token: (2 * 1.105170918 + 3 * 0.904837418) / 5.
    "gspo_token": (0.984970818, 0.904837418, 1.105170918),
    # GRPO and PPO clip r_t: token mean, extremes e^-0.3 and e^0.2.
    "grpo": (TOKEN_MEAN, 0.740818221, 1.221402758),
    "ppo": (TOKEN_MEAN, 0.740818221, 1.221402758),
}


def _stats(name: str, lp: Tensor, mask: Tensor) -> dict[str, float]:
    old = torch.where(mask, 0.0, 3.0)
    adv = torch.where(mask, 1.0, 0.0) if name == "ppo" else torch.ones(mask.shape[0])
    return run(name, lp, old, adv, mask, opts(name))[1]


@pytest.mark.parametrize("name", NAMES)
def test_hand_worked_ratio_statistics(name: str) -> None:
    lp, mask = layout([[0.2, 0.0], [-0.3, 0.0, 0.0], []])
    stats = _stats(name, lp, mask)
    assert stats[M.POLICY_RATIO_SEQ_MEAN] == pytest.approx(SEQ_MEAN, rel=1e-6)
    assert stats[M.POLICY_RATIO_TOKEN_MEAN] == pytest.approx(TOKEN_MEAN, rel=1e-6)
    mean, low, high = OWN_UNITS[name]
    assert stats[M.POLICY_RATIO_MEAN] == pytest.approx(mean, rel=1e-6)
    assert stats[M.POLICY_RATIO_MIN] == pytest.approx(low, rel=1e-6)
    assert stats[M.POLICY_RATIO_MAX] == pytest.approx(high, rel=1e-6)


@pytest.mark.parametrize("name", NAMES)
def test_sequence_mean_weighs_sequences_token_mean_weighs_tokens(name: str) -> None:
    # One 1-token row with r = 2 and one 3-token row with r = 1:
    #   sequences: (2 + 1) / 2 = 1.5;  tokens: (2 + 1 + 1 + 1) / 4 = 1.25
    lp, mask = layout([[math.log(2.0)], [0.0, 0.0, 0.0]])
    stats = _stats(name, lp, mask)
    assert stats[M.POLICY_RATIO_SEQ_MEAN] == pytest.approx(1.5, rel=1e-6)
    assert stats[M.POLICY_RATIO_TOKEN_MEAN] == pytest.approx(1.25, rel=1e-6)


def test_sequence_ratio_is_the_geometric_mean_of_token_ratios() -> None:
    # One row r = (1.5, 0.5, 1.1, 1): s = (1.5 * 0.5 * 1.1 * 1)^(1/4) = 0.825^0.25 = 0.953045175,
    # below the token mean 1.025 (AM >= GM).
    lp, mask = layout([[math.log(1.5), math.log(0.5), math.log(1.1), 0.0]])
    stats = _stats("grpo", lp, mask)
    assert stats[M.POLICY_RATIO_SEQ_MEAN] == pytest.approx(0.953045175, rel=1e-6)
    assert stats[M.POLICY_RATIO_TOKEN_MEAN] == pytest.approx(1.025, rel=1e-6)


def test_gspo_ratio_mean_is_the_sequence_mean_and_grpo_the_token_mean() -> None:
    gen = torch.Generator().manual_seed(7)
    rows = [(-2 * torch.rand(n, generator=gen)).tolist() for n in (5, 1, 12, 7)]
    lp, mask = layout(rows)
    lp = lp + torch.where(mask, 0.05 * torch.randn(lp.shape, generator=gen), 0.0)
    gspo, grpo = _stats("gspo", lp, mask), _stats("grpo", lp, mask)
    assert gspo[M.POLICY_RATIO_MEAN] == pytest.approx(gspo[M.POLICY_RATIO_SEQ_MEAN], rel=1e-6)
    assert grpo[M.POLICY_RATIO_MEAN] == grpo[M.POLICY_RATIO_TOKEN_MEAN]
    # Both means depend on the log-ratios alone, not on the objective.
    for name in ("gspo_token", "ppo", "gspo"):
        other = _stats(name, lp, mask)
        assert other[M.POLICY_RATIO_SEQ_MEAN] == pytest.approx(
            grpo[M.POLICY_RATIO_SEQ_MEAN], rel=1e-6
        )
        assert other[M.POLICY_RATIO_TOKEN_MEAN] == pytest.approx(
            grpo[M.POLICY_RATIO_TOKEN_MEAN], rel=1e-6
        )


def test_ratio_means_are_registered_metrics() -> None:
    for key in ("ratio_mean", "ratio_min", "ratio_max", "ratio_seq_mean", "ratio_token_mean"):
        assert f"policy/{key}" in M.ALL_METRICS
