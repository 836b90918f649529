"""Prompt rendering: the text a model is given for a prompt, under `task.prompt_format`.

An instruct model expects its own chat markup (`<|im_start|>user ... <|im_end|>` and the opening
of the assistant turn); fed bare text, it answers a malformed prompt. Rendering therefore happens
once, here, with the model's tokenizer, and every consumer sees the rendered text as
`Prompt.text`: the trial's `prompts.parquet` (and its digest), the generators, the warm start and
the learner's eval. Rules:
- `chat_template`: the prompt's chat (`Prompt.messages`), or a plain prompt as one user message,
  goes through `tokenizer.apply_chat_template(..., add_generation_prompt=True)`. The result is a
  string that `encode_prompt` tokenizes without adding special tokens, so a BOS the template
  writes is encoded once and never doubled.
- `raw`: the prompt's raw text (a chat's contents joined by newlines), unchanged.
- `auto`: `chat_template` when the tokenizer has one, else `raw` (the built-in character
  tokenizer has none, so the built-in path is unchanged).
`task.system_prompt`, when set, is added to prompts that carry no system message of their own: as
a leading system turn under the template, as a first line under raw rendering (the same text the
raw rendering of that chat would give).
"""

from __future__ import annotations

from typing import Literal

from transformers import PreTrainedTokenizerBase

from harness.config import PromptFormat, TaskConfig
from harness.tasks.base import Message, Prompt, Task

ResolvedFormat = Literal["chat_template", "raw"]
SYSTEM_ROLE = "system"


def has_chat_template(tokenizer: PreTrainedTokenizerBase) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def resolve_format(tokenizer: PreTrainedTokenizerBase, requested: PromptFormat) -> ResolvedFormat:
    """`auto` -> what the tokenizer supports; an explicit `chat_template` needs a template."""
    if requested == "raw":
        return "raw"
    if has_chat_template(tokenizer):
        return "chat_template"
    if requested == "chat_template":
        source = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
        raise ValueError(
            f"task.prompt_format=chat_template, but the tokenizer ({source}) has no chat "
            "template; add `chat_template` to its tokenizer_config.json or set "
            "task.prompt_format to auto or raw"
        )
    return "raw"


def with_system(messages: tuple[Message, ...], system_prompt: str | None) -> tuple[Message, ...]:
    """Prepend the system prompt unless there is none or the chat already has a system turn."""
    if system_prompt is None or any(role == SYSTEM_ROLE for role, _ in messages):
        return messages
    return ((SYSTEM_ROLE, system_prompt), *messages)


class PromptRenderer:
    """Renders prompts for one tokenizer under one resolved format (see the module rules)."""

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        prompt_format: PromptFormat = "auto",
        system_prompt: str | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.format: ResolvedFormat = resolve_format(tokenizer, prompt_format)
        self.system_prompt = system_prompt

    def text(self, prompt: Prompt) -> str:
        """The rendered text of `prompt` (a pure function of the prompt and the tokenizer)."""
        if self.format == "raw":
            if self.system_prompt is None:
                return prompt.text
            if prompt.messages is not None and any(r == SYSTEM_ROLE for r, _ in prompt.messages):
                return prompt.text
            return f"{self.system_prompt}\n{prompt.text}"
        chat = prompt.messages if prompt.messages is not None else (("user", prompt.text),)
        conversation = [
            {"role": role, "content": content}
            for role, content in with_system(chat, self.system_prompt)
        ]
        rendered = self.tokenizer.apply_chat_template(
            conversation, tokenize=False, add_generation_prompt=True
        )
        if not isinstance(rendered, str):
            raise TypeError(f"apply_chat_template returned {type(rendered).__name__}, not text")
        return rendered

    def render(self, prompt: Prompt) -> Prompt:
        """`prompt` with its text replaced by the rendered text."""
        return Prompt(prompt.index, self.text(prompt), prompt.ground_truth, prompt.messages)


class RenderedTask:
    """A task whose prompts come out rendered; streams, splits and ground truths are unchanged."""

    def __init__(self, task: Task, renderer: PromptRenderer) -> None:
        self.task = task
        self.renderer = renderer
        self.name = task.name

    def train_prompt(self, seed: int, index: int) -> Prompt:
        return self.renderer.render(self.task.train_prompt(seed, index))

    def eval_prompts(self, n: int) -> list[Prompt]:
        return [self.renderer.render(prompt) for prompt in self.task.eval_prompts(n)]


def renderer_for(config: TaskConfig, tokenizer: PreTrainedTokenizerBase) -> PromptRenderer:
    return PromptRenderer(tokenizer, config.prompt_format, config.system_prompt)
