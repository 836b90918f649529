"""A GSM8K-format data set generated locally: short arithmetic word problems with `####` answers.

No data hub is reachable, yet the real-model path (a verl Parquet file with chat prompts, the
GSM8K verifier, a chat template) must be exercised end to end. This module writes a Parquet file
in the columns of verl's `examples/data_preprocess/gsm8k.py`:

- `data_source`: "harness/gsm8k_format" (not "openai/gsm8k": the problems are synthetic);
- `prompt`: a chat, `[{"role": "user", "content": question + INSTRUCTION}]`, verl's instruction;
- `ability`: "math";
- `reward_model`: `{"style": "rule", "ground_truth": "<integer answer>"}`;
- `extra_info`: `{"split", "index", "answer", "question"}`, where `answer` is the GSM8K-style
  solution ending in `#### N` (what a warm start or SFT trains on);
plus a top-level `split` column (`train` / `test`), which the `file` task uses to hold out the
test rows (verl keeps splits in separate files instead).

Problems are one- or two-step stories over small numbers (add, subtract, multiply, add-then-take)
so that a tiny model can learn some of them: the point is a verifiable format, not difficulty.
The file is a pure function of (seed, sizes, max_operand): every problem is drawn from
`random.Random` seeded by them, train and test questions are distinct, and rows are in a fixed
order. `harness data gsm8k-format OUT.parquet` writes it; `configs/gsm8k_format_cpu.yaml` reads the
copy shipped in `data/gsm8k_format.parquet` (regenerate it with that command's defaults).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

DATA_SOURCE = "harness/gsm8k_format"
ABILITY = "math"
# verl's gsm8k preprocessing appends this to every question.
INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
COLUMNS = ("data_source", "prompt", "ability", "reward_model", "extra_info", "split")
DEFAULT_SEED = 0
DEFAULT_TRAIN_SIZE = 2000
DEFAULT_TEST_SIZE = 128
DEFAULT_MAX_OPERAND = 9
# Distinct problems are drawn by rejection; a request beyond the size of the problem space would
# spin forever, so it fails after this many draws in a row that gave nothing new.
MAX_MISSES_IN_A_ROW = 10_000

NAMES = ("Tom", "Anna", "Ben", "Mia", "Sam", "Lily", "Max", "Zoe", "Leo", "Emma")
PRONOUNS = {
    "Tom": "He",
    "Ben": "He",
    "Sam": "He",
    "Max": "He",
    "Leo": "He",
    "Anna": "She",
    "Mia": "She",
    "Lily": "She",
    "Zoe": "She",
    "Emma": "She",
}
ITEMS = ("apples", "pencils", "stickers", "marbles", "cookies", "books", "cards", "shells")


@dataclass(frozen=True)
class Problem:
    """One word problem: question text, GSM8K-style solution (ends in `#### N`) and answer."""

    question: str
    solution: str
    answer: int


def _story(rng: random.Random) -> tuple[str, str, str]:
    name = rng.choice(NAMES)
    return name, PRONOUNS[name], rng.choice(ITEMS)


def _addition(rng: random.Random, top: int) -> Problem:
    name, pronoun, item = _story(rng)
    a, b = rng.randint(1, top), rng.randint(1, top)
    question = f"{name} has {a} {item}. {pronoun} buys {b} more. How many {item} does {name} have?"
    return Problem(question, f"{name} has {a} + {b} = {a + b} {item}.\n#### {a + b}", a + b)


def _subtraction(rng: random.Random, top: int) -> Problem:
    name, pronoun, item = _story(rng)
    a = rng.randint(2, 2 * top)
    b = rng.randint(1, a - 1)
    question = f"{name} has {a} {item}. {pronoun} gives away {b}. How many {item} are left?"
    return Problem(question, f"{name} has {a} - {b} = {a - b} {item} left.\n#### {a - b}", a - b)


def _multiplication(rng: random.Random, top: int) -> Problem:
    name, _, item = _story(rng)
    boxes, each = rng.randint(2, max(2, top // 2)), rng.randint(2, top)
    question = (
        f"{name} buys {boxes} boxes with {each} {item} in each box. "
        f"How many {item} does {name} buy?"
    )
    total = boxes * each
    return Problem(question, f"{name} buys {boxes} * {each} = {total} {item}.\n#### {total}", total)


def _two_step(rng: random.Random, top: int) -> Problem:
    name, pronoun, item = _story(rng)
    a, b = rng.randint(1, top), rng.randint(1, top)
    c = rng.randint(1, a + b - 1)
    question = (
        f"{name} has {a} {item} and finds {b} more. {pronoun} eats {c}. "
        f"How many {item} does {name} have now?"
    )
    solution = f"{name} has {a} + {b} = {a + b} {item}, then {a + b} - {c} = {a + b - c}.\n"
    solution += f"#### {a + b - c}"
    return Problem(question, solution, a + b - c)


# Drawn uniformly; two-step problems show the format with more than one line of work.
GENERATORS: tuple[Callable[[random.Random, int], Problem], ...] = (
    _addition,
    _subtraction,
    _multiplication,
    _two_step,
)


def draw_problems(
    seed: int, stream: str, n: int, max_operand: int, exclude: set[str]
) -> list[Problem]:
    """`n` distinct problems whose questions are not in `exclude` (which is extended in place).

    `random.Random` seeded with a string is stable across processes and Python versions.
    """
    if max_operand < 2:
        raise ValueError(f"max_operand={max_operand} must be >= 2")
    rng = random.Random(f"gsm8k_format:{stream}:{seed}:{max_operand}")
    problems: list[Problem] = []
    misses = 0
    while len(problems) < n and misses < MAX_MISSES_IN_A_ROW:
        problem = rng.choice(GENERATORS)(rng, max_operand)
        if problem.question in exclude:
            misses += 1
            continue
        misses = 0
        exclude.add(problem.question)
        problems.append(problem)
    if len(problems) == n:
        return problems
    raise ValueError(
        f"could draw only {len(problems)} of {n} distinct problems with max_operand="
        f"{max_operand}; raise max_operand or ask for fewer rows"
    )


def verl_row(problem: Problem, split: str, index: int) -> dict[str, object]:
    """One row in verl's GSM8K columns (module docstring), plus `split`."""
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": f"{problem.question} {INSTRUCTION}"}],
        "ability": ABILITY,
        "reward_model": {"style": "rule", "ground_truth": str(problem.answer)},
        "extra_info": {
            "split": split,
            "index": index,
            "answer": problem.solution,
            "question": problem.question,
        },
        "split": split,
    }


def gsm8k_format_frame(
    seed: int = DEFAULT_SEED,
    train_size: int = DEFAULT_TRAIN_SIZE,
    test_size: int = DEFAULT_TEST_SIZE,
    max_operand: int = DEFAULT_MAX_OPERAND,
) -> pd.DataFrame:
    """The data set: train rows, then test rows (drawn first, so train avoids them)."""
    if train_size < 1 or test_size < 1:
        raise ValueError(f"train_size={train_size} and test_size={test_size} must be >= 1")
    seen: set[str] = set()
    test = draw_problems(seed, "test", test_size, max_operand, seen)
    train = draw_problems(seed, "train", train_size, max_operand, seen)
    rows = [verl_row(p, "train", i) for i, p in enumerate(train)]
    rows += [verl_row(p, "test", i) for i, p in enumerate(test)]
    return pd.DataFrame(rows, columns=list(COLUMNS))


def write_gsm8k_format(
    path: Path,
    *,
    seed: int = DEFAULT_SEED,
    train_size: int = DEFAULT_TRAIN_SIZE,
    test_size: int = DEFAULT_TEST_SIZE,
    max_operand: int = DEFAULT_MAX_OPERAND,
) -> pd.DataFrame:
    """Write the data set to `path` (Parquet, zstd: small enough to ship) and return it."""
    frame = gsm8k_format_frame(seed, train_size, test_size, max_operand)
    path.parent.mkdir(parents=True, exist_ok=True)
    frame.to_parquet(path, index=False, compression="zstd", compression_level=19)
    return frame
