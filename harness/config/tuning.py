"""The `tuning:` section: an equal tuning budget for every arm, then a comparison on fresh seeds.

Most "A beats B" results tune A and run B at its defaults. The remedy (Henderson et al. 2018;
Jordan et al. 2020; Patterson et al. 2024) is a protocol: every arm gets the same number of
configurations (`budget`) drawn from its own search space, each is trained on tuning seeds that
are not the evaluation seeds, one configuration per arm is selected on a validation eval set that
is not the test set, and only the selected configurations are compared, on the evaluation seeds
and the test set. `harness run` runs both stages (`harness.experiment.tuning`).

A search space is a grid (every combination; its size must be the budget) or seeded random draws
(`budget` draws per arm; numpy's Generator seeded by `tuning.seed` and the arm's name). Its keys
are arm settings (lr, eps_low/eps_high, minibatches, beta, any setting the arm's objective reads);
each configuration is validated as the arm it becomes, so an unknown or unread setting is refused
by name before anything runs.
"""

from __future__ import annotations

import itertools
import math
import zlib

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from contract.tuning import Scalar, TuningMetric
from harness.seeds import SeedList


class Distribution(BaseModel):
    """One hyperparameter of a random search: exactly one of the forms."""

    model_config = ConfigDict(extra="forbid")

    uniform: tuple[float, float] | None = Field(default=None, description="[low, high].")
    log_uniform: tuple[float, float] | None = Field(
        default=None, description="[low, high], both > 0: uniform in log space (learning rates)."
    )
    int_uniform: tuple[int, int] | None = Field(
        default=None, description="[low, high], integers, both included."
    )
    choice: list[Scalar] | None = Field(default=None, min_length=1, description="Uniform pick.")

    @model_validator(mode="after")
    def _one_form(self) -> Distribution:
        forms = [name for name in type(self).model_fields if getattr(self, name) is not None]
        if len(forms) != 1:
            raise ValueError(
                f"a distribution is exactly one of uniform, log_uniform, int_uniform, choice; "
                f"got {forms or 'none'}"
            )
        for name in ("uniform", "log_uniform", "int_uniform"):
            bounds = getattr(self, name)
            if bounds is not None and not bounds[0] <= bounds[1]:
                raise ValueError(f"{name}: [{bounds[0]}, {bounds[1]}] needs low <= high")
        if self.log_uniform is not None and self.log_uniform[0] <= 0:
            raise ValueError(f"log_uniform: low {self.log_uniform[0]} must be > 0")
        return self

    def draw(self, rng: np.random.Generator) -> Scalar:
        if self.uniform is not None:
            return float(rng.uniform(*self.uniform))
        if self.log_uniform is not None:
            low, high = self.log_uniform
            return float(math.exp(rng.uniform(math.log(low), math.log(high))))
        if self.int_uniform is not None:
            return int(rng.integers(self.int_uniform[0], self.int_uniform[1] + 1))
        assert self.choice is not None
        return self.choice[int(rng.integers(len(self.choice)))]


class SearchSpace(BaseModel):
    """One arm's search space: a grid or random draws (exactly one)."""

    model_config = ConfigDict(extra="forbid")

    grid: dict[str, list[Scalar]] | None = Field(
        default=None, description="Setting -> values; every combination is one configuration."
    )
    random: dict[str, Distribution] | None = Field(
        default=None, description="Setting -> distribution; `tuning.budget` seeded draws."
    )

    @model_validator(mode="after")
    def _one_kind(self) -> SearchSpace:
        if (self.grid is None) == (self.random is None):
            raise ValueError("a search space is either `grid` or `random`, not both or neither")
        space = self.grid if self.grid is not None else self.random
        if not space:
            raise ValueError("a search space needs at least one setting")
        reserved = {"name", "objective"} & set(space)
        if reserved:
            raise ValueError(f"{sorted(reserved)} identify the arm and cannot be searched")
        if self.grid is not None:
            empty = [key for key, values in self.grid.items() if not values]
            if empty:
                raise ValueError(f"grid settings {empty} have no values")
        return self

    @property
    def keys(self) -> list[str]:
        return list(self.grid if self.grid is not None else self.random or {})

    def size(self, budget: int) -> int:
        """Configurations this space yields: the grid's product, or `budget` draws."""
        if self.grid is None:
            return budget
        return math.prod(len(values) for values in self.grid.values())

    def configurations(self, arm: str, budget: int, seed: int) -> list[dict[str, Scalar]]:
        """The arm's configurations in a fixed order: the grid in itertools.product order of
        its settings as written, or `budget` draws from numpy's Generator seeded by
        (seed, crc32 of the arm's name), so every launch draws the same ones."""
        if self.grid is not None:
            keys = list(self.grid)
            return [
                dict(zip(keys, values, strict=True))
                for values in itertools.product(*self.grid.values())
            ]
        assert self.random is not None
        rng = np.random.default_rng([seed, zlib.crc32(arm.encode())])
        return [{key: dist.draw(rng) for key, dist in self.random.items()} for _ in range(budget)]


class TuningConfig(BaseModel):
    """The tuning stage (module docstring)."""

    model_config = ConfigDict(extra="forbid")

    seeds: SeedList = Field(
        min_length=1,
        description="Tuning seeds (integers or `range(a,b)`): every configuration is trained "
        "on each; disjoint from the evaluation `seeds`.",
    )
    budget: int = Field(
        gt=0, description="Configurations per arm, the same for every arm (each space yields it)."
    )
    validation: str = Field(
        description="The eval set (a name in `evals`, not the first: that is the test set) the "
        "selection is made on; it is scored in the tuning stage only and never in the final "
        "one. Its prompts must not be any test set's: give it task.eval_offset past them."
    )
    metric: TuningMetric = Field(
        default="final",
        description="Selection score of a tuning trial on the validation set: `final` (greedy "
        "pass rate after the last step) or `auc` (mean over the eval curve); the mean over "
        "tuning seeds ranks an arm's configurations (ties: the first configuration).",
    )
    space: dict[str, SearchSpace] = Field(
        description="Arm name -> its search space; every arm of the experiment has one."
    )
    seed: int = Field(default=0, ge=0, description="Seeds the random search draws.")

    @field_validator("seeds")
    @classmethod
    def _distinct(cls, value: list[int]) -> list[int]:
        if len(set(value)) != len(value):
            raise ValueError(f"tuning.seeds has duplicates: {value}")
        return value

    def configurations(self, arm: str) -> list[dict[str, Scalar]]:
        return self.space[arm].configurations(arm, self.budget, self.seed)


def tuned_arm_name(arm: str, index: int) -> str:
    """The tuning stage's name for configuration `index` of `arm` (`grpo-c3`): a valid arm
    name, a path component, and distinct from every final arm (which keep their names)."""
    return f"{arm}-c{index}"


__all__ = [
    "Distribution",
    "SearchSpace",
    "TuningConfig",
    "TuningMetric",
    "tuned_arm_name",
]
