"""collate of rollout routing (schema v2): hand-worked layout, loop reference, refusals."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from buffer.collate import collate
from buffer.rollout_group import RolloutGroup
from buffer.schema import decode_group, encode_group
from tests.buffer.factories import CREATED_AT


def _group(prompt, responses, routed, *, index=0) -> RolloutGroup:
    return RolloutGroup(
        run_id="r", group_id=f"g{index}", prompt_index=index, prompt_ids=prompt,
        response_ids=responses, behavior_logprobs=[[-0.5] * len(r) for r in responses],
        rewards=[0.0] * len(responses), reward_infos=["{}"] * len(responses),
        finish_reasons=["stop"] * len(responses), policy_version=0, generator_id="gen",
        created_at=CREATED_AT, routed_experts=routed,
    )  # fmt: skip


def _experts(values: list[int], layers: int = 2, top_k: int = 2) -> np.ndarray:
    """[T, layers, k] where layer l, slot s of position t holds values[t] + 10 * l + s."""
    base = np.array(values)[:, None, None]  # (T, 1, 1)
    offsets = (10 * np.arange(layers)[:, None] + np.arange(top_k)[None, :])[None]  # (1, l, k)
    return (base + offsets).astype(np.int16)


def test_routing_by_hand() -> None:
    # g0: prompt 11 12, responses [21 22 23] and [24]: rows of 5 and 3 tokens, so 4 and 2
    # recorded positions; g1: prompt 13, response [25 26]: 3 tokens, 2 recorded. L = 5.
    g0 = _group([11, 12], [[21, 22, 23], [24]], [_experts([100, 200, 300, 400]),
                                                 _experts([500, 600])])  # fmt: skip
    g1 = _group([13], [[25, 26]], [_experts([700, 800])], index=1)
    batch = collate([g0, g1], pad_id=0)
    experts = batch.routed_experts
    assert experts is not None and experts.dtype == torch.int64
    assert experts.shape == (2, 3, 5, 2)  # (layers, B, L, k)
    # Layer 0, slot 0 per row: recorded positions, then 0 (slot s holds s where unrecorded).
    assert experts[0, :, :, 0].tolist() == [
        [100, 200, 300, 400, 0],  # the last token (23, position 4) was never fed back
        [500, 600, 0, 0, 0],  # position 2 = last token 24, then padding
        [700, 800, 0, 0, 0],
    ]
    # Layer 1, slot 1 adds 10 + 1: row 0 position 3 = 411; unrecorded positions hold slot 1.
    assert experts[1, 0, :, 1].tolist() == [111, 211, 311, 411, 1]
    assert experts[1, 2, 2:, :].tolist() == [[0, 1]] * 3


def _loop_reference(groups: list[RolloutGroup], width: int) -> torch.Tensor:
    layers, top_k = groups[0].routing_shape
    rows = [a for g in groups for a in g.routed_experts]
    out = torch.zeros(layers, len(rows), width, top_k, dtype=torch.int64)
    for b, array in enumerate(rows):
        for p in range(width):
            for layer in range(layers):
                for slot in range(top_k):
                    value = int(array[p, layer, slot]) if p < len(array) else slot
                    out[layer, b, p, slot] = value
    return out


@pytest.mark.parametrize("seed", [0, 1])
def test_routing_matches_loop_reference(seed: int) -> None:
    rng = np.random.default_rng(seed)
    layers, top_k = 3, 2
    groups = []
    for index in range(3):
        prompt = rng.integers(0, 50, int(rng.integers(1, 5))).tolist()
        lengths = rng.integers(0, 6, int(rng.integers(1, 4)))
        routed = [rng.integers(0, 8, (len(prompt) + n - 1, layers, top_k)) for n in lengths]
        responses = [rng.integers(0, 50, n).tolist() for n in lengths]
        groups.append(_group(prompt, responses, routed, index=index))
    decoded = [decode_group(encode_group(g)) for g in groups]  # views into Arrow buffers
    batch = collate(decoded, pad_id=0)
    assert torch.equal(batch.routed_experts, _loop_reference(groups, batch.input_ids.shape[1]))


def test_no_routing_when_any_group_lacks_it() -> None:
    with_routing = _group([11, 12], [[21]], [_experts([1, 2])])
    without = dataclasses.replace(with_routing, routed_experts=None, group_id="g9")
    assert collate([with_routing], pad_id=0).routed_experts is not None
    assert collate([with_routing, without], pad_id=0).routed_experts is None


def test_groups_of_different_models_are_refused() -> None:
    two_layers = _group([11, 12], [[21]], [_experts([1, 2], layers=2)])
    three_layers = _group([11, 12], [[21]], [_experts([1, 2], layers=3)], index=1)
    with pytest.raises(ValueError, match=r"different \(layers, top_k\)"):
        collate([two_layers, three_layers], pad_id=0)
