"""Per-arm optimiser settings: what an arm may train with apart from the shared `learner.*`.

A comparison is matched when arms differ only in their objective; a tuned comparison (equal
tuning budget per arm) or a positive control (the same objective at a tenth of the learning rate)
needs an arm's own learning rate, gradient clip, minibatches or epochs. Each is unset by default
(the arm trains with `learner.*`); a set one is part of the arm's identity, so it enters the
config hash and the MLflow params, while an unset one is left out of the resolved config
(`learner.config.omitted`) and changes no existing config's hash. The runtime never reads
these fields: it trains with `arm.training_settings(learner)`, the shared settings with the
arm's overrides, built once.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, Field, ValidationError

from learner.config.shared import LearnerConfig


class TrainingOverrides(BaseModel):
    """The optimiser settings every arm may override (PPO adds its critic's `value_lr`)."""

    training_fields: ClassVar[tuple[str, ...]] = ("lr", "grad_clip", "minibatches", "ppo_epochs")
    """The fields that override `learner.<same name>`."""

    lr: float | None = Field(
        default=None,
        gt=0,
        description="This arm's AdamW learning rate of the policy; unset: learner.lr.",
    )
    grad_clip: float | None = Field(
        default=None,
        gt=0,
        description="This arm's global gradient-norm clip; unset: learner.grad_clip.",
    )
    minibatches: int | None = Field(
        default=None,
        gt=0,
        description="This arm's minibatch updates per pass over a step's batch; unset: "
        "learner.minibatches (at most learner.prompts_per_step).",
    )
    ppo_epochs: int | None = Field(
        default=None,
        gt=0,
        description="This arm's passes over each step's batch; unset: learner.ppo_epochs.",
    )

    def training_overrides(self) -> dict[str, Any]:
        """The settings this arm sets, by their `learner.*` name."""
        values = {name: getattr(self, name) for name in self.training_fields}
        return {name: value for name, value in values.items() if value is not None}

    def training_settings(self, learner: LearnerConfig) -> LearnerConfig:
        """The shared settings with this arm's overrides (validated again: minibatches must fit
        learner.prompts_per_step). The error names the arm."""
        overrides = self.training_overrides()
        if not overrides:
            return learner
        try:
            return LearnerConfig.model_validate({**learner.model_dump(), **overrides})
        except ValidationError as exc:
            problems = "; ".join(
                error["msg"].removeprefix("Value error, ") for error in exc.errors()
            )
            name = getattr(self, "name", "?")
            raise ValueError(f"arm {name!r} overrides {sorted(overrides)}: {problems}") from None
