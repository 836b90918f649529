"""Build a task from its config: one table from `task.name` to its builder."""

from __future__ import annotations

from collections.abc import Callable

from transformers import PreTrainedTokenizerBase

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
from harness.tasks.rendering import RenderedTask, renderer_for


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
    """Build the task named by `task.name` (see TASK_BUILDERS for what `digits` means).

    Its prompts are raw text; whatever feeds a model uses `make_rendered_task` instead.
    """
    return TASK_BUILDERS[config.name](config)


def make_rendered_task(config: TaskConfig, tokenizer: PreTrainedTokenizerBase) -> Task:
    """The task with prompts rendered for `tokenizer` under `task.prompt_format`.

    The one constructor for every component that stores, encodes or scores prompts (trial
    prompt set, generators, warm start, eval), so all of them see the same text.
    """
    return RenderedTask(make_task(config), renderer_for(config, tokenizer))
