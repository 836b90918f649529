"""Verifiers (normalisation rule, junk before/after), the verifier registry, task config checks
and reward functions by import path."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

from harness.config import ConfigError, TaskConfig, validate_config
from harness.tasks.gsm8k import Gsm8kVerifier
from harness.tasks.math_answer import MathVerifier
from harness.tasks.rewards import (
    RewardFnError,
    exact_match,
    integer_match,
    load_reward_fn,
    make_reward_fn,
    normalize_response,
)


@pytest.mark.parametrize(
    ("response", "reward"),
    [
        ("46", 1.0),
        ("  46  ", 1.0),  # surrounding whitespace
        ("46\n99", 1.0),  # the response ends at the newline
        ("046", 1.0),  # compared as integers
        ("+46", 1.0),
        ("46 is it", 1.0),  # trailing junk after the last digit is ignored
        ("46abc", 1.0),
        ("460", 0.0),  # the digit run is the answer: 460 != 46
        ("45", 0.0),
        ("x46", 0.0),  # junk before the answer
        ("= 46", 0.0),
        ("-46", 0.0),
        ("", 0.0),
        ("\n46", 0.0),  # empty before the newline
    ],
)
def test_integer_match(response: str, reward: float) -> None:
    value, info = integer_match(response, "46")
    assert value == reward
    assert info["correct"] is (reward == 1.0)
    json.dumps(info)  # stored as reward_info JSON


def test_integer_match_reports_parse_and_trailing() -> None:
    assert integer_match("46 x", "46")[1] == {
        "correct": True,
        "parsed": "46",
        "reason": "match",
        "trailing": True,
    }
    assert integer_match("abc", "46")[1]["reason"] == "no_leading_integer"
    assert integer_match("-3", "-3")[0] == 1.0  # negative ground truths parse too


@pytest.mark.parametrize(
    ("response", "reward"),
    [("cba", 1.0), (" cba ", 1.0), ("cba\nzz", 1.0), ("cbax", 0.0), ("cb", 0.0), ("", 0.0)],
)
def test_exact_match(response: str, reward: float) -> None:
    assert exact_match(response, "cba")[0] == reward


def test_normalize_response_keeps_the_first_line() -> None:
    # Special tokens never reach a verifier (tokenizer.response_text strips them), so the
    # normaliser knows no token strings: only the first line, stripped.
    assert normalize_response(" ab \ncd") == "ab"
    assert normalize_response("ab") == "ab"


@pytest.fixture
def reward_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    source = (
        "def length_reward(response, ground_truth):\n"
        "    return min(1.0, len(response) / 4)\n"
        "def with_info(response, ground_truth):\n"
        "    return 0.5, {'why': 'half'}\n"
        "def nan_reward(response, ground_truth):\n"
        "    return float('nan')\n"
        "class Scorers:\n"
        "    @staticmethod\n"
        "    def one(response, ground_truth):\n"
        "        return 1\n"
        "NOT_CALLABLE = 3\n"
    )
    (tmp_path / "my_rewards.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "my_rewards"
    sys.modules.pop("my_rewards", None)


def test_load_reward_fn_good_paths(reward_module: str) -> None:
    assert load_reward_fn(f"{reward_module}:length_reward")("ab", "x") == (
        0.5,  # len("ab") / 4
        {"reward_fn": f"{reward_module}:length_reward"},
    )
    reward, info = load_reward_fn(f"{reward_module}:with_info")("", "")
    assert (reward, info["why"]) == (0.5, "half")
    assert load_reward_fn(f"{reward_module}:Scorers.one")("", "")[0] == 1.0
    config = TaskConfig(reward_fn=f"{reward_module}:length_reward")
    assert make_reward_fn(config)("abcd", "")[0] == 1.0


def test_load_reward_fn_bad_paths_name_the_path(reward_module: str) -> None:
    with pytest.raises(RewardFnError, match="no_such_module_xyz:f"):
        load_reward_fn("no_such_module_xyz:f")
    with pytest.raises(RewardFnError, match="has no 'missing'"):
        load_reward_fn(f"{reward_module}:missing")
    with pytest.raises(RewardFnError, match="not a callable"):
        load_reward_fn(f"{reward_module}:NOT_CALLABLE")
    with pytest.raises(RewardFnError, match="module:function"):
        load_reward_fn("no_colon")
    with pytest.raises(RewardFnError, match="non-finite"):
        load_reward_fn(f"{reward_module}:nan_reward")("", "")


def test_default_reward_fn_is_the_task_verifier() -> None:
    assert make_reward_fn(TaskConfig(name="addition")) is integer_match
    assert make_reward_fn(TaskConfig(name="sort")) is exact_match
    assert make_reward_fn(TaskConfig(name="file", path="x.jsonl")) is exact_match
    assert not math.isnan(make_reward_fn(TaskConfig())("12", "12")[0])


def test_verifier_is_chosen_by_name() -> None:
    file_task = {"name": "file", "path": "x.jsonl"}
    assert make_reward_fn(TaskConfig(**file_task, verifier="integer")) is integer_match
    assert make_reward_fn(TaskConfig(name="addition", verifier="exact")) is exact_match
    gsm8k = make_reward_fn(TaskConfig(**file_task, verifier="gsm8k", gsm8k_mode="flexible"))
    assert isinstance(gsm8k, Gsm8kVerifier) and gsm8k.mode == "flexible"
    assert gsm8k("so it is 7 in all", "7")[0] == 1.0
    math_verifier = make_reward_fn(TaskConfig(**file_task, verifier="math", math_timeout_s=3))
    assert isinstance(math_verifier, MathVerifier)
    assert math_verifier.worker.timeout_s == 3.0  # the worker only starts on a first check


def _task_error(task: dict) -> str:
    arms = [{"name": "grpo", "objective": "grpo"}]
    with pytest.raises(ConfigError) as raised:
        validate_config({"arms": arms, "task": task})
    return str(raised.value)


def test_task_config_errors_name_the_field() -> None:
    assert "task.verifier" in _task_error({"verifier": "regex"})
    assert "task.gsm8k_mode" in _task_error({"verifier": "gsm8k", "gsm8k_mode": "lenient"})
    assert "task.math_timeout_s" in _task_error({"verifier": "math", "math_timeout_s": 0})
    assert "task.prompt_format" in _task_error({"prompt_format": "jinja"})
    assert "task.system_prompt" in _task_error({"system_prompt": "  "})
    both = _task_error({"verifier": "exact", "reward_fn": "my.module:score"})
    assert "task.reward_fn" in both and "task.verifier" in both
