"""Verifiable rewards: the named verifiers (`task.verifier`) and user functions by import path.

Every reward function has the signature `(response, ground_truth) -> (reward, info)` (the
`RewardFn` protocol of harness.tasks.base): `response` is the decoded response with special
tokens removed (`harness.models.tokenizer.response_text`: EOS decides `finish_reason`, never the
reward), `reward` a finite float, `info` a JSON-serialisable dict that the rollout record stores
as `reward_info` (design section 4). Rollouts and evals build theirs with `make_reward_fn` from
the same TaskConfig, so both score alike.

Verifiers (`VERIFIERS`; `auto` picks `integer` for addition and multiplication, else `exact`).
The first two read the normalised response (`normalize_response`): its first line, surrounding
whitespace stripped.
- `integer`: the answer is the integer that *starts* the normalised response (`[+-]?[0-9]+`,
  compared as an integer, so `046` equals `46`). Anything but whitespace before it gives 0 (a
  verifier that searched for the first number anywhere would reward `12+34=46` echoes and
  guessing lists). Text after the integer's last digit is ignored and reported as `trailing`:
  EOS is taught by the warm start and visible in `finish_reason`, so the reward does not
  double-count it.
- `exact`: the normalised response must equal the stripped ground truth exactly.
- `gsm8k`: the `#### N` answer or the last number (harness.tasks.gsm8k).
- `math`: the last `\\boxed{...}`, equivalence by math-verify (harness.tasks.math_answer).
Rewards are 0 or 1.
"""

from __future__ import annotations

import importlib
import math
import re
from collections.abc import Callable
from typing import Any

from harness.config import TaskConfig, VerifierName
from harness.tasks.base import RewardFn, RewardInfo
from harness.tasks.gsm8k import Gsm8kVerifier
from harness.tasks.math_answer import MathVerifier

_LEADING_INTEGER = re.compile(r"[+-]?[0-9]+")


class RewardFnError(ValueError):
    """`task.reward_fn` cannot be loaded or returned something unusable; names the path."""


def normalize_response(response: str) -> str:
    """The first line of the response, surrounding whitespace stripped."""
    return response.split("\n", 1)[0].strip()


def integer_match(response: str, ground_truth: str) -> tuple[float, RewardInfo]:
    """1 if the normalised response starts with the expected integer, else 0 (module rule)."""
    text = normalize_response(response)
    match = _LEADING_INTEGER.match(text)
    if match is None:
        return 0.0, {"correct": False, "parsed": None, "reason": "no_leading_integer"}
    parsed = int(match.group())
    correct = parsed == int(ground_truth.strip())
    info: RewardInfo = {
        "correct": correct,
        "parsed": str(parsed),  # str: JSON readers lose precision on huge ints
        "reason": "match" if correct else "wrong_value",
        "trailing": text[match.end() :] != "",
    }
    return float(correct), info


def exact_match(response: str, ground_truth: str) -> tuple[float, RewardInfo]:
    """1 if the normalised response equals the stripped ground truth, else 0."""
    text = normalize_response(response)
    correct = text == ground_truth.strip()
    return float(correct), {"correct": correct, "reason": "match" if correct else "mismatch"}


# task.verifier -> builder of the verifier from the task config.
VERIFIERS: dict[VerifierName, Callable[[TaskConfig], RewardFn]] = {
    "exact": lambda c: exact_match,
    "integer": lambda c: integer_match,
    "gsm8k": lambda c: Gsm8kVerifier(c.gsm8k_mode),
    "math": lambda c: MathVerifier(c.math_timeout_s),
}
# task.name -> the verifier `auto` resolves to (today's built-in exact verifiers).
AUTO_VERIFIERS: dict[str, VerifierName] = {
    "addition": "integer",
    "multiplication": "integer",
    "reverse": "exact",
    "sort": "exact",
    "repeat": "exact",
    "file": "exact",
}


def verifier_name(config: TaskConfig) -> VerifierName:
    """The verifier `task.verifier` names, `auto` resolved by task name."""
    return AUTO_VERIFIERS[config.name] if config.verifier == "auto" else config.verifier


def _resolve(path: str) -> Any:
    module_name, _, attribute = path.partition(":")
    if not module_name or not attribute:
        raise RewardFnError(f"task.reward_fn={path!r} must look like `package.module:function`")
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise RewardFnError(
            f"task.reward_fn={path!r}: cannot import module {module_name!r} ({exc}); "
            "check it is installed or on PYTHONPATH"
        ) from exc
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise RewardFnError(f"task.reward_fn={path!r}: {module_name!r} has no {attribute!r}")
        target = getattr(target, part)
    return target


class ImportedReward:
    """A user reward function, checked on every call: result must be finite.

    It gets the decoded response with special tokens removed and no other normalisation, and may
    return a number or a `(number, info dict)` pair; the path is added to info as `reward_fn`.
    """

    def __init__(self, fn: Callable[..., Any], path: str) -> None:
        self._fn = fn
        self.path = path

    def __call__(self, response: str, ground_truth: str) -> tuple[float, RewardInfo]:
        result = self._fn(response, ground_truth)
        value, info = result if isinstance(result, tuple) else (result, {})
        try:
            reward = float(value)
        except (TypeError, ValueError) as exc:
            raise RewardFnError(
                f"task.reward_fn={self.path!r} returned {value!r}; it must return a number "
                "or (number, dict)"
            ) from exc
        if not math.isfinite(reward):
            raise RewardFnError(f"task.reward_fn={self.path!r} returned a non-finite {reward}")
        return reward, {**dict(info), "reward_fn": self.path}


def load_reward_fn(path: str) -> RewardFn:
    """Import `package.module:function` (attribute may be dotted) as a checked reward function."""
    target = _resolve(path)
    if not callable(target):
        raise RewardFnError(
            f"task.reward_fn={path!r} is a {type(target).__name__}, not a callable "
            "`(response, ground_truth) -> float`"
        )
    return ImportedReward(target, path)


def make_reward_fn(config: TaskConfig) -> RewardFn:
    """`task.reward_fn` if set, else the verifier `task.verifier` names (`auto`: by task)."""
    if config.reward_fn is not None:
        return load_reward_fn(config.reward_fn)
    return VERIFIERS[verifier_name(config)](config)
