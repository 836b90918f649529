"""The long-format summary table: every number the report shows, one row each.

Columns: section, arm, lag, comparison, statistic, value, ci_low, ci_high, n, note, and two
typed keys a row carries where it has them: `budget` (the number of configurations tried a
tuning row is at; its `comparison` says 'budget 3' for the reader) and `seeds` (the seeds a row
lists, as integers; its note lists them for the reader). Text is written for readers and never
parsed back: a number a section reads from the frame is in a typed column. The Markdown and
HTML tables are pivots of this frame, so the Parquet file and the report cannot disagree.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TypedDict, Unpack

import pandas as pd

from analysis.stats import Interval

SUMMARY_COLUMNS = [
    "section",
    "arm",
    "lag",
    "comparison",
    "statistic",
    "value",
    "ci_low",
    "ci_high",
    "n",
    "note",
    "budget",
    "seeds",
]
_DTYPES = {
    "section": "string",
    "arm": "string",
    "comparison": "string",
    "statistic": "string",
    "lag": "Int64",
    "value": "float64",
    "ci_low": "float64",
    "ci_high": "float64",
    "n": "Int64",
    "note": "string",
    "budget": "Int64",
    "seeds": "object",  # a list of ints, or None
}


def row(
    section: str,
    statistic: str,
    value: float,
    *,
    arm: str | None = None,
    lag: int | None = None,
    comparison: str | None = None,
    ci_low: float = math.nan,
    ci_high: float = math.nan,
    n: int | None = None,
    note: str = "",
    budget: int | None = None,
    seeds: Sequence[int] | None = None,
) -> dict:
    """One summary row; `arm`/`lag`/`comparison`/`budget`/`seeds` are None where they do not
    apply."""
    return {
        "section": section,
        "arm": arm,
        "lag": lag,
        "comparison": comparison,
        "statistic": statistic,
        "value": float(value),
        "ci_low": float(ci_low),
        "ci_high": float(ci_high),
        "n": n,
        "note": note,
        "budget": budget,
        "seeds": None if seeds is None else [int(s) for s in seeds],
    }


class CellKeys(TypedDict, total=False):
    """Which cell an interval row is about: the keys of `row` an `Interval` does not carry."""

    arm: str | None
    lag: int | None
    comparison: str | None


def interval_row(
    section: str, statistic: str, interval: Interval, **keys: Unpack[CellKeys]
) -> dict:
    """A summary row from a bootstrap `Interval`; `keys` go to `row` as they are."""
    return row(
        section,
        statistic,
        interval.value,
        ci_low=interval.low,
        ci_high=interval.high,
        n=interval.n,
        note=interval.note,
        **keys,
    )


def to_frame(rows: list[dict]) -> pd.DataFrame:
    """Rows to a frame with fixed column order and nullable dtypes (lag and n may be absent)."""
    frame = pd.DataFrame(rows, columns=SUMMARY_COLUMNS)
    return frame.astype(_DTYPES)
