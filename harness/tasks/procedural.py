"""Tasks: deterministic prompt streams with a held-out eval split that never meets training.

A task hands out prompts by (seed, index), not by iteration, so generator processes can compute
the prompt of any (seed, step, slot) on their own, in any order, after any crash, and every arm of
a seed sees the same stream (design section 1, matched arms).

Procedural tasks (`addition`, `multiplication`, `reverse`, `sort`) draw each problem from a
counter-based RNG, numpy `default_rng([stream, seed, index, salt])`, so prompt `index` does not
depend on which prompts were drawn before it. The eval split is a hash partition of the problem
space: a problem is held out iff sha256 of its prompt text falls in one of EVAL_MODULUS buckets
(see `is_held_out`). The eval set is the first `n` distinct held-out problems of a fixed eval
stream (the same for every experiment seed); the train stream redraws, from the same generator,
until it gets a problem that is not held out. Disjointness is therefore a property of each
problem, whatever `n` or the seed.

The `file` task lives in `harness.tasks.file_task`; `harness.tasks.factory.make_task` builds any
task from a TaskConfig.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import string
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np

from harness.overrides import ConfigError
from harness.tasks.base import EVAL_STREAM, TRAIN_STREAM, Prompt

# One problem in EVAL_MODULUS is held out (12.5%): 2-digit addition keeps ~1010 eval-eligible and
# ~7090 training problems. Changing it changes both splits: bump FORMAT_VERSION in
# harness.models.factory.
EVAL_MODULUS = 8
# Attempt caps turn an impossible request (eval set larger than the held-out space) into an error
# instead of an endless loop; reaching them with a feasible request has negligible probability.
TRAIN_MAX_DRAWS = 1000
EVAL_ATTEMPTS_PER_PROMPT = 200
EVAL_MIN_ATTEMPTS = 10_000


Problem = tuple[str, str]  # (prompt text, ground truth)
ProblemSampler = Callable[[np.random.Generator], Problem]
# Spaces up to this size are counted exactly (sha256 of every text, 0.1-0.6 s on a loaded core);
# a larger one's held-out count is estimated as size / EVAL_MODULUS (12,500 or more, within a
# few percent), and a request between the estimate and the truth still ends at the draw's cap.
MAX_COUNTED_SPACE = 100_000


@dataclass(frozen=True)
class ProblemSpace:
    """Every prompt text a sampler draws (each equally likely), to size the held-out split."""

    digits: int
    size: int
    texts: Callable[[], Iterable[str]] = field(compare=False)


@functools.cache
def held_out_count(task_name: str, space: ProblemSpace) -> int:
    """How many distinct problems of `space` the hash partition holds out."""
    if space.size > MAX_COUNTED_SPACE:
        return space.size // EVAL_MODULUS
    return sum(is_held_out(task_name, text) for text in space.texts())


def is_held_out(task_name: str, text: str) -> bool:
    """Whether a problem belongs to the eval split: a fixed hash partition of prompt texts."""
    digest = hashlib.sha256(f"{task_name}\x00{text}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % EVAL_MODULUS == 0


def _salt(task_name: str) -> int:
    # crc32 is stable across processes and Python versions, unlike hash().
    return zlib.crc32(task_name.encode())


def _check_non_negative(**values: int) -> None:
    for key, value in values.items():
        if value < 0:
            raise ValueError(f"{key}={value} must be >= 0 (it seeds numpy's SeedSequence)")


class ProceduralTask:
    """A task defined by a sampler of (prompt, ground truth) pairs and the hash partition."""

    def __init__(
        self, name: str, sampler: ProblemSampler, space: ProblemSpace | None = None
    ) -> None:
        self.name = name
        self._sampler = sampler
        self._space = space  # None: not enumerable, the draw's attempt cap is the only limit
        self._salt = _salt(name)
        self._eval_cache: list[Prompt] = []

    def train_prompt(self, seed: int, index: int) -> Prompt:
        _check_non_negative(seed=seed, index=index)
        rng = np.random.default_rng([TRAIN_STREAM, seed, index, self._salt])
        for _ in range(TRAIN_MAX_DRAWS):
            text, truth = self._sampler(rng)
            if not is_held_out(self.name, text):
                return Prompt(index=index, text=text, ground_truth=truth)
        raise RuntimeError(
            f"task {self.name}: no training problem in {TRAIN_MAX_DRAWS} draws; the problem "
            "space is (almost) all held out, use a larger task.digits"
        )

    def eval_prompts(self, n: int) -> list[Prompt]:
        _check_non_negative(n=n)
        if n > len(self._eval_cache):
            self._check_eval_size(n)
            self._eval_cache = self._draw_eval(n)
        return self._eval_cache[:n]

    def _check_eval_size(self, n: int) -> None:
        """An eval set larger than the held-out split fails at once, not after its draws (a
        million attempts per million prompts asked)."""
        if self._space is None:
            return
        held_out = held_out_count(self.name, self._space)
        if n > held_out:
            raise ConfigError(
                f"task.eval_size={n} is more than the {held_out} held-out problems of task "
                f"{self.name} (digits={self._space.digits}); lower task.eval_size or raise "
                "task.digits"
            )

    def _draw_eval(self, n: int) -> list[Prompt]:
        chosen: list[Prompt] = []
        seen: set[str] = set()
        attempts = max(EVAL_MIN_ATTEMPTS, EVAL_ATTEMPTS_PER_PROMPT * n)
        for attempt in range(attempts):
            if len(chosen) == n:
                break
            rng = np.random.default_rng([EVAL_STREAM, attempt, self._salt])
            text, truth = self._sampler(rng)
            if text not in seen and is_held_out(self.name, text):
                seen.add(text)
                chosen.append(Prompt(index=len(chosen), text=text, ground_truth=truth))
        if len(chosen) < n:
            raise ConfigError(
                f"task {self.name}: only {len(chosen)} distinct held-out problems found, "
                f"{n} asked; lower task.eval_size or raise task.digits"
            )
        return chosen


def operand_range(digits: int) -> tuple[int, int]:
    """Inclusive range of operands with exactly `digits` digits (1 digit: 0..9, no leading 0)."""
    if digits < 1:
        raise ValueError(f"digits={digits} must be >= 1")
    low = 0 if digits == 1 else 10 ** (digits - 1)
    return low, 10**digits - 1


def arithmetic_sampler(operator: str, digits: int) -> ProblemSampler:
    """`a+b=` / `a*b=` with both operands uniform over exactly-`digits`-digit integers."""
    low, high = operand_range(digits)
    apply = {"+": lambda a, b: a + b, "*": lambda a, b: a * b}[operator]

    def sample(rng: np.random.Generator) -> Problem:
        a, b = (int(x) for x in rng.integers(low, high + 1, size=2))
        return f"{a}{operator}{b}=", str(apply(a, b))

    return sample


def arithmetic_space(operator: str, digits: int) -> ProblemSpace:
    """The `a<operator>b=` texts of arithmetic_sampler: every pair of `digits`-digit operands."""
    low, high = operand_range(digits)
    operands = range(low, high + 1)

    def texts() -> Iterable[str]:
        return (f"{a}{operator}{b}=" for a, b in itertools.product(operands, repeat=2))

    return ProblemSpace(digits, len(operands) ** 2, texts)


def string_space(prefix: str, length: int) -> ProblemSpace:
    """The `<prefix>:<letters>=` texts of string_sampler: every word of `length` letters."""

    def texts() -> Iterable[str]:
        words = itertools.product(string.ascii_lowercase, repeat=length)
        return (f"{prefix}:{''.join(word)}=" for word in words)

    return ProblemSpace(length, len(string.ascii_lowercase) ** length, texts)


def string_sampler(prefix: str, length: int, solve: Callable[[str], str]) -> ProblemSampler:
    """`<prefix>:<letters>=` with `length` uniform lowercase letters; answer solve(letters)."""
    letters = np.array(list(string.ascii_lowercase))

    def sample(rng: np.random.Generator) -> Problem:
        word = "".join(rng.choice(letters, size=length))
        return f"{prefix}:{word}=", solve(word)

    return sample


def reverse_word(word: str) -> str:
    return word[::-1]


def sort_word(word: str) -> str:
    return "".join(sorted(word))


REPEAT_MAX_CHARS = 48
"""The longest `repeat` answer in characters (tokens, with the built-in char tokenizer: plus EOS,
49): the cap of the repetition count is REPEAT_MAX_CHARS // word length."""
REPEAT_TAIL_EXPONENT = 1.5
"""P(n) proportional to n ** -1.5 over 1..cap: a Zipf-like long tail of response lengths."""


def repeat_counts(word_length: int) -> tuple[np.ndarray, np.ndarray]:
    """(counts 1..cap, their probabilities) of the `repeat` task for words of `word_length`."""
    cap = max(1, REPEAT_MAX_CHARS // word_length)
    counts = np.arange(1, cap + 1)
    weights = counts.astype(np.float64) ** -REPEAT_TAIL_EXPONENT
    return counts, weights / weights.sum()


def repeat_sampler(word_length: int) -> ProblemSampler:
    """`rep:<word>*<n>=` -> the word written n times: a task whose response lengths have a long
    tail (issue 39: a straggler bubble for asynchrony to remove). With 2-letter words most
    answers are 2-6 characters and about one in a hundred is 44 or more (median 5 tokens with
    EOS, p99 45, max 49), the shape of reasoning traces, where a few responses run far longer
    than the rest. The answer is spelled out, so its length is the count times the word."""
    letters = np.array(list(string.ascii_lowercase))
    counts, probabilities = repeat_counts(word_length)

    def sample(rng: np.random.Generator) -> Problem:
        word = "".join(rng.choice(letters, size=word_length))
        n = int(rng.choice(counts, p=probabilities))
        return f"rep:{word}*{n}=", word * n

    return sample


def repeat_space(word_length: int) -> ProblemSpace:
    """Every `rep:<word>*<n>=` text of repeat_sampler: each word with each count (not equally
    likely, but the hash partition holds out texts, not draws, so the count is what matters)."""
    counts, _ = repeat_counts(word_length)

    def texts() -> Iterable[str]:
        words = itertools.product(string.ascii_lowercase, repeat=word_length)
        return (f"rep:{''.join(w)}*{n}=" for w in words for n in counts)

    return ProblemSpace(
        word_length, len(string.ascii_lowercase) ** word_length * len(counts), texts
    )


def repeat_near_miss(prompt_text: str, ground_truth: str) -> str:
    """The near miss of a `repeat` answer: one repetition too many (the word is read from the
    prompt, `rep:<word>*<n>=`, since the answer alone does not say where a word ends)."""
    word = prompt_text.rsplit("rep:", 1)[-1].split("*", 1)[0]
    return ground_truth + word
