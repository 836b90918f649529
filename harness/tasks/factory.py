"""Build a task from its config: one table from `task.name` to its builder."""

from __future__ import annotations

from collections.abc import Callable

from transformers import PreTrainedTokenizerBase

from harness.config import TaskConfig
from harness.tasks.base import Prompt, Task
from harness.tasks.file_task import FileTask
from harness.tasks.procedural import (
    ProceduralTask,
    arithmetic_sampler,
    arithmetic_space,
    repeat_sampler,
    repeat_space,
    reverse_word,
    sort_word,
    string_sampler,
    string_space,
)
from harness.tasks.rendering import RenderedTask, renderer_for


def _file_task(config: TaskConfig) -> Task:
    if config.path is None:
        raise ValueError("task.path is required when task.name is `file`")
    return FileTask.from_path(config.path, eval_size=config.eval_size)


def _arithmetic(name: str, operator: str) -> Callable[[TaskConfig], Task]:
    return lambda c: ProceduralTask(
        name, arithmetic_sampler(operator, c.digits), arithmetic_space(operator, c.digits)
    )


def _string(name: str, prefix: str, solve: Callable[[str], str]) -> Callable[[TaskConfig], Task]:
    return lambda c: ProceduralTask(
        name, string_sampler(prefix, c.digits, solve), string_space(prefix, c.digits)
    )


# task.name -> builder. `digits` is the operand length for arithmetic (exactly that many digits),
# the string length for reverse/sort and the word length for repeat; it has no effect on `file`.
# A procedural task gets its problem space too, so an eval set larger than its held-out split
# fails at once.
TASK_BUILDERS: dict[str, Callable[[TaskConfig], Task]] = {
    "addition": _arithmetic("addition", "+"),
    "multiplication": _arithmetic("multiplication", "*"),
    "reverse": _string("reverse", "rev", reverse_word),
    "sort": _string("sort", "sort", sort_word),
    "repeat": lambda c: ProceduralTask("repeat", repeat_sampler(c.digits), repeat_space(c.digits)),
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


def held_out_prompts(task: Task, config: TaskConfig) -> list[Prompt]:
    """The eval set `config` names in `task` (built from it, raw or rendered): held-out prompts
    [eval_offset, eval_offset + eval_size), indexed by their place in the held-out split."""
    return task.eval_prompts(config.eval_offset + config.eval_size)[config.eval_offset :]
