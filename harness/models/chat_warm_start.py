"""Warm start of a built-in model with a production tokenizer: SFT on rendered prompts.

The character-tokenizer warm start (`harness.models.warm_start`) trains on `prompt + ground truth`
because there the ground truth is the whole expected response. With a chat tokenizer and a
GSM8K-style task the response the verifier wants is a worked solution ending in `#### N`, and the
prompt the model sees is the chat-template rendering. So this warm start trains on
`rendered prompt + solution + EOS` (loss on the solution and EOS only), where the solution is the
task file's verl `extra_info.answer` when it has one (verl's GSM8K files and
`harness.tasks.gsm8k_format` do), else the ground truth. Prompts are rendered by the same
`harness.tasks.rendering` renderer the generators and the learner's eval use, so the warm start
teaches exactly the prompt format RL will sample from.

Cost: with a 32,000-token vocabulary the output head dominates a tiny model's compute, so the
loss runs the head on the supervised positions only (`solution_loss`), about 3x cheaper than full
logits. Batches, AdamW settings, the schedule, the greedy/sampled evals and the determinism rules
(one pinned thread, `fork_rng`) are the character warm start's; the sampled eval draws fewer
samples per prompt (SAMPLES_PER_PROMPT) because generation over the large head is slow. The
result is recorded in warm_start.json like the built-in one.
"""

from __future__ import annotations

import time
from collections.abc import Hashable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from harness.config import ModelConfig, TaskConfig
from harness.models.tokenizer import encode_prompt
from harness.models.warm_start import (
    IGNORE_INDEX,
    WARM_START_THREADS,
    WarmStartReport,
    measure,
    pinned_threads,
    train_supervised,
)
from harness.tasks.base import Prompt, Task
from harness.tasks.file_task import read_table
from harness.tasks.rendering import PromptRenderer
from harness.tasks.rewards import RewardFn

SOLUTION_KEY = "answer"  # verl's GSM8K preprocessing keeps the worked solution here
# Room for a wrong extra token after the longest solution, as in the character warm start.
BUDGET_MARGIN = 1
SAMPLES_PER_PROMPT = 4


def prompt_key(prompt: Any) -> Hashable:
    """A file prompt cell (string or chat) or a task Prompt as a dictionary key."""
    if isinstance(prompt, Prompt):
        return prompt.messages if prompt.messages is not None else prompt.text
    if isinstance(prompt, str):
        return prompt
    return tuple((str(m["role"]), str(m["content"])) for m in prompt)


def file_solutions(path: Path) -> dict[Hashable, str] | None:
    """Prompt -> worked solution from verl's `extra_info.answer`; None if the file has none.

    A chat is keyed both as a chat and as its raw text (contents joined by newlines, the `file`
    task's raw form), so prompts match whether or not they carry their messages.
    """
    frame = read_table(path)
    if "extra_info" not in frame.columns or "prompt" not in frame.columns:
        return None
    solutions: dict[Hashable, str] = {}
    for cell, info in zip(frame["prompt"], frame["extra_info"], strict=True):
        if not isinstance(info, dict) or not isinstance(info.get(SOLUTION_KEY), str):
            return None
        solutions[prompt_key(cell)] = info[SOLUTION_KEY]
        if not isinstance(cell, str):
            solutions["\n".join(str(m["content"]) for m in cell)] = info[SOLUTION_KEY]
    return solutions


class SftTask:
    """A task view for `train_supervised`: rendered prompt text, target = solution (or truth)."""

    def __init__(
        self, task: Task, renderer: PromptRenderer, solutions: dict[Hashable, str] | None
    ) -> None:
        self.task = task
        self.renderer = renderer
        self.solutions = solutions
        self.name = task.name

    def target(self, prompt: Prompt) -> str:
        if self.solutions is None:
            return prompt.ground_truth
        try:
            return self.solutions[prompt_key(prompt)]
        except KeyError:
            raise KeyError(f"no solution in the task file for prompt {prompt.text!r}") from None

    def train_prompt(self, seed: int, index: int) -> Prompt:
        prompt = self.task.train_prompt(seed, index)
        return Prompt(index, self.renderer.text(prompt), self.target(prompt), prompt.messages)

    def eval_prompts(self, n: int) -> list[Prompt]:
        return [self.renderer.render(p) for p in self.task.eval_prompts(n)]


def solution_loss(
    model: PreTrainedModel, input_ids: torch.Tensor, mask: torch.Tensor, labels: torch.Tensor
) -> torch.Tensor:
    """Mean next-token cross-entropy over supervised tokens, the head applied only there.

    Equal to `warm_start.answer_loss` (position t predicts token t+1) up to float rounding.
    """
    hidden = model.get_decoder()(input_ids=input_ids, attention_mask=mask).last_hidden_state
    targets = labels[:, 1:]  # (B, T-1)
    chosen = targets != IGNORE_INDEX
    logits = model.get_output_embeddings()(hidden[:, :-1][chosen])  # (N, V)
    return F.cross_entropy(logits.float(), targets[chosen])


def train_on_solutions(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, sft: SftTask, config: ModelConfig
) -> list[tuple[int, float]]:
    """`warm_start.train_supervised` with `solution_loss`: same stream, batches and optimiser."""
    return train_supervised(model, tokenizer, sft, config, loss_fn=solution_loss)


def response_budget(
    tokenizer: PreTrainedTokenizerBase, sft: SftTask, seed: int, n: int, max_seq_len: int
) -> int:
    """Longest target among `n` training examples + margin, checked against the context."""
    examples = [sft.train_prompt(seed, i) for i in range(n)]
    longest = max(len(encode_prompt(tokenizer, p.ground_truth)) for p in examples)
    longest_prompt = max(len(encode_prompt(tokenizer, p.text)) for p in examples)
    budget = longest + BUDGET_MARGIN
    if longest_prompt + budget > max_seq_len:
        raise ValueError(
            f"prompts of up to {longest_prompt} tokens + responses of up to {budget} tokens do "
            f"not fit model.max_seq_len={max_seq_len}; raise model.max_seq_len"
        )
    return budget


def chat_warm_start(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    task: Task,
    renderer: PromptRenderer,
    reward_fn: RewardFn,
    *,
    model_cfg: ModelConfig,
    task_cfg: TaskConfig,
) -> WarmStartReport:
    """Train in place on rendered prompts -> solutions; measure greedy and sampled reward."""
    solutions = None
    if task_cfg.name == "file" and task_cfg.path is not None:
        solutions = file_solutions(Path(task_cfg.path).expanduser())
    sft = SftTask(task, renderer, solutions)
    started = time.perf_counter()
    with pinned_threads(WARM_START_THREADS):
        budget = response_budget(
            tokenizer, sft, model_cfg.init_seed, model_cfg.warm_start_batch_size * 4,
            model_cfg.max_seq_len,
        )  # fmt: skip
        curve = train_on_solutions(model, tokenizer, sft, model_cfg)
        seconds = time.perf_counter() - started
        prompts = sft.eval_prompts(task_cfg.eval_size)
        return measure(
            model,
            tokenizer,
            reward_fn,
            prompts,
            config=model_cfg,
            budget=budget,
            curve=curve,
            seconds=seconds,
            samples_per_prompt=SAMPLES_PER_PROMPT,
        )


__all__ = [
    "SftTask",
    "chat_warm_start",
    "file_solutions",
    "prompt_key",
    "response_budget",
    "solution_loss",
    "train_on_solutions",
]
