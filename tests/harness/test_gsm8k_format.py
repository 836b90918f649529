"""The locally generated GSM8K-format data: verl's columns, correct answers, determinism."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from harness.config import TaskConfig
from harness.models.chat_warm_start import file_solutions, prompt_key
from harness.tasks.file_task import FileTask
from harness.tasks.gsm8k_format import (
    COLUMNS,
    INSTRUCTION,
    gsm8k_format_frame,
    write_gsm8k_format,
)
from harness.tasks.rewards import make_reward_fn

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "data" / "gsm8k_format.parquet"
EQUATION = re.compile(r"(\d+) ([-+*]) (\d+) = (\d+)")
OPERATIONS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


@pytest.fixture(scope="module")
def frame() -> pd.DataFrame:
    return gsm8k_format_frame(seed=0, train_size=400, test_size=50)


def test_rows_have_verls_gsm8k_columns(frame: pd.DataFrame) -> None:
    assert list(frame.columns) == list(COLUMNS)
    assert frame["split"].value_counts().to_dict() == {"train": 400, "test": 50}
    for row in frame.itertuples():
        assert row.data_source == "harness/gsm8k_format"
        assert row.ability == "math"
        assert [m["role"] for m in row.prompt] == ["user"]
        assert row.prompt[0]["content"].endswith(" " + INSTRUCTION)
        assert row.reward_model["style"] == "rule"
        assert row.extra_info["split"] == row.split
        assert row.prompt[0]["content"].startswith(row.extra_info["question"])
    indices = frame.groupby("split")["extra_info"].apply(lambda s: [e["index"] for e in s])
    assert indices["train"] == list(range(400)) and indices["test"] == list(range(50))


def test_every_solution_is_correct_arithmetic_ending_in_the_answer(frame: pd.DataFrame) -> None:
    for row in frame.itertuples():
        solution, truth = row.extra_info["answer"], row.reward_model["ground_truth"]
        equations = EQUATION.findall(solution)
        assert equations, solution
        for left, op, right, result in equations:
            assert OPERATIONS[op](int(left), int(right)) == int(result), solution
        assert equations[-1][3] == truth
        assert solution.endswith(f"\n#### {truth}")
        # The question's numbers are the operands the solution works with.
        operands = {int(n) for eq in equations for n in (eq[0], eq[2])}
        assert {int(n) for n in re.findall(r"\d+", row.extra_info["question"])} <= operands


def test_gsm8k_verifier_scores_the_solutions(frame: pd.DataFrame) -> None:
    reward_fn = make_reward_fn(TaskConfig(name="file", path=str(SHIPPED), verifier="gsm8k"))
    for row in frame.head(40).itertuples():
        truth = row.reward_model["ground_truth"]
        assert reward_fn(row.extra_info["answer"], truth)[0] == 1.0
        assert reward_fn(f"#### {int(truth) + 1}", truth)[0] == 0.0


def test_deterministic_from_the_seed_and_splits_disjoint(frame: pd.DataFrame) -> None:
    pd.testing.assert_frame_equal(frame, gsm8k_format_frame(seed=0, train_size=400, test_size=50))
    other = gsm8k_format_frame(seed=1, train_size=400, test_size=50)
    assert list(other["reward_model"]) != list(frame["reward_model"])
    questions = frame["extra_info"].map(lambda e: e["question"])
    assert questions.is_unique
    train = set(questions[frame["split"] == "train"])
    assert not train & set(questions[frame["split"] == "test"])


def test_shipped_file_is_the_generators_default_output() -> None:
    pd.testing.assert_frame_equal(pd.read_parquet(SHIPPED), gsm8k_format_frame())


def test_file_task_reads_the_test_split_as_eval(tmp_path: Path) -> None:
    path = tmp_path / "g.parquet"
    written = write_gsm8k_format(path, seed=3, train_size=30, test_size=6)
    task = FileTask.from_path(path, eval_size=6)
    assert task.num_train == 30
    test_rows = written[written["split"] == "test"]
    evals = task.eval_prompts(6)
    assert [p.ground_truth for p in evals] == [r["ground_truth"] for r in test_rows.reward_model]
    # The warm start finds every training prompt's worked solution.
    solutions = file_solutions(path)
    assert solutions is not None
    for index in range(30):
        prompt = task.train_prompt(0, index)
        assert solutions[prompt_key(prompt)].endswith(f"#### {prompt.ground_truth}")


def test_cli_writes_the_file(tmp_path: Path) -> None:
    out = tmp_path / "cli.parquet"
    args = ["data", "gsm8k-format", str(out), "--seed", "2", "--train-size", "12"]
    result = subprocess.run(
        [sys.executable, "-m", "harness.cli", *args, "--test-size", "4"],
        capture_output=True,
        text=True,
        check=False,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stderr
    expected = gsm8k_format_frame(seed=2, train_size=12, test_size=4)
    pd.testing.assert_frame_equal(pd.read_parquet(out), expected)


def test_impossible_sizes_fail_with_a_message() -> None:
    with pytest.raises(ValueError, match="max_operand"):
        gsm8k_format_frame(max_operand=1)
    with pytest.raises(ValueError, match="distinct problems"):
        gsm8k_format_frame(train_size=100_000, test_size=1, max_operand=2)
