"""Group-relative advantages, terminal rewards, GAE and whitening against hand-worked values."""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor

from learner.algorithms.advantages import gae, group_advantages, terminal_token_rewards, whiten


def test_group_advantages_std_default_is_bessel_corrected() -> None:
    rewards = torch.tensor([1.0, 0, 0, 1, 2, 2, 2, 2, 0, 1, 2, 3])
    adv = group_advantages(rewards, group_size=4)
    # Group (1, 0, 0, 1): mean 0.5, unbiased std sqrt(1 / 3) = 0.577350269
    #   -> +-0.5 / 0.577351269 = +-0.866024
    # Group (2, 2, 2, 2): constant -> exactly 0
    # Group (0, 1, 2, 3): mean 1.5, unbiased std sqrt(5 / 3) = 1.290994449
    #   -> (-1.5, -0.5, 0.5, 1.5) / 1.290995449 = (-1.161894, -0.387298, 0.387298, 1.161894)
    expected = [0.8660239, -0.8660239, -0.8660239, 0.8660239, 0, 0, 0, 0]
    expected += [-1.1618941, -0.3872980, 0.3872980, 1.1618941]
    assert adv.dtype == torch.float32
    assert adv.tolist() == pytest.approx(expected, rel=1e-6)
    assert adv[4:8].tolist() == [0.0, 0.0, 0.0, 0.0]


def test_group_advantages_population_std_on_request() -> None:
    rewards = torch.tensor([1.0, 0, 0, 1, 2, 2, 2, 2, 0, 1, 2, 3])
    adv = group_advantages(rewards, group_size=4, std="population")
    # Group (1, 0, 0, 1): mean 0.5, population std 0.5 -> +-0.5 / (0.5 + 1e-6) = +-0.999998
    # Group (2, 2, 2, 2): constant -> exactly 0
    # Group (0, 1, 2, 3): mean 1.5, population std sqrt(1.25) = 1.118033989
    #   -> (-1.5, -0.5, 0.5, 1.5) / 1.118034989 = (-1.341640, -0.447213, 0.447213, 1.341640)
    expected = [0.999998, -0.999998, -0.999998, 0.999998, 0, 0, 0, 0]
    expected += [-1.3416395865, -0.4472131955, 0.4472131955, 1.3416395865]
    assert adv.dtype == torch.float32
    assert adv.tolist() == pytest.approx(expected, rel=1e-6)
    assert adv[4:8].tolist() == [0.0, 0.0, 0.0, 0.0]


def test_group_advantages_mean_only() -> None:
    adv = group_advantages(torch.tensor([1.0, 0, 0, 1, 0, 1, 2, 3]), 4, norm="mean_only")
    assert adv.tolist() == pytest.approx([0.5, -0.5, -0.5, 0.5, -1.5, -0.5, 0.5, 1.5], rel=1e-6)


@pytest.mark.parametrize("std", ["unbiased", "population"])
@pytest.mark.parametrize("norm", ["std", "mean_only"])
def test_constant_groups_are_exactly_zero_never_nan(norm: str, std: str) -> None:
    # 0.1 is not a float32 binary fraction: a rounded mean would leave ~1e-9 that the 1e-6
    # epsilon would blow up to ~1e-3 without the explicit constant-group rule.
    rewards = torch.tensor([0.1] * 6 + [0.7] * 3 + [-2.3] * 3)
    adv = group_advantages(rewards, 3, norm=norm, std=std)  # type: ignore[arg-type]
    assert adv.tolist() == [0.0] * 12


@pytest.mark.parametrize("std", ["unbiased", "population"])
def test_group_of_one_gives_zero_advantage(std: str) -> None:
    adv = group_advantages(torch.tensor([1.0, 0.0, 5.0]), group_size=1, std=std)  # type: ignore[arg-type]
    assert adv.tolist() == [0.0, 0.0, 0.0]


def test_group_advantages_rejects_bad_shapes() -> None:
    with pytest.raises(ValueError, match="divisible by group_size"):
        group_advantages(torch.zeros(5), group_size=2)
    with pytest.raises(ValueError, match="unknown advantage norm"):
        group_advantages(torch.zeros(4), 2, norm="max")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown advantage std"):
        group_advantages(torch.zeros(4), 2, std="sample")  # type: ignore[arg-type]


def test_terminal_token_rewards_on_last_response_token() -> None:
    mask = torch.tensor([[0, 0, 1, 1, 1, 0], [0, 1, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0]]).bool()
    out = terminal_token_rewards(torch.tensor([2.0, -1.0, 7.0]), mask)
    assert out.tolist() == [[0, 0, 0, 0, 2.0, 0], [0, -1.0, 0, 0, 0, 0], [0] * 6]


# One row: 2 prompt slots, 3 response tokens with rewards (0, 0, 1) and values
# (0.5, 0.6, 0.7), then 2 padded slots. Junk (9.0, -4.0) sits on prompt and padding.
MASK = torch.tensor([[0, 0, 1, 1, 1, 0, 0]]).bool()
REWARDS = torch.tensor([[9.0, 9.0, 0.0, 0.0, 1.0, 9.0, 9.0]])
VALUES = torch.tensor([[-4.0, -4.0, 0.5, 0.6, 0.7, -4.0, -4.0]])


@pytest.mark.parametrize(
    ("gamma", "lam", "expected_adv"),
    [
        # (1, 1): Monte-Carlo, A_t = sum of future rewards - V_t = (1-0.5, 1-0.6, 1-0.7)
        (1.0, 1.0, [0.5, 0.4, 0.3]),
        # (1, 0.95): deltas (0.6-0.5, 0.7-0.6, 1-0.7) = (0.1, 0.1, 0.3)
        #   A2 = 0.3, A1 = 0.1 + 0.95*0.3 = 0.385, A0 = 0.1 + 0.95*0.385 = 0.46575
        (1.0, 0.95, [0.46575, 0.385, 0.3]),
        # (0.99, 0.95): deltas (0.99*0.6-0.5, 0.99*0.7-0.6, 1-0.7) = (0.094, 0.093, 0.3)
        #   A1 = 0.093 + 0.9405*0.3 = 0.37515, A0 = 0.094 + 0.9405*0.37515 = 0.446828575
        (0.99, 0.95, [0.446828575, 0.37515, 0.3]),
    ],
)
def test_gae_hand_computed(gamma: float, lam: float, expected_adv: list[float]) -> None:
    adv, returns = gae(REWARDS, VALUES, MASK, gamma, lam)
    assert adv[MASK].tolist() == pytest.approx(expected_adv, rel=1e-6)
    # returns = A + V on response tokens
    expected_returns = [a + v for a, v in zip(expected_adv, [0.5, 0.6, 0.7], strict=True)]
    assert returns[MASK].tolist() == pytest.approx(expected_returns, rel=1e-6)
    assert torch.all(adv[~MASK] == 0) and torch.all(returns[~MASK] == 0)


def _gae_reference(rewards: Tensor, values: Tensor, mask: Tensor, gamma: float, lam: float):
    """Plain python, one row and one response token at a time; next value 0 after the end."""
    adv = torch.zeros_like(rewards, dtype=torch.float64)
    for i in range(rewards.shape[0]):
        idx = mask[i].nonzero().flatten().tolist()
        running = 0.0
        for j in reversed(range(len(idx))):
            t = idx[j]
            next_value = float(values[i, idx[j + 1]]) if j + 1 < len(idx) else 0.0
            delta = float(rewards[i, t]) + gamma * next_value - float(values[i, t])
            running = delta + gamma * lam * running
            adv[i, t] = running
    return adv


@pytest.mark.parametrize(("gamma", "lam"), [(1.0, 1.0), (1.0, 0.95), (0.99, 0.95), (0.9, 0.0)])
def test_gae_vectorised_matches_python_loop(gamma: float, lam: float) -> None:
    gen = torch.Generator().manual_seed(0)
    rows, width = 6, 12
    prompt = torch.randint(0, 4, (rows, 1), generator=gen)
    length = torch.tensor([[0], [1], [8], [5], [3], [7]])
    pos = torch.arange(width)[None, :]
    mask = (pos >= prompt) & (pos < prompt + length)
    rewards = torch.randn(rows, width, generator=gen)
    values = torch.randn(rows, width, generator=gen)
    adv, returns = gae(rewards, values, mask, gamma, lam)
    ref = _gae_reference(rewards, values, mask, gamma, lam)
    torch.testing.assert_close(adv, ref.float(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(returns, torch.where(mask, ref.float() + values, 0.0))


def test_whiten_masked_population_std() -> None:
    x = torch.tensor([[5.0, 1.0, 2.0], [3.0, float("inf"), -8.0]])
    mask = torch.tensor([[0, 1, 1], [1, 0, 0]]).bool()
    # Masked values (1, 2, 3): mean 2, population std sqrt(2/3) = 0.816496581
    # -> (-1, 0, 1) / 0.816497581 = (-1.224743, 0, 1.224743)
    out = whiten(x, mask)
    assert out[mask].tolist() == pytest.approx([-1.2247433714, 0.0, 1.2247433714], rel=1e-6)
    assert torch.all(out[~mask] == 0)
    scaled = whiten(x, mask, shift_mean=False)  # (1, 2, 3) / 0.816497581
    assert scaled[mask].tolist() == pytest.approx([1.2247434, 2.4494867, 3.6742301], rel=1e-6)
    assert math.isfinite(whiten(x, torch.zeros_like(mask)).sum().item())
