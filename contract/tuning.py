"""The tuning selection: what the tuning stage chose for each arm, and on what evidence.

The harness computes it once from the tuning trials' scores (`harness.experiment.tuning`),
writes it to `<exp>/tuning/selection.json` (`TuningSelection.to_json`) and stamps the part that
decides the final trials on the final stage's config (`TuningSelection.stamp`, the config's
`selection` field, part of the config hash); the report's Tuning section reads the file back
(`TuningSelection.read`). One typed record for all three, validated once where it is read, so
no reader checks keys by hand.

Field order is the files' key order: selection.json is `json.dumps(model_dump(), indent=2)`,
byte for byte the file the harness wrote before this model existed, and a score no tuning seed
produced is NaN there (JSON's `NaN`, as Python's json module writes it).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Scalar = float | int | str | bool  # a searched setting's value (an arm field's)
TuningMetric = Literal["final", "auc"]


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ValidationSet(_Record):
    """The eval set the selection was made on (never scored in the final stage)."""

    name: str = Field(description="Its name in the experiment's `evals`.")
    task: str = Field(description="Its task's name.")
    offset: int = Field(description="Its task's eval_offset: where its held-out prompts start.")
    size: int = Field(description="Its task's eval_size: how many prompts it scores.")


class TriedConfiguration(_Record):
    """One configuration an arm tried in the tuning stage."""

    index: int = Field(description="Its position in the arm's search space (`<arm>-c<index>`).")
    settings: dict[str, Scalar] = Field(description="Arm setting -> value, as searched.")
    score: float = Field(
        description="Mean validation score over the tuning seeds whose trial finished; NaN "
        "when none did."
    )
    n_seeds: int = Field(description="The tuning seeds that score counts.")


class SelectedArm(_Record):
    """An arm's chosen configuration, as the final stage's config records it."""

    selected: int = Field(description="The chosen configuration's index.")
    settings: dict[str, Scalar] = Field(description="Its settings, applied to the final arm.")
    score: float = Field(description="Its tuning score (finite: the best of the arm's).")


class ArmSelection(_Record):
    """An arm's chosen configuration and every configuration it tried, in index order."""

    selected: int = Field(description="The chosen configuration's index.")
    score: float = Field(description="Its tuning score (finite: the best of the arm's).")
    settings: dict[str, Scalar] = Field(description="Its settings, applied to the final arm.")
    configs: list[TriedConfiguration] = Field(description="Every configuration tried.")

    def chosen(self) -> TriedConfiguration | None:
        """The tried configuration that was selected (None in a file that lacks it)."""
        return next((c for c in self.configs if c.index == self.selected), None)


class SelectionStamp(_Record):
    """The selection as the final stage's config carries it (its `selection` field): what
    decides the final trials, so a final trial run under another selection has another hash."""

    metric: TuningMetric
    validation: ValidationSet
    budget: int
    tuning_seeds: list[int]
    arms: dict[str, SelectedArm]


class TuningSelection(_Record):
    """`<exp>/tuning/selection.json`: the protocol every arm was tuned under and its choice."""

    metric: TuningMetric = Field(description="The selection score: `final` or `auc`.")
    validation: ValidationSet
    budget: int = Field(description="Configurations tried per arm, the same for every arm.")
    seeds: list[int] = Field(description="The tuning seeds.")
    evaluation_seeds: list[int] = Field(description="The final stage's seeds.")
    arms: dict[str, ArmSelection] = Field(description="Arm name -> its selection.")

    def stamp(self) -> SelectionStamp:
        """The part of the selection the final stage's config records."""
        return SelectionStamp(
            metric=self.metric,
            validation=self.validation,
            budget=self.budget,
            tuning_seeds=self.seeds,
            arms={
                name: SelectedArm(selected=arm.selected, settings=arm.settings, score=arm.score)
                for name, arm in self.arms.items()
            },
        )

    def to_json(self) -> str:
        """The file's text: NaN scores stay NaN (a JSON dump in pydantic's mode would write
        null), so the file reads back as it was written."""
        return json.dumps(self.model_dump(), indent=2) + "\n"

    @classmethod
    def read(cls, path: Path) -> TuningSelection:
        """selection.json, validated; ValueError naming the file and the field otherwise."""
        try:
            return cls.model_validate(json.loads(Path(path).read_text()))
        except ValueError as exc:  # pydantic's ValidationError and json's decode error
            raise ValueError(f"{path}: not a tuning selection: {exc}") from None


__all__ = [
    "ArmSelection",
    "Scalar",
    "SelectedArm",
    "SelectionStamp",
    "TriedConfiguration",
    "TuningMetric",
    "TuningSelection",
    "ValidationSet",
]
