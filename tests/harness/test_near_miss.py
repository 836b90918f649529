"""The near-miss warm start (`model.warm_start_near_miss`): what it trains on, and who may use it.

The quickstart's regime rests on it (README "Resolving power"), so its stream is pinned: the
share of near misses, that a near miss is exactly the answer plus one, that the draw is a pure
function of (seed, index) like the prompt stream, and that RL's prompts and rewards never see it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.config import ExperimentConfig, ModelConfig, TaskConfig
from harness.config.checks import NEAR_MISS_TASKS
from harness.models.model_dir import builtin_cache_key
from harness.models.near_miss import NEAR_MISSES, NearMissStream, near_miss
from harness.tasks.factory import make_task

N = 4000


def _stream(rate: float, name: str = "addition") -> tuple[object, NearMissStream]:
    task = make_task(TaskConfig(name=name, digits=2))
    return task, NearMissStream(task, rate)


def test_near_miss_is_the_answer_plus_one() -> None:
    assert near_miss("99") == "100"
    assert near_miss("0") == "1"


def test_repeats_near_miss_is_one_repetition_too_many() -> None:
    task, stream = _stream(0.6, name="repeat")
    missed = 0
    for index in range(400):
        true, shown = task.train_prompt(3, index), stream.train_prompt(3, index)
        word = true.text.removeprefix("rep:").split("*")[0]
        assert shown.ground_truth in (true.ground_truth, true.ground_truth + word)
        missed += shown.ground_truth != true.ground_truth
    assert 200 <= missed <= 280  # 0.6 of 400, +- 4 standard deviations


def test_every_near_miss_task_is_known_to_the_config_check() -> None:
    assert set(NEAR_MISS_TASKS) == set(NEAR_MISSES)
    with pytest.raises(ValueError, match="task 'reverse' has no near miss"):
        NearMissStream(make_task(TaskConfig(name="reverse", digits=2)), 0.5)


@pytest.mark.parametrize("rate", [0.0, 0.25, 0.6])
def test_share_of_near_misses_matches_the_rate(rate: float) -> None:
    task, stream = _stream(rate)
    missed = 0
    for index in range(N):
        true, shown = task.train_prompt(3, index), stream.train_prompt(3, index)
        assert shown.text == true.text and shown.index == true.index
        if shown.ground_truth != true.ground_truth:
            assert shown.ground_truth == str(int(true.ground_truth) + 1)
            missed += 1
    # Binomial(N, rate): 4 standard deviations of slack.
    slack = 4 * (rate * (1 - rate) / N) ** 0.5
    assert abs(missed / N - rate) <= slack, (missed, rate)


def test_the_draw_is_a_pure_function_of_seed_and_index() -> None:
    _, stream = _stream(0.6)
    forwards = [stream.train_prompt(1, i).ground_truth for i in range(200)]
    backwards = [stream.train_prompt(1, i).ground_truth for i in reversed(range(200))]
    assert forwards == backwards[::-1]
    other_seed = [stream.train_prompt(2, i).ground_truth for i in range(200)]
    assert forwards != other_seed


def test_rate_outside_zero_one_is_refused() -> None:
    task = make_task(TaskConfig())
    with pytest.raises(ValueError, match=r"near-miss rate 1\.0"):
        NearMissStream(task, 1.0)
    with pytest.raises(ValueError, match="warm_start_near_miss"):
        ModelConfig(warm_start_near_miss=1.0)


@pytest.mark.parametrize(
    ("model", "task", "named"),
    [
        ({"warm_start_near_miss": 0.5}, {"name": "reverse"}, "task.name='reverse'"),
        ({"warm_start_near_miss": 0.5, "tokenizer": "mistral-v1"}, {}, "tokenizer='mistral-v1'"),
    ],
)
def test_config_refuses_near_misses_without_an_integer_answer(
    model: dict, task: dict, named: str
) -> None:
    with pytest.raises(ValueError, match=r"model\.warm_start_near_miss=0\.5") as info:
        ExperimentConfig(arms=[{"name": "g", "objective": "grpo"}], model=model, task=task)
    assert named in str(info.value)


def test_the_rate_is_part_of_the_built_models_identity(tmp_path: Path) -> None:
    task = TaskConfig()
    plain = builtin_cache_key(ModelConfig(cache_dir=str(tmp_path)), task)
    missed = builtin_cache_key(ModelConfig(cache_dir=str(tmp_path), warm_start_near_miss=0.6), task)
    assert plain != missed
