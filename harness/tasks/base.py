"""What every task is: a prompt (`Prompt`) and a prompt source (`Task`), plus the stream keys.

Kept apart from the task implementations so that procedural tasks, file tasks and the task
factory can all import it without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

# First element of the RNG key, so the train and eval streams can never share a generator state.
TRAIN_STREAM = 0
EVAL_STREAM = 1


@dataclass(frozen=True)
class Prompt:
    """One problem. `index` is its position in the stream it came from (train or eval).

    `ground_truth` is what the verifier compares against; for built-in tasks it is also the exact
    expected response (followed by EOS), which the warm start trains on.
    """

    index: int
    text: str
    ground_truth: str


class Task(Protocol):
    """A prompt source: a reproducible training stream and a fixed held-out eval split."""

    name: str

    def train_prompt(self, seed: int, index: int) -> Prompt:
        """The `index`-th training prompt of the stream of `seed` (pure function of both)."""
        ...

    def eval_prompts(self, n: int) -> list[Prompt]:
        """The first `n` held-out prompts (the same list for every seed)."""
        ...
