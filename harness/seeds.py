"""Seed lists in configs: integers and `range(a,b)`, as `seeds` and `tuning.seeds` take them."""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator

SEED_RANGE = re.compile(r"range\(\s*(-?\d+)\s*,\s*(-?\d+)\s*\)")


def _seed_range(text: str) -> list[int]:
    """`range(a,b)` -> [a, ..., b - 1]; anything else is refused with the forms that work."""
    match = SEED_RANGE.fullmatch(text.strip())
    if match is None:
        raise ValueError(
            f"seeds: {text!r} is neither an integer nor range(a,b); write e.g. "
            "seeds=range(0,12) for seeds 0 to 11, seeds=[0,1,2], or quote ranges inside a "
            'list: seeds=[0,"range(5,9)"]'
        )
    low, high = int(match[1]), int(match[2])
    if high <= low:
        raise ValueError(f"seeds: {text!r} is empty; range(a,b) needs a < b (seeds a to b - 1)")
    return list(range(low, high))


def expand_seed_ranges(value: Any) -> Any:
    """`range(a,b)` strings, alone or as list items, to the integers a .. b - 1 (as Python's
    range); other values are left to the field's own validation."""
    if isinstance(value, str):
        return _seed_range(value)
    if not isinstance(value, list):
        return value
    out: list[Any] = []
    for item in value:
        is_range = isinstance(item, str) and not re.fullmatch(r"\s*-?\d+\s*", item)
        out += _seed_range(item) if is_range else [item]
    return out


def non_negative_seeds(value: list[int]) -> list[int]:
    negative = [seed for seed in value if seed < 0]
    if negative:
        raise ValueError(f"seeds must be >= 0 (they seed numpy's SeedSequence), got {negative[0]}")
    return value


SeedList = Annotated[
    list[int], BeforeValidator(expand_seed_ranges), AfterValidator(non_negative_seeds)
]
"""A config's seeds: `range(a,b)` strings (alone or as list items) expanded, all >= 0."""

__all__ = ["SeedList", "expand_seed_ranges", "non_negative_seeds"]
