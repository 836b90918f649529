"""The learner tests' tiny random Qwen2 policy (tests.tiny_models) and hand-built groups."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import numpy as np
from transformers import PreTrainedModel

from buffer.rollout_group import RolloutGroup
from tests.tiny_models import DENSE_POLICY, RAW_IDS, tiny_model

VOCAB = RAW_IDS.vocab_size  # ids 0 pad, 1 eos, 2 bos; groups draw tokens from 3..VOCAB-1


def tiny_policy(seed: int = 0) -> PreTrainedModel:
    return tiny_model(DENSE_POLICY, seed=seed)


def save_tiny_policy(directory: Path, seed: int = 0) -> Path:
    tiny_policy(seed).save_pretrained(directory)
    return directory


def random_groups(
    n_groups: int, group_size: int, seed: int = 0, version: int = 0, with_logprobs=None
) -> list[RolloutGroup]:
    """Groups with ragged responses; behaviour logprobs from `with_logprobs(prompt, resp)`."""
    rng = np.random.default_rng(seed)
    groups = []
    for g in range(n_groups):
        prompt = rng.integers(3, VOCAB, size=int(rng.integers(2, 5))).tolist()
        responses = [
            rng.integers(3, VOCAB, size=int(rng.integers(1, 6))).tolist() for _ in range(group_size)
        ]
        logprobs = [
            with_logprobs(prompt, r) if with_logprobs else (-rng.random(len(r)) - 0.1).tolist()
            for r in responses
        ]
        groups.append(
            RolloutGroup(
                run_id="test",
                group_id=f"g{g}",
                prompt_index=g,
                prompt_ids=prompt,
                response_ids=responses,
                behavior_logprobs=logprobs,
                rewards=rng.integers(0, 2, size=group_size).astype(float).tolist(),
                reward_infos=["{}"] * group_size,
                finish_reasons=["stop"] * group_size,
                policy_version=version,
                generator_id="gen-test",
                created_at=datetime.now(UTC),
            )
        )
    return groups
