"""collate: padded tensors checked element by element, and against a per-token loop reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from buffer.collate import collate
from buffer.rollout_group import RolloutGroup
from buffer.schema import decode_group, encode_group
from tests.buffer.factories import CREATED_AT

PAD = 99  # not 0, so padding can never be mistaken for a real value


def _group(prompt, responses, logprobs, rewards, finish, *, version, index=0) -> RolloutGroup:
    return RolloutGroup(
        run_id="r", group_id=f"g{index}", prompt_index=index, prompt_ids=prompt,
        response_ids=responses, behavior_logprobs=logprobs, rewards=rewards,
        reward_infos=["{}"] * len(responses), finish_reasons=finish, policy_version=version,
        generator_id="gen", created_at=CREATED_AT,
    )  # fmt: skip


def test_collate_by_hand() -> None:
    g0 = _group([11, 12], [[21, 22, 23], [24]], [[-0.1, -0.2, -0.3], [-0.4]], [1.0, 0.0],
                ["stop", "length"], version=3)  # fmt: skip
    g1 = _group([13], [[25, 26]], [[-0.5, -0.6]], [0.5], ["length"], version=4, index=1)
    # Rows: g0/s0 = 11 12 | 21 22 23 (5 tokens), g0/s1 = 11 12 | 24 (3), g1/s0 = 13 | 25 26 (3).
    # L = max(5, 3, 3) = 5; shorter rows are right-padded with PAD.
    batch = collate([g0, g1], pad_id=PAD)
    assert batch.input_ids.tolist() == [
        [11, 12, 21, 22, 23],
        [11, 12, 24, PAD, PAD],
        [13, 25, 26, PAD, PAD],
    ]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 1, 0, 0]]
    assert batch.response_mask.tolist() == [[0, 0, 1, 1, 1], [0, 0, 1, 0, 0], [0, 1, 1, 0, 0]]
    # Each logprob sits on the token it scores: -0.1 on token 21 at position 2, and so on.
    expected_lp = torch.tensor(
        [[0, 0, -0.1, -0.2, -0.3], [0, 0, -0.4, 0, 0], [0, -0.5, -0.6, 0, 0]], dtype=torch.float32
    )
    assert torch.equal(batch.behavior_logprobs, expected_lp)
    assert batch.rewards.tolist() == [1.0, 0.0, 0.5]
    assert batch.group_index.tolist() == [0, 0, 1]
    assert batch.prompt_lengths.tolist() == [2, 2, 1]
    assert batch.response_lengths.tolist() == [3, 1, 2]
    assert batch.policy_versions.tolist() == [3, 3, 4]
    assert batch.truncated.tolist() == [False, True, True]
    assert batch.batch_size == 3
    dtypes = {
        "input_ids": torch.int64, "attention_mask": torch.int64, "response_mask": torch.float32,
        "behavior_logprobs": torch.float32, "rewards": torch.float32, "group_index": torch.int64,
        "prompt_lengths": torch.int64, "response_lengths": torch.int64,
        "policy_versions": torch.int64, "truncated": torch.bool,
    }  # fmt: skip
    assert {name: getattr(batch, name).dtype for name in dtypes} == dtypes


def _loop_reference(groups: list[RolloutGroup], pad_id: int) -> dict[str, list]:
    """The obvious per-token loop the vectorised collate must agree with."""
    rows = [(g.prompt_ids.tolist(), r.tolist(), lp.tolist()) for g in groups
            for r, lp in zip(g.response_ids, g.behavior_logprobs, strict=True)]  # fmt: skip
    width = max(len(p) + len(r) for p, r, _ in rows)
    out: dict[str, list] = {"input_ids": [], "response_mask": [], "behavior_logprobs": []}
    for prompt, response, logprobs in rows:
        ids, mask, lps = [], [], []
        for pos in range(width):
            if pos < len(prompt):
                ids.append(prompt[pos]), mask.append(0.0), lps.append(0.0)
            elif pos < len(prompt) + len(response):
                k = pos - len(prompt)
                ids.append(response[k]), mask.append(1.0), lps.append(logprobs[k])
            else:
                ids.append(pad_id), mask.append(0.0), lps.append(0.0)
        out["input_ids"].append(ids)
        out["response_mask"].append(mask)
        out["behavior_logprobs"].append(lps)
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_collate_matches_loop_reference(seed: int) -> None:
    rng = np.random.default_rng(seed)
    groups = []
    for index in range(int(rng.integers(1, 5))):
        size = int(rng.integers(1, 5))
        lengths = rng.integers(0, 9, size)
        groups.append(_group(
            rng.integers(0, 50, int(rng.integers(1, 6))).tolist(),
            [rng.integers(0, 50, n).tolist() for n in lengths],
            [(-rng.random(n)).astype(np.float32).tolist() for n in lengths],
            rng.random(size).tolist(), ["stop"] * size, version=index, index=index,
        ))  # fmt: skip
    # Decoded groups (numpy views into Arrow buffers) must collate exactly like built ones.
    decoded = [decode_group(encode_group(g)) for g in groups]
    batch = collate(decoded, pad_id=PAD)
    ref = _loop_reference(groups, PAD)
    assert batch.input_ids.tolist() == ref["input_ids"]
    assert batch.response_mask.tolist() == ref["response_mask"]
    assert torch.equal(batch.behavior_logprobs, torch.tensor(ref["behavior_logprobs"]))
    # Reading positions with the documented convention recovers each sample's own logprobs.
    rows = [(group, s) for group in groups for s in range(group.num_samples)]
    for b, (group, s) in enumerate(rows):
        picked = batch.behavior_logprobs[b][batch.response_mask[b].bool()]
        assert torch.equal(picked, torch.from_numpy(group.behavior_logprobs[s]))


def test_collate_refuses_an_empty_batch() -> None:
    with pytest.raises(ValueError, match="at least one group"):
        collate([], pad_id=0)


def test_a_batch_moves_to_the_learner_device_whole() -> None:
    """The learner trains on its device (`train_on_batch` moves the CPU-collated batch): every
    tensor goes, dtypes and values kept; on the device it is on already, nothing is copied."""
    batch = collate([_group([11], [[21, 22]], [[-0.1, -0.2]], [1.0], ["stop"], version=0)], PAD)
    assert batch.to("cpu") is batch
    moved = batch.to("meta")  # a device without storage: only placement and dtype exist
    for name in vars(batch):
        before, after = getattr(batch, name), getattr(moved, name)
        if before is None:
            assert after is None, name
            continue
        assert after.device.type == "meta" and after.dtype == before.dtype, name
        assert after.shape == before.shape, name
