"""The near-miss warm start's stream (`model.warm_start_near_miss`): a share of the examples
carry a wrong answer next to the right one, so the warm-started model samples the right answer
often and prefers the near miss greedily, the state RL with a verifiable reward acts on
(`harness.models.warm_start`'s docstring, README "Resolving power").
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from harness.tasks.base import NEAR_MISS_STREAM, Prompt, Task
from harness.tasks.procedural import repeat_near_miss


def near_miss(ground_truth: str) -> str:
    """The off-by-one answer of an integer task: what the warm start teaches instead, sometimes."""
    return str(int(ground_truth) + 1)


NEAR_MISSES: dict[str, Callable[[Prompt], str]] = {
    "addition": lambda prompt: near_miss(prompt.ground_truth),
    "multiplication": lambda prompt: near_miss(prompt.ground_truth),
    # one repetition too many: the model learns to spell the word and to count, but stops late
    "repeat": lambda prompt: repeat_near_miss(prompt.text, prompt.ground_truth),
}
"""task.name -> its near miss: a wrong answer next to the right one, which the model learns to
prefer at about the warm start's near-miss share (`harness.config.checks.NEAR_MISS_TASKS` names
the same tasks without importing torch)."""


class NearMissStream:
    """A task's training stream where a share `rate` of examples carry near-miss answers
    (`NEAR_MISSES`, by the task's name).

    Only the warm start reads it: RL prompts, evals and rewards use the task's true answers.
    """

    def __init__(self, task: Task, rate: float) -> None:
        if not 0.0 <= rate < 1.0:
            raise ValueError(f"near-miss rate {rate} must be in [0, 1)")
        if task.name not in NEAR_MISSES:
            raise ValueError(
                f"task {task.name!r} has no near miss; tasks with one: {sorted(NEAR_MISSES)}"
            )
        self._task, self._rate, self._miss = task, rate, NEAR_MISSES[task.name]

    def train_prompt(self, seed: int, index: int) -> Prompt:
        prompt = self._task.train_prompt(seed, index)
        if np.random.default_rng([NEAR_MISS_STREAM, seed, index]).random() >= self._rate:
            return prompt
        return Prompt(prompt.index, prompt.text, self._miss(prompt), prompt.messages)
