"""Build a task from its config: one table from `task.name` to its builder."""

from __future__ import annotations

from collections.abc import Callable

from harness.config import TaskConfig
from harness.tasks.base import Task
from harness.tasks.file_task import FileTask
from harness.tasks.procedural import (
    ProceduralTask,
    arithmetic_sampler,
    reverse_word,
    sort_word,
    string_sampler,
)


def _file_task(config: TaskConfig) -> Task:
    if config.path is None:
        raise ValueError("task.path is required when task.name is `file`")
    return FileTask.from_path(config.path, eval_size=config.eval_size)


# task.name -> builder. `digits` is the operand length for arithmetic (exactly that many digits)
# and the string length for reverse/sort; it has no effect on `file`.
TASK_BUILDERS: dict[str, Callable[[TaskConfig], Task]] = {
    "addition": lambda c: ProceduralTask("addition", arithmetic_sampler("+", c.digits)),
    "multiplication": lambda c: ProceduralTask("multiplication", arithmetic_sampler("*", c.digits)),
    "reverse": lambda c: ProceduralTask("reverse", string_sampler("rev", c.digits, reverse_word)),
    "sort": lambda c: ProceduralTask("sort", string_sampler("sort", c.digits, sort_word)),
    "file": _file_task,
}


def make_task(config: TaskConfig) -> Task:
    """Build the task named by `task.name` (see TASK_BUILDERS for what `digits` means)."""
    return TASK_BUILDERS[config.name](config)
