"""GRPO's group advantages against verl's `compute_grpo_outcome_advantage` (verl/trainer/ppo/
core_algos.py), restated below from its documented behaviour: per prompt index, the scores'
torch.mean and Bessel-corrected torch.std; (score - mean) / (std + epsilon) with
`norm_adv_by_std_in_grpo`, score - mean without; a prompt with one response gets mean 0, std 1.

The harness's default (`adv_std: unbiased`) must give verl's numbers on hand-made rewards, for
both normalisations and with constant groups in the batch. The two deliberate differences are
pinned too: a group of one (verl: r / (1 + eps); here 0, it has no baseline) and a constant
group whose mean rounds (verl: a residue divided by eps; here exactly 0).
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from learner.algorithms.advantages import group_advantages

EPSILON = 1e-6  # verl's default epsilon, the harness's ADV_EPS


def verl_grpo_outcome_advantage(scores: Tensor, index: list[int], norm_by_std: bool) -> Tensor:
    """verl's GRPO outcome advantage of one scalar score per response, [B] float32."""
    by_prompt: dict[int, list[Tensor]] = {}
    for score, prompt in zip(scores, index, strict=True):
        by_prompt.setdefault(prompt, []).append(score)
    mean: dict[int, Tensor] = {}
    std: dict[int, Tensor] = {}
    for prompt, group in by_prompt.items():
        if len(group) == 1:
            mean[prompt], std[prompt] = torch.tensor(0.0), torch.tensor(1.0)
        else:
            stacked = torch.stack(group)
            mean[prompt], std[prompt] = torch.mean(stacked), torch.std(stacked)
    out = scores.clone()
    for i, prompt in enumerate(index):
        centred = scores[i] - mean[prompt]
        out[i] = centred / (std[prompt] + EPSILON) if norm_by_std else centred
    return out


HAND_MADE = {
    # binary verifier rewards, G = 8: mixed, all wrong, all right, one right
    "binary_g8": ([1, 0, 0, 1, 1, 0, 1, 0] + [0] * 8 + [1] * 8 + [0, 0, 0, 0, 0, 0, 0, 1], 8),
    # graded rewards with a format bonus, G = 4, a constant group of 0.5 in the middle
    "graded_g4": ([0.0, 0.25, 1.0, 0.75, 0.5, 0.5, 0.5, 0.5, -1.0, 0.0, 2.0, 0.5], 4),
    # G = 2, where Bessel's correction matters most (sqrt 2)
    "pairs_g2": ([1, 0, 0, 0, 1, 1, 0.5, 1.5], 2),
    # G = 3, uneven values
    "triples_g3": ([3.0, -1.0, 0.25, 0.0, 0.0, 0.0, 7.5, 7.0, -2.0], 3),
}


@pytest.mark.parametrize("norm", ["std", "mean_only"])
@pytest.mark.parametrize("case", sorted(HAND_MADE))
def test_default_group_advantages_equal_verls(case: str, norm: str) -> None:
    values, group_size = HAND_MADE[case]
    scores = torch.tensor(values, dtype=torch.float32)
    index = [i // group_size for i in range(len(values))]
    ours = group_advantages(scores, group_size, norm=norm)  # type: ignore[arg-type]
    theirs = verl_grpo_outcome_advantage(scores, index, norm_by_std=norm == "std")
    assert ours.dtype == theirs.dtype == torch.float32
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-7)
    # Constant groups are 0 in both (their values are exact binary fractions, so verl's mean
    # of them is exact too).
    grouped = scores.view(-1, group_size)
    constant = (grouped.amax(1) == grouped.amin(1)).repeat_interleave(group_size)
    assert ours[constant].eq(0).all() and theirs[constant].eq(0).all()


def test_population_std_is_the_old_convention_and_differs_by_bessels_factor() -> None:
    values, group_size = HAND_MADE["binary_g8"]
    scores = torch.tensor(values, dtype=torch.float32)
    unbiased = group_advantages(scores, group_size)
    population = group_advantages(scores, group_size, std="population")
    informative = unbiased != 0
    ratio = population[informative] / unbiased[informative]
    # sqrt(G / (G - 1)) = 1.069 at G = 8, up to the 1e-6 added to each std
    torch.testing.assert_close(ratio, torch.full_like(ratio, (8 / 7) ** 0.5), rtol=2e-6, atol=0)


def test_deliberate_differences_from_verl() -> None:
    # A prompt with one response: verl divides r by (1 + eps); here it carries no signal.
    lone = torch.tensor([1.0, 0.0, 3.0])
    assert group_advantages(lone, 1).tolist() == [0.0, 0.0, 0.0]
    theirs = verl_grpo_outcome_advantage(lone, [0, 1, 2], norm_by_std=True)
    assert theirs.tolist() == pytest.approx([1.0, 0.0, 3.0], rel=1e-5)
    # Seven rewards of 0.1 (no binary fraction): float32's mean rounds to 0.1 - 7.5e-9, so verl
    # divides that residue by (std 8e-9 + eps) and gives every response -0.0074, a push with no
    # signal behind it; here the group is exactly 0.
    constant = torch.tensor([0.1] * 7, dtype=torch.float32)
    assert group_advantages(constant, 7).tolist() == [0.0] * 7
    residue = verl_grpo_outcome_advantage(constant, [0] * 7, norm_by_std=True)
    assert residue.tolist() == pytest.approx([-0.0073911] * 7, rel=1e-3)
