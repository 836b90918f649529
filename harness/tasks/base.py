"""What every task and verifier is: a prompt (`Prompt`), a prompt source (`Task`), a reward
function (`RewardFn`), plus the stream keys.

Kept apart from the implementations so that procedural tasks, file tasks, verifiers and the
factories can all import it without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

# First element of the RNG key, so the train and eval streams can never share a generator state.
TRAIN_STREAM = 0
EVAL_STREAM = 1
MIXTURE_STREAM = 2  # which component of a training mixture prompt i comes from
NEAR_MISS_STREAM = 3  # which warm-start examples train on the near miss (models.warm_start)

Message = tuple[str, str]  # (role, content) of one chat turn
RewardInfo = dict[str, Any]


@dataclass(frozen=True)
class Prompt:
    """One problem. `index` is its position in the stream it came from (train or eval).

    `text` is what the model is given: the raw prompt text as a task produces it, or the rendered
    text (chat template applied) once `harness.tasks.rendering` has rendered it. `messages` holds
    the chat a `file` task read (None for plain-text prompts), so rendering can apply a template.
    `ground_truth` is what the verifier compares against; for built-in tasks it is also the exact
    expected response (followed by EOS), which the warm start trains on.
    """

    index: int
    text: str
    ground_truth: str
    messages: tuple[Message, ...] | None = None


class Task(Protocol):
    """A prompt source: a reproducible training stream and a fixed held-out eval split."""

    name: str

    def train_prompt(self, seed: int, index: int) -> Prompt:
        """The `index`-th training prompt of the stream of `seed` (pure function of both)."""
        ...

    def eval_prompts(self, n: int) -> list[Prompt]:
        """The first `n` held-out prompts (the same list for every seed)."""
        ...


class RewardFn(Protocol):
    """Scores one response against its ground truth: `(reward, info)`.

    `response` is the decoded response with special tokens (EOS, pad) removed
    (`harness.models.tokenizer.response_text`), the same text in rollouts and in evals; `reward` is
    a finite float and `info` a JSON-serialisable dict that the rollout record stores as
    `reward_info` (design section 4).
    """

    def __call__(self, response: str, ground_truth: str) -> tuple[float, RewardInfo]: ...
