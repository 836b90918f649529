"""The training stream as a weighted mixture of tasks, each prompt scored by its own verifier.

Prompt `index` of seed `seed` comes from the component drawn by a counter-based RNG,
numpy `default_rng([MIXTURE_STREAM, seed, index])`, and is that component's own training prompt
`index` (`Task.train_prompt(seed, index)`). So, like every task stream, the mixture is a pure
function of (seed, index): generators compute any prompt on their own, in any order, after any
crash, and every arm of a seed sees the same prompts (design section 1). A single component
draws nothing and gives exactly the task's own stream, so a config without `train_tasks` trains
on the same prompts as before mixtures existed.

Why a draw per prompt rather than fixed quotas per batch: quotas would make a component's share
of a batch exact but tie prompt i's task to the batch size; the draw keeps the stream independent
of `prompts_per_step`, and over n prompts a component of share p gets n*p +- sqrt(n*p*(1-p)).
"""

from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass

import numpy as np
from transformers import PreTrainedTokenizerBase

from harness.config import ExperimentConfig
from harness.tasks.base import MIXTURE_STREAM, Prompt, RewardFn, Task
from harness.tasks.factory import make_rendered_task
from harness.tasks.rewards import make_reward_fn


@dataclass(frozen=True)
class Component:
    """One task of the mixture: its name (prompts.parquet's `task`), weight, prompts, verifier."""

    name: str
    weight: float
    task: Task
    reward_fn: RewardFn


class TrainMixture:
    """Draws each training prompt's component from (seed, index), then its prompt."""

    def __init__(self, components: list[Component]) -> None:
        if not components:
            raise ValueError("a training mixture needs at least one component")
        if any(c.weight <= 0 for c in components):
            raise ValueError(f"mixture weights must be > 0, got {[c.weight for c in components]}")
        self.components = components
        total = sum(c.weight for c in components)
        # Upper edges of each component's interval of [0, 1); the last is exactly 1.
        self._edges = [edge / total for edge in itertools.accumulate(c.weight for c in components)]
        self._edges[-1] = 1.0

    def component_index(self, seed: int, index: int) -> int:
        """Which component prompt `index` of seed `seed` comes from (0 without a draw if one)."""
        if len(self.components) == 1:
            return 0
        draw = np.random.default_rng([MIXTURE_STREAM, seed, index]).random()  # in [0, 1)
        return bisect.bisect_right(self._edges, draw)

    def prompt(self, seed: int, index: int) -> tuple[Component, Prompt]:
        component = self.components[self.component_index(seed, index)]
        return component, component.task.train_prompt(seed, index)


def make_train_mixture(cfg: ExperimentConfig, tokenizer: PreTrainedTokenizerBase) -> TrainMixture:
    """The experiment's training stream, rendered for `tokenizer` (the text eval and the prompt
    table see too), every component with the verifier its own TaskConfig names."""
    return TrainMixture(
        [
            Component(name, weight, make_rendered_task(task, tokenizer), make_reward_fn(task))
            for name, weight, task in cfg.train_components()
        ]
    )
