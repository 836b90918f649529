"""Learner steps on real rollouts: groups sampled by a generator, and the step call on them.

Tests that check the learner against what a generator really sampled (same weights, same
sampling distribution) build their groups and call `train_on_batch` the same way; they differ
in their prompts, rewards and settings, which they pass in.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

from buffer.collate import RolloutBatch
from buffer.rollout_group import RolloutGroup
from harness.generators import Generator, GenRequest, sample_seed
from learner.algorithms.sampling_dist import PLAIN, SamplingSettings
from learner.config import ArmBase, LearnerConfig
from learner.runtime.step import StepModels, StepResult, train_on_batch


def group_requests(
    prompts: list[list[int]], group_size: int, max_new_tokens: int, *, seed: int, step: int
) -> list[GenRequest]:
    """A request per prompt, seeded as the generator loop seeds it: (seed, step) fix the tokens."""
    return [
        GenRequest(
            prompt_ids=prompt,
            seeds=[sample_seed(seed, step, index, j) for j in range(group_size)],
            max_new_tokens=max_new_tokens,
        )
        for index, prompt in enumerate(prompts)
    ]


def sampled_groups(
    generator: Generator,
    requests: list[GenRequest],
    rewards: Callable[[list[list[int]]], list[float]],
    version: int = 0,
) -> list[RolloutGroup]:
    """What `generator` samples for `requests`, rewarded per group: real rows for a learner step."""
    return [
        RolloutGroup(
            run_id="test",
            group_id=f"g{index}",
            prompt_index=index,
            prompt_ids=request.prompt_ids,
            response_ids=result.response_ids,
            behavior_logprobs=result.behavior_logprobs,
            rewards=rewards(result.response_ids),
            reward_infos=["{}"] * len(request.seeds),
            finish_reasons=result.finish_reasons,
            policy_version=version,
            generator_id="gen-test",
            created_at=datetime.now(UTC),
        )
        for index, (request, result) in enumerate(
            zip(requests, generator.generate(requests), strict=True)
        )
    ]


def train_step(
    models: StepModels,
    batch: RolloutBatch,
    arm: ArmBase,
    cfg: LearnerConfig,
    *,
    group_size: int,
    max_len: int,
    version: int = 0,
    sampling: SamplingSettings = PLAIN,
) -> StepResult:
    """`train_on_batch` as these tests call it (version 0, plain sampling unless given), once."""
    return train_on_batch(
        models, batch, arm=arm, learner=cfg, group_size=group_size, max_len=max_len,
        version=version, sampling=sampling,
    )  # fmt: skip
