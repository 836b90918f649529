"""Tasks: deterministic streams, correct ground truths, a disjoint eval split, file loading."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from harness.config import TaskConfig
from harness.tasks.base import Prompt
from harness.tasks.factory import make_task
from harness.tasks.file_task import FileTask
from harness.tasks.procedural import REPEAT_MAX_CHARS, is_held_out, operand_range, repeat_counts

PROCEDURAL = ["addition", "multiplication", "reverse", "sort", "repeat"]


@pytest.mark.parametrize("name", PROCEDURAL)
def test_prompts_are_a_pure_function_of_seed_and_index(name: str) -> None:
    task = make_task(TaskConfig(name=name, digits=3))
    forward = [task.train_prompt(7, i) for i in range(50)]
    # A fresh task, read backwards and with repeats, gives the same prompts.
    other = make_task(TaskConfig(name=name, digits=3))
    backward = [other.train_prompt(7, i) for i in reversed(range(50))][::-1]
    assert forward == backward
    assert other.train_prompt(7, 13) == forward[13]
    assert [p.index for p in forward] == list(range(50))
    different_seed = [task.train_prompt(8, i).text for i in range(50)]
    assert different_seed != [p.text for p in forward]


def test_arithmetic_ground_truth_and_operand_digits() -> None:
    for name, op in (("addition", "+"), ("multiplication", "*")):
        task = make_task(TaskConfig(name=name, digits=2))
        for i in range(200):
            prompt = task.train_prompt(0, i)
            match = re.fullmatch(r"(\d+)([+*])(\d+)=", prompt.text)
            assert match is not None, prompt
            a, b = int(match.group(1)), int(match.group(3))
            assert match.group(2) == op
            assert 10 <= a <= 99 and 10 <= b <= 99
            assert int(prompt.ground_truth) == (a + b if op == "+" else a * b)
    assert operand_range(1) == (0, 9)
    assert operand_range(3) == (100, 999)


def test_string_tasks_ground_truth() -> None:
    reverse = make_task(TaskConfig(name="reverse", digits=5)).train_prompt(0, 0)
    word = reverse.text.removeprefix("rev:").removesuffix("=")
    assert len(word) == 5 and word.isalpha() and word.islower()
    assert reverse.ground_truth == word[::-1]
    sort = make_task(TaskConfig(name="sort", digits=5)).train_prompt(0, 0)
    word = sort.text.removeprefix("sort:").removesuffix("=")
    assert sort.ground_truth == "".join(sorted(word))


@pytest.mark.parametrize("word_length", [1, 2, 3])
def test_repeat_answers_spell_the_word_n_times_with_a_long_tail(word_length: int) -> None:
    """Issue 39's long-tail task: p99 / median response length >= 4, at most 48 answer
    characters (49 tokens with EOS under the char tokenizer), every answer the word n times."""
    task = make_task(TaskConfig(name="repeat", digits=word_length))
    lengths = []
    for i in range(20_000):
        prompt = task.train_prompt(0, i)
        match = re.fullmatch(r"rep:([a-z]+)\*(\d+)=", prompt.text)
        assert match is not None, prompt
        word, n = match.group(1), int(match.group(2))
        assert len(word) == word_length and prompt.ground_truth == word * n
        lengths.append(len(prompt.ground_truth) + 1)  # + EOS
    tokens = np.array(lengths)
    median, p99 = np.median(tokens), np.percentile(tokens, 99)
    assert p99 / median >= 4, (median, p99)
    counts, probabilities = repeat_counts(word_length)
    assert counts[-1] * word_length <= REPEAT_MAX_CHARS < (counts[-1] + 1) * word_length
    assert probabilities.sum() == pytest.approx(1.0) and (np.diff(probabilities) < 0).all()
    if word_length == 2:  # the default: median 5 tokens, p99 45, max 49
        assert (median, p99, tokens.max()) == (5, 45, 49)


@pytest.mark.parametrize("name", PROCEDURAL)
def test_eval_split_is_disjoint_from_training(name: str) -> None:
    task = make_task(TaskConfig(name=name, digits=2))
    eval_prompts = task.eval_prompts(64)
    eval_texts = {p.text for p in eval_prompts}
    assert len(eval_texts) == 64  # distinct
    assert all(is_held_out(name, text) for text in eval_texts)
    for seed in (0, 1):
        train_texts = {task.train_prompt(seed, i).text for i in range(3000)}
        assert not train_texts & eval_texts
        assert not any(is_held_out(name, text) for text in train_texts)


def test_eval_prompts_are_fixed_and_prefix_stable() -> None:
    task = make_task(TaskConfig(name="addition", digits=2))
    long = task.eval_prompts(64)
    assert make_task(TaskConfig(name="addition", digits=2)).eval_prompts(10) == long[:10]
    assert [p.index for p in long] == list(range(64))


def test_held_out_fraction_is_about_one_in_eight() -> None:
    texts = [f"{a}+{b}=" for a in range(10, 100) for b in range(10, 100)]
    fraction = sum(is_held_out("addition", t) for t in texts) / len(texts)
    assert 0.10 < fraction < 0.15  # EVAL_MODULUS = 8 -> 0.125 expected over 8100 problems


def test_too_small_problem_space_for_eval_size_is_an_error() -> None:
    # 1-digit addition has 100 problems, about 12 held out: 64 cannot be found.
    task = make_task(TaskConfig(name="addition", digits=1))
    with pytest.raises(ValueError, match="eval_size"):
        task.eval_prompts(64)


def test_negative_seed_is_rejected() -> None:
    with pytest.raises(ValueError, match="seed"):
        make_task(TaskConfig()).train_prompt(-1, 0)


# --- file task -----------------------------------------------------------------------------


def _rows(n: int) -> list[dict[str, str]]:
    return [{"prompt": f"q{i}=", "ground_truth": str(i)} for i in range(n)]


def _write(rows: list[dict], path: Path) -> Path:
    if path.suffix == ".parquet":
        pd.DataFrame(rows).to_parquet(path)
    else:
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_file_task_tail_is_held_out_and_stream_shuffles_train_rows(
    tmp_path: Path, suffix: str
) -> None:
    path = _write(_rows(20), tmp_path / f"data{suffix}")
    task = make_task(TaskConfig(name="file", path=str(path), eval_size=5))
    assert task.eval_prompts(5) == [Prompt(i, f"q{15 + i}=", str(15 + i)) for i in range(5)]
    first_epoch = [task.train_prompt(3, i) for i in range(15)]
    # Each epoch is a permutation of the 15 training rows, and differs from file order.
    assert sorted(p.text for p in first_epoch) == sorted(f"q{i}=" for i in range(15))
    assert [p.text for p in first_epoch] != [f"q{i}=" for i in range(15)]
    second_epoch = [task.train_prompt(3, 15 + i).text for i in range(15)]
    assert sorted(second_epoch) == sorted(p.text for p in first_epoch)
    assert second_epoch != [p.text for p in first_epoch]
    again = FileTask.from_path(path, eval_size=5)
    assert [again.train_prompt(3, i) for i in reversed(range(15))][::-1] == first_epoch
    with pytest.raises(ValueError, match="eval_size"):
        task.eval_prompts(6)


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_file_task_split_column_and_verl_format(tmp_path: Path, suffix: str) -> None:
    rows = [
        {
            "prompt": [{"role": "user", "content": f"q{i}="}],
            "reward_model": {"ground_truth": str(i), "style": "rule"},
            "split": "test" if i % 4 == 0 else "train",
        }
        for i in range(12)
    ]
    rows.append({**rows[0], "split": "train"})  # a train copy of an eval prompt is dropped
    path = _write(rows, tmp_path / f"verl{suffix}")
    task = make_task(TaskConfig(name="file", path=str(path), eval_size=3))
    assert [p.text for p in task.eval_prompts(3)] == ["q0=", "q4=", "q8="]
    assert task.eval_prompts(3)[1].ground_truth == "4"
    train_texts = {task.train_prompt(0, i).text for i in range(9)}
    assert train_texts == {f"q{i}=" for i in range(12) if i % 4}


def test_file_task_errors_name_the_problem(tmp_path: Path) -> None:
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(FileNotFoundError, match=r"nope\.jsonl"):
        FileTask.from_path(missing, eval_size=1)
    bad = _write([{"question": "x", "ground_truth": "1"}], tmp_path / "bad.jsonl")
    with pytest.raises(ValueError, match="`prompt`"):
        FileTask.from_path(bad, eval_size=1)
    small = _write(_rows(3), tmp_path / "small.jsonl")
    with pytest.raises(ValueError, match="too few"):
        FileTask.from_path(small, eval_size=3)
