"""GSM8K and MATH verifiers on hand-written responses, and the MATH check's time bound."""

from __future__ import annotations

import json
import threading
import time

import pytest

from harness.tasks.gsm8k import Gsm8kVerifier, extract_answer, parse_ground_truth
from harness.tasks.math_answer import MathVerifier, last_boxed

STRICT, FLEXIBLE = Gsm8kVerifier("strict"), Gsm8kVerifier("flexible")


@pytest.mark.parametrize(
    ("response", "truth", "strict", "flexible"),
    [
        ("3 + 4 = 7 apples, 7 * 10 = 70, plus 2.\n#### 72", "72", 1.0, 1.0),
        ("#### 1,000", "1000", 1.0, 1.0),  # thousands comma removed
        ("#### 1000", "1,000", 1.0, 1.0),  # ... on the ground truth side too
        ("#### $1,234.50", "1234.5", 1.0, 1.0),  # `$` removed; 1234.50 = 1234.5 as values
        ("She pays $18.00 in total.", "18", 0.0, 1.0),  # no `####`: strict finds no answer
        ("#### -5", "-5", 1.0, 1.0),  # negative numbers
        ("#### -5", "5", 0.0, 0.0),
        ("he is $-7 short", "-7", 0.0, 1.0),  # sign after `$`
        ("he is -$7 short", "-7", 0.0, 1.0),  # sign before `$`
        ("10-4", "4", 0.0, 1.0),  # `-` after a digit is subtraction: the last number is 4
        ("3,4", "4", 0.0, 1.0),  # `3,4` is not a thousands group: two numbers, last is 4
        ("#### 72, no wait\n#### 73", "73", 1.0, 1.0),  # the last `####` counts
        ("#### 72 apples, 5 left", "72", 1.0, 0.0),  # flexible reads the last number, 5
        ("The answer is 18.", "18", 0.0, 1.0),  # a sentence's full stop is not a decimal point
        ("I do not know", "18", 0.0, 0.0),  # no answer at all
        ("#### ", "18", 0.0, 0.0),
    ],
)
def test_gsm8k_strict_and_flexible(response: str, truth: str, strict: float, flexible: float):
    assert STRICT(response, truth)[0] == strict
    assert FLEXIBLE(response, truth)[0] == flexible


def test_gsm8k_info_names_the_parsed_answer_and_reason() -> None:
    assert STRICT("#### $18.00", "18")[1] == {
        "correct": True,
        "parsed": "18",  # 18.00 normalised
        "reason": "match",
        "mode": "strict",
    }
    assert STRICT("#### 17", "18")[1]["reason"] == "wrong_value"
    reward, info = STRICT("about 18", "18")
    assert (reward, info["parsed"], info["reason"]) == (0.0, None, "no_answer")
    json.dumps(FLEXIBLE("-3", "-3")[1])  # stored as reward_info JSON


def test_gsm8k_ground_truth_forms() -> None:
    assert parse_ground_truth(" 72 ") == 72
    assert parse_ground_truth("Natalia sold 48/2 = 24 clips.\n#### 72") == 72  # full solution
    assert parse_ground_truth("-1,250.5") == -1250.5
    with pytest.raises(ValueError, match=r"task\.verifier=gsm8k.*'seventy'"):
        parse_ground_truth("seventy")
    assert extract_answer("1,000,000 and", "flexible") == 1_000_000


@pytest.mark.parametrize(
    ("text", "boxed"),
    [
        ("so \\boxed{1} or rather \\boxed{\\frac{1}{2}}.", "\\frac{1}{2}"),  # the last box
        ("\\boxed{\\frac{\\sqrt{2}}{2}}", "\\frac{\\sqrt{2}}{2}"),  # nested braces kept
        ("\\boxed{\\{1, 2\\}}", "\\{1, 2\\}"),  # escaped braces are not grouping
        ("\\fbox{3}", "3"),
        ("\\boxed {4}", "4"),
        ("\\boxed{\\frac{1}{2", None),  # cut off at the length limit: no final answer
        ("The answer is 1/2.", None),
        ("\\boxed", None),
    ],
)
def test_last_boxed(text: str, boxed: str | None) -> None:
    assert last_boxed(text) == boxed


@pytest.fixture(scope="module")
def math_verifier():
    verifier = MathVerifier(timeout_s=2.0)
    yield verifier
    verifier.close()


@pytest.mark.parametrize(
    ("response", "truth", "reward", "reason"),
    [
        ("Half: \\boxed{0.5}", "\\frac{1}{2}", 1.0, "match"),  # 0.5 = 1/2
        ("\\boxed{\\frac{1}{2}}", "0.5", 1.0, "match"),
        ("\\boxed{\\dfrac{2}{4}}", "\\frac{1}{2}", 1.0, "match"),
        ("\\boxed{\\frac{1}{3}}", "\\frac{1}{2}", 0.0, "not_equivalent"),
        ("\\boxed{\\frac{\\sqrt{2}}{2}}", "\\frac{1}{\\sqrt{2}}", 1.0, "match"),  # nested braces
        ("\\boxed{\\{2, 1\\}}", "\\{1,2\\}", 1.0, "match"),  # sets compare unordered
        ("\\boxed{-3}", "-3", 1.0, "match"),
        ("\\boxed{3}", "-3", 0.0, "not_equivalent"),
        ("\\boxed{1,000}", "1000", 1.0, "match"),
        ("It is 0.5.", "\\frac{1}{2}", 0.0, "no_boxed"),  # no answer
        ("\\boxed{5}", "so the answer is $\\boxed{5}$", 1.0, "match"),  # truth as a solution
    ],
)
def test_math_verifier(math_verifier, response: str, truth: str, reward: float, reason: str):
    value, info = math_verifier(response, truth)
    assert (value, info["reason"]) == (reward, reason)
    assert info["correct"] is (reward == 1.0)
    json.dumps(info)


def test_pathological_math_answer_times_out_and_the_worker_recovers() -> None:
    # 9^(9^(9^9)) has about 10^(3.7e8) digits: sympy evaluates it exactly and never finishes.
    verifier = MathVerifier(timeout_s=1.0)
    try:
        assert verifier("\\boxed{2}", "2")[0] == 1.0  # worker started (startup not timed)
        started = time.monotonic()
        reward, info = verifier("\\boxed{9^{9^{9^{9}}}}", "1")
        elapsed = time.monotonic() - started
        assert (reward, info["reason"], info["parsed"]) == (0.0, "timeout", "9^{9^{9^{9}}}")
        assert 1.0 <= elapsed < 2.0  # the limit, plus killing and reaping the worker
        assert verifier("\\boxed{0.25}", "\\frac{1}{4}")[0] == 1.0  # a fresh worker takes over
    finally:
        verifier.close()


def test_math_timeout_holds_off_the_main_thread() -> None:
    # math-verify's own SIGALRM timeout raises outside the main thread; the worker process
    # bound does not care which thread asks.
    verifier = MathVerifier(timeout_s=1.0)
    results: list[tuple[float, str, float]] = []

    def check() -> None:
        for response in ("\\boxed{10^{10^{8}}}", "\\boxed{0.5}"):
            started = time.monotonic()
            reward, info = verifier(response, "\\frac{1}{2}")
            results.append((reward, info["reason"], time.monotonic() - started))

    thread = threading.Thread(target=check)
    try:
        assert verifier("\\boxed{2}", "2")[0] == 1.0  # worker started (startup not timed)
        thread.start()
        thread.join(timeout=30)
        assert not thread.is_alive()
    finally:
        verifier.close()
    (slow_reward, slow_reason, slow_s), (ok_reward, ok_reason, _) = results
    assert (slow_reward, slow_reason) == (0.0, "timeout")
    assert 1.0 <= slow_s < 2.0
    assert (ok_reward, ok_reason) == (1.0, "match")
