"""The `file` task: user prompt sets from Parquet or JSONL, in the column convention of verl.

Columns read:
- `prompt`: a string, or a chat as a list of `{"role", "content"}` messages (verl's data files).
  A chat is kept as its messages (`Prompt.messages`), which `harness.tasks.rendering` renders
  through the tokenizer's chat template; its raw text, the contents joined by newlines, is the
  prompt's identity here (split overlap check) and its rendering under `task.prompt_format=raw`.
- `ground_truth`, or else verl's `reward_model` struct with a `ground_truth` key. Non-string
  values (numbers, lists) are converted to text: str() for numbers, JSON for anything else.
- `split` (optional): `train` rows form the training stream, `eval`/`test`/`validation` rows the
  held-out split, in file order. Without a `split` column the last `eval_size` rows are held out.

Every problem with the file (missing, unreadable, not Parquet or JSON lines, a bad row or column)
is a TaskFileError, a ConfigError naming task.path, the file and, for JSON lines, the line: the
command line prints it as one line instead of a traceback.

Training rows whose prompt text also occurs in the held-out split are dropped, so the split never
overlaps training even when a file repeats prompts. The training stream indexes the remaining
rows through a per-epoch permutation drawn from `default_rng([TRAIN_STREAM, seed, epoch, salt])`:
index i is row perm_epoch[i mod n] with epoch = i // n, a pure function of (seed, index).
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from harness.overrides import ConfigError
from harness.tasks.base import TRAIN_STREAM, Message, Prompt

TRAIN_SPLIT = "train"
EVAL_SPLITS = frozenset({"eval", "test", "validation"})
_FILE_SALT = zlib.crc32(b"file")
# Streams are read roughly in index order, so a few cached epoch permutations suffice.
_PERMUTATIONS_KEPT = 8


class TaskFileError(ConfigError):
    """task.path cannot serve as a prompt set; the message names the file and what is wrong."""


class TaskFileMissingError(TaskFileError, FileNotFoundError):
    """task.path names no file."""


@dataclass(frozen=True)
class Row:
    """One prompt of a file, before it is placed in a stream."""

    text: str
    ground_truth: str
    messages: tuple[Message, ...] | None = None


def read_table(path: Path) -> pd.DataFrame:
    """Read Parquet (`.parquet`) or JSON lines (`.jsonl`, `.json` holding one object per line)."""
    if not path.is_file():
        raise TaskFileMissingError(f"task.path {path} does not exist or is not a file")
    suffix = path.suffix.lower()
    if suffix not in (".parquet", ".jsonl", ".json"):
        raise TaskFileError(
            f"task.path {path}: unsupported suffix {suffix!r}; use .parquet or .jsonl"
        )
    try:
        if suffix == ".parquet":
            return pd.read_parquet(path)
        return pd.read_json(path, lines=True, dtype=False)
    except OSError as exc:
        raise TaskFileError(f"task.path {path}: cannot read it ({_one_line(exc)})") from None
    # pyarrow's ArrowInvalid is a ValueError; pandas raises a ValueError or a TypeError for a
    # JSON-lines file that is not one object per line.
    except (ValueError, TypeError) as exc:
        if suffix == ".parquet":
            raise TaskFileError(
                f"task.path {path} is not a Parquet file ({_one_line(exc)})"
            ) from None
        raise TaskFileError(f"task.path {path}: {_json_lines_problem(path, exc)}") from None


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def _json_lines_problem(path: Path, exc: Exception) -> str:
    """Which line of a JSON-lines file pandas could not read, and why (pandas does not say)."""
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            if not raw.strip():
                continue
            try:
                value = json.loads(raw.decode("utf-8"))
            except UnicodeDecodeError:
                return f"line {number} is not UTF-8 text"
            except json.JSONDecodeError as bad:
                return f"line {number} is not valid JSON ({bad.msg} at column {bad.colno})"
            if not isinstance(value, dict):
                return f"line {number} is not a JSON object (one object per line is expected)"
    return f"not JSON lines, one object per line ({_one_line(exc)})"


def prompt_messages(value: Any, where: str) -> tuple[Message, ...] | None:
    """A prompt cell's chat as (role, content) pairs; None for a plain string prompt."""
    if isinstance(value, str):
        return None
    if isinstance(value, list | tuple | np.ndarray):
        try:
            return tuple((str(m["role"]), str(m["content"])) for m in value)
        except (KeyError, TypeError, IndexError) as exc:
            raise TaskFileError(
                f"{where}: a chat prompt must be a list of {{role, content}}"
            ) from exc
    raise TaskFileError(
        f"{where}: prompt must be a string or a list of messages, got {type(value).__name__}"
    )


def prompt_text(value: Any, where: str) -> str:
    """A prompt cell as text: a string as-is, a chat's message contents joined by newlines."""
    messages = prompt_messages(value, where)
    return value if messages is None else "\n".join(content for _, content in messages)


def truth_text(value: Any) -> str:
    """A ground-truth cell as text (numbers via str, other non-strings as JSON)."""
    if isinstance(value, str):
        return value
    if isinstance(value, int | float | np.integer | np.floating):
        return str(value.item() if isinstance(value, np.generic) else value)
    if isinstance(value, np.ndarray):
        value = value.tolist()
    return json.dumps(value, sort_keys=True)


def _ground_truths(frame: pd.DataFrame, path: Path) -> list[Any]:
    if "ground_truth" in frame.columns:
        return list(frame["ground_truth"])
    if "reward_model" in frame.columns:
        try:
            return [cell["ground_truth"] for cell in frame["reward_model"]]
        except (KeyError, TypeError, IndexError):
            raise TaskFileError(
                f"task.path {path}: every `reward_model` cell must be an object with a "
                "`ground_truth` key"
            ) from None
    raise TaskFileError(
        f"task.path {path}: needs a `ground_truth` column (or verl's `reward_model` with a "
        f"`ground_truth` key); columns are {list(frame.columns)}"
    )


def read_rows(path: Path) -> tuple[list[Row], list[str] | None]:
    """All rows of the file, and the `split` column if it has one."""
    frame = read_table(path)
    if "prompt" not in frame.columns:
        raise TaskFileError(
            f"task.path {path}: no `prompt` column; columns are {list(frame.columns)}"
        )
    truths = _ground_truths(frame, path)
    rows = [
        Row(
            prompt_text(value, f"task.path {path} row {i}"),
            truth_text(truth),
            prompt_messages(value, f"task.path {path} row {i}"),
        )
        for i, (value, truth) in enumerate(zip(frame["prompt"], truths, strict=True))
    ]
    splits = [str(s) for s in frame["split"]] if "split" in frame.columns else None
    return rows, splits


def split_rows(
    rows: list[Row], splits: list[str] | None, eval_size: int, path: Path
) -> tuple[list[Row], list[Row]]:
    """(train, eval) rows: by the `split` column, else the last `eval_size` rows are eval."""
    if splits is None:
        if eval_size >= len(rows):
            raise TaskFileError(
                f"task.path {path} has {len(rows)} rows, too few to hold out task.eval_size="
                f"{eval_size} and still train; lower task.eval_size or add a `split` column"
            )
        train, held_out = rows[: len(rows) - eval_size], rows[len(rows) - eval_size :]
    else:
        unknown = sorted(set(splits) - EVAL_SPLITS - {TRAIN_SPLIT})
        if unknown:
            raise TaskFileError(
                f"task.path {path}: unknown split values {unknown}; use `train` or one of "
                f"{sorted(EVAL_SPLITS)}"
            )
        train = [row for row, s in zip(rows, splits, strict=True) if s == TRAIN_SPLIT]
        held_out = [row for row, s in zip(rows, splits, strict=True) if s in EVAL_SPLITS]
    eval_texts = {row.text for row in held_out}
    train = [row for row in train if row.text not in eval_texts]
    if not train:
        raise TaskFileError(
            f"task.path {path}: no training rows left after holding out the eval set"
        )
    return train, held_out


class FileTask:
    """Prompts read from a file; see the module docstring for the split and stream rules."""

    name = "file"

    def __init__(self, train_rows: list[Row], eval_rows: list[Row], source: str) -> None:
        self._train = train_rows
        self._eval = eval_rows
        self.source = source
        self._permutations: dict[tuple[int, int], np.ndarray] = {}

    @classmethod
    def from_path(cls, path: str | Path, eval_size: int) -> FileTask:
        path = Path(path).expanduser()
        rows, splits = read_rows(path)
        train, held_out = split_rows(rows, splits, eval_size, path)
        return cls(train, held_out, str(path))

    @property
    def num_train(self) -> int:
        return len(self._train)

    def train_prompt(self, seed: int, index: int) -> Prompt:
        if seed < 0 or index < 0:
            raise ValueError(f"seed={seed} and index={index} must be >= 0")
        epoch, position = divmod(index, len(self._train))
        row = self._train[int(self._permutation(seed, epoch)[position])]
        return Prompt(index, row.text, row.ground_truth, row.messages)

    def eval_prompts(self, n: int) -> list[Prompt]:
        if n > len(self._eval):
            raise TaskFileError(
                f"task file {self.source}: {n} eval prompts asked, the held-out split has "
                f"{len(self._eval)}; lower task.eval_size or add eval rows"
            )
        return [
            Prompt(i, row.text, row.ground_truth, row.messages)
            for i, row in enumerate(self._eval[:n])
        ]

    def _permutation(self, seed: int, epoch: int) -> np.ndarray:
        key = (seed, epoch)
        if key not in self._permutations:
            if len(self._permutations) >= _PERMUTATIONS_KEPT:
                self._permutations.clear()
            rng = np.random.default_rng([TRAIN_STREAM, seed, epoch, _FILE_SALT])
            self._permutations[key] = rng.permutation(len(self._train))
        return self._permutations[key]
