"""A missing model.path or task file, or an unreadable task file: one line naming the field and
the file, a non-zero exit, no traceback, nothing written (they used to print tracebacks)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from harness.cli import app
from harness.config import ConfigError
from harness.tasks.file_task import TaskFileError, TaskFileMissingError, read_table
from tests.harness.trial_helpers import REPO

QUICKSTART = str(REPO / "configs/quickstart.yaml")
TRIAL_ARGS = ["--arm", "gspo", "--seed", "0", "--lag", "0"]
EXPECTED_JSON_ERROR = "Expecting property name enclosed in double quotes at column 20"


# The quickstart's near-miss warm start needs the built-in model on an integer task; these
# tests swap in a model directory or a task file, so they turn it off.
PLAIN_WARM_START = "model.warm_start_near_miss=0"


def _commands(out: Path) -> dict[str, list[str]]:
    return {
        "trial": ["trial", QUICKSTART, *TRIAL_ARGS, "--out", str(out / "t"), PLAIN_WARM_START],
        "run": ["run", QUICKSTART, "--out", str(out / "r"), PLAIN_WARM_START],
    }


def _garbage_jsonl(tmp_path: Path) -> Path:
    path = tmp_path / "tasks.jsonl"
    path.write_text('{"prompt": "1+1=", "ground_truth": "2"}\n\n{"prompt": "2+2=", oops\n')
    return path


def one_line_error(args: list[str]) -> str:
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, (args, result.output, result.exception)
    assert isinstance(result.exception, SystemExit)  # typer.Exit, not an escaped error
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    return lines[0]


@pytest.mark.parametrize("command", ["trial", "run"])
def test_missing_model_path(tmp_path: Path, command: str) -> None:
    missing = tmp_path / "no-model"
    line = one_line_error([*_commands(tmp_path)[command], f"model.path={missing}"])
    assert f"model.path {missing} is not a directory (nothing is there)" in line
    assert not (tmp_path / "t").exists() and not (tmp_path / "r").exists()


@pytest.mark.parametrize("command", ["trial", "run"])
def test_missing_task_file(tmp_path: Path, command: str) -> None:
    missing = tmp_path / "no-tasks.jsonl"
    args = [*_commands(tmp_path)[command], "task.name=file", f"task.path={missing}"]
    assert f"task.path {missing} does not exist" in one_line_error(args)
    assert not (tmp_path / "t").exists() and not (tmp_path / "r").exists()


@pytest.mark.parametrize("command", ["trial", "run"])
def test_garbage_jsonl_names_the_file_and_line(tmp_path: Path, command: str) -> None:
    path = _garbage_jsonl(tmp_path)
    args = [*_commands(tmp_path)[command], "task.name=file", f"task.path={path}"]
    line = one_line_error(args)
    # Line 2 is blank (skipped, as pandas does); on line 3 `{"prompt": "2+2=", ` takes
    # columns 1..19, so the property name json expects after the comma is missing at column 20.
    assert f"task.path {path}: line 3 is not valid JSON ({EXPECTED_JSON_ERROR})" in line


def test_unreadable_task_files_raise_config_errors(tmp_path: Path) -> None:
    not_object = tmp_path / "list.jsonl"
    not_object.write_text('{"prompt": "a", "ground_truth": "b"}\n[1, 2]\n')
    not_parquet = tmp_path / "tasks.parquet"
    not_parquet.write_bytes(b"PAR1 but not really")
    binary = tmp_path / "binary.jsonl"
    binary.write_bytes(b"\xff\xfe{}\n")
    cases = {
        not_object: "line 2 is not a JSON object",
        not_parquet: "is not a Parquet file",
        binary: "line 1 is not UTF-8 text",
    }
    for path, message in cases.items():
        with pytest.raises(TaskFileError, match=message) as caught:
            read_table(path)
        assert isinstance(caught.value, ConfigError) and str(path) in str(caught.value)
    with pytest.raises(TaskFileMissingError) as missing:
        read_table(tmp_path / "absent.jsonl")
    assert isinstance(missing.value, FileNotFoundError)  # still what callers caught before


def test_data_command_reports_an_unwritable_output_in_one_line(tmp_path: Path) -> None:
    args = ["data", "gsm8k-format", str(tmp_path), "--train-size", "2", "--test-size", "1"]
    line = one_line_error(args)  # the output path is a directory
    assert str(tmp_path) in line


def test_no_traceback_from_a_real_process(tmp_path: Path) -> None:
    """The console script itself (not the in-process runner) prints one line to stderr."""
    path = _garbage_jsonl(tmp_path)
    overrides = ["task.name=file", f"task.path={path}"]
    result = subprocess.run(
        [sys.executable, "-m", "harness.cli", *_commands(tmp_path)["run"], *overrides],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [
        f"error: task.path {path}: line 3 is not valid JSON ({EXPECTED_JSON_ERROR})"
    ]
