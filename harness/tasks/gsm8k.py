"""The GSM8K verifier: a numeric final answer, read the way verl's GSM8K reward reads it.

Two modes (`task.gsm8k_mode`), after verl's `gsm8k.extract_solution`:
- `strict` (default, verl's default): the number right after the last `####` marker. A response
  that reasons well but never writes `#### N` scores 0, so the reward also teaches the format.
- `flexible`: the last number anywhere in the response (lenient; rewards any answer layout, and
  also a response that merely ends on the right number).

A number is an optional minus sign, an optional `$`, then digits with optional thousands commas
(`1,234,567`) and an optional decimal part. `,` and `$` are removed and the value is compared
exactly as a Decimal, so `1,000` = `1000`, `$18.00` = `18`, and `-5` = `$-5` = `-$5`. Unlike
verl's `[0-9.,]+`, commas must group thousands (`3,4` is two numbers, not 34), and a minus sign
directly after a letter, digit or closing bracket is an operator, not a sign (`10-4` ends on 4).
A ground truth is a number in the same notation, or a full GSM8K solution ending in `#### N`.
"""

from __future__ import annotations

import re
from decimal import Decimal

from harness.config import Gsm8kMode
from harness.tasks.base import RewardInfo

MARKER = "####"
_NUMBER = (
    r"(?P<minus>(?<![\w)\]])-)?(?:\$(?P<minus_after>-)?)?"
    r"(?P<integer>\d{1,3}(?:,\d{3})+|\d+)(?P<fraction>\.\d+)?(?!\d)"
)
NUMBER = re.compile(_NUMBER)
AFTER_MARKER = re.compile(re.escape(MARKER) + r"\s*" + _NUMBER)


def _value(match: re.Match[str]) -> Decimal:
    digits = match.group("integer").replace(",", "") + (match.group("fraction") or "")
    negative = match.group("minus") is not None or match.group("minus_after") is not None
    return -Decimal(digits) if negative else Decimal(digits)


def extract_answer(text: str, mode: Gsm8kMode) -> Decimal | None:
    """The response's final answer under `mode`, or None when it has none."""
    pattern = AFTER_MARKER if mode == "strict" else NUMBER
    last = None
    for last in pattern.finditer(text):  # noqa: B007 - the last match is the answer
        pass
    return None if last is None else _value(last)


def parse_ground_truth(ground_truth: str) -> Decimal:
    """A GSM8K ground truth (`72`, `1,000`, or a solution ending `#### 72`) as a number."""
    text = ground_truth.strip()
    if MARKER in text:
        text = text.rsplit(MARKER, 1)[1].strip()
    match = NUMBER.fullmatch(text)
    if match is None:
        raise ValueError(
            f"task.verifier=gsm8k: ground truth {ground_truth!r} is not a number; GSM8K ground "
            "truths are numbers like `72` (verl's reward_model.ground_truth)"
        )
    return _value(match)


def _show(value: Decimal) -> str:
    """A stable text form for reward_info: `18.00` -> `18`, `0.50` -> `0.5`."""
    text = format(value.normalize(), "f")
    return "0" if text == "-0" else text


class Gsm8kVerifier:
    """`(response, ground_truth) -> (reward, info)`: 1 when the extracted answer equals the truth.

    info: `correct`, `parsed` (the answer as text, None when missing), `mode`, and `reason`
    (`match`, `wrong_value` or `no_answer`).
    """

    def __init__(self, mode: Gsm8kMode = "strict") -> None:
        self.mode: Gsm8kMode = mode

    def __call__(self, response: str, ground_truth: str) -> tuple[float, RewardInfo]:
        truth = parse_ground_truth(ground_truth)
        answer = extract_answer(response, self.mode)
        if answer is None:
            info: RewardInfo = {"correct": False, "parsed": None, "reason": "no_answer"}
            return 0.0, {**info, "mode": self.mode}
        correct = answer == truth
        info = {
            "correct": correct,
            "parsed": _show(answer),
            "reason": "match" if correct else "wrong_value",
            "mode": self.mode,
        }
        return float(correct), info
