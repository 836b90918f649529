"""The resolved form of a config: its JSON dump without the fields a table omits at defaults.

Why: a config's hash (and the `resolved_config.yaml` a trial's components read back) must not
change when a release adds a field, or every finished trial would look like another config's.
So a field added later is left out of the resolved form while it holds the default that means
"as before" (`learner.parallel: ddp`, `task.eval_offset: 0`, an arm's unset `lr`). The fields
are listed as data, one `OmitAtDefault` row each, by the package that owns the model
(`learner.config.omitted`, `harness.config`), so one function applies them and `model_dump`
stays pydantic's own for every other caller.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel


@dataclass(frozen=True)
class OmitAtDefault:
    """Leave `field` of every `model` instance (subclasses too) out of the resolved form while
    it equals `default` and, when given, `when(instance)` holds (a field omitted only where the
    instance does not read it)."""

    model: type[BaseModel]
    field: str
    default: object
    when: Callable[[Any], bool] | None = None

    def omits(self, instance: BaseModel) -> bool:
        return (
            isinstance(instance, self.model)
            and getattr(instance, self.field) == self.default
            and (self.when is None or self.when(instance))
        )


def dump_without_defaults(
    model: BaseModel, table: Sequence[OmitAtDefault], exclude: set[str] | None = None
) -> dict[str, Any]:
    """`model.model_dump(mode="json", exclude=exclude)` without the fields `table` omits, at
    every depth (nested models, lists and dicts of models); key order is the dump's."""
    data = model.model_dump(mode="json", exclude=exclude)
    _prune(model, data, table)
    return data


def _prune(model: BaseModel, data: dict[str, Any], table: Sequence[OmitAtDefault]) -> None:
    for row in table:
        if row.field in data and row.omits(model):
            del data[row.field]
    for name, dumped in data.items():
        _prune_value(getattr(model, name), dumped, table)


def _prune_value(value: object, dumped: object, table: Sequence[OmitAtDefault]) -> None:
    if isinstance(value, BaseModel) and isinstance(dumped, dict):
        _prune(value, dumped, table)
    elif isinstance(value, list | tuple) and isinstance(dumped, list):
        for item, dumped_item in zip(value, dumped, strict=True):
            _prune_value(item, dumped_item, table)
    elif isinstance(value, dict) and isinstance(dumped, dict):
        for item, dumped_item in zip(value.values(), dumped.values(), strict=True):
            _prune_value(item, dumped_item, table)
