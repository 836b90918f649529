"""The learner checks each group's prompt tokens against its trial's prompt stream.

`learner_task` gives intake (`buffer.intake.prompt_problem`) the tokens a generator of
the trial sends for each prompt index: the training stream of the trial's seed, rendered and
encoded as `generator_main.GroupMaker` does. Before, `LearnerTask.prompt_ids` was never set, so
a group carrying another prompt's tokens under the right index, id and version was trained.
"""

from __future__ import annotations

import dataclasses

import pytest

from buffer.inbox import Delivery
from buffer.intake import IntakeRules, ModelLimits, refusal
from buffer.schema import make_group_id
from contract.layout import TrialPaths
from contract.trial import TrialSpec
from harness.config import validate_config
from harness.trial.learner_main import learner_task
from harness.trial.rollout_groups import GroupMaker
from learner.runtime.loop import LearnerTask
from tests.learner.tiny import random_groups
from tests.tiny_models import CHAR_DENSE, save_tiny_model_dir

SEED, PER_STEP, GROUP_SIZE = 3, 2, 2


@pytest.fixture(scope="module")
def trial(tmp_path_factory) -> tuple[LearnerTask, GroupMaker]:
    root = tmp_path_factory.mktemp("prompt_check")
    model_dir = save_tiny_model_dir(root / "model", CHAR_DENSE)
    cfg = validate_config(
        {
            "arms": [{"name": "grpo", "objective": "grpo"}],
            "model": {"path": str(model_dir)},
            "generation": {"backend": "torch", "group_size": GROUP_SIZE},
            "learner": {"prompts_per_step": PER_STEP},
        }
    )
    spec = TrialSpec(arm="grpo", seed=SEED, lag=0, mode="fixed")
    task = learner_task(cfg, spec, TrialPaths(root / "trial"), steps=4)
    return task, GroupMaker(cfg, spec, "run", "gen-0")  # the generator's own code path


def _sent(maker: GroupMaker, index: int) -> list[int]:
    """The prompt tokens the generator puts in the group of prompt `index`."""
    _, prompt = maker.mixture.prompt(SEED, index)
    return maker.request(index, prompt.text).prompt_ids


def test_the_learner_expects_the_tokens_the_generator_sends(trial) -> None:
    task, maker = trial
    assert task.prompt_ids is not None
    for index in range(3 * PER_STEP):
        assert list(task.prompt_ids(index)) == _sent(maker, index)
    assert list(task.prompt_ids(0)) != list(task.prompt_ids(1))  # distinct prompts, or no test


def _delivery(prompt_index: int, prompt_ids: list[int]) -> Delivery:
    batch = prompt_index // PER_STEP
    [group] = random_groups(1, GROUP_SIZE, seed=prompt_index, version=batch)
    group = dataclasses.replace(
        group,
        group_id=make_group_id(SEED, batch, prompt_index),
        prompt_index=prompt_index,
        prompt_ids=prompt_ids,
    )
    return Delivery("1-0", group, batch, group.policy_version)


def test_a_group_with_another_prompts_tokens_is_refused(trial) -> None:
    task, maker = trial
    rules = IntakeRules(
        mode=task.mode,
        lag=task.lag,
        seed=task.seed,
        prompts_per_step=PER_STEP,
        group_size=GROUP_SIZE,
        max_new_tokens=task.max_new_tokens,
        reward_range=task.learner.reward_range,
        limits=ModelLimits(vocab_size=1 << 16),
        prompt_ids=task.prompt_ids,  # what learner_task wires
    )
    right = _delivery(2, _sent(maker, 2))
    assert refusal(right, rules, learner_version=1) is None
    forged = _delivery(2, _sent(maker, 3))  # index, id and version of slot 2, prompt 3's tokens
    reason = refusal(forged, rules, learner_version=1)
    assert reason is not None
    assert reason.startswith(f"group {make_group_id(SEED, 1, 2)!r} (batch 1): its prompt")
    assert "is not prompt 2 of the trial's prompt stream" in reason
