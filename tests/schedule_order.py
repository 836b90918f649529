"""The order the suite's modules are handed to pytest-xdist's workers: longest first.

README (b) runs `-n 2 --dist loadscope`: each worker takes one test module at a time, the next
one whenever it is nearly done. xdist's default order is by number of tests, which puts the
end-to-end modules (few tests, most of the time) last, and one worker then runs the last long
module alone while the other idles (Graham's list scheduling: the finish time is the mean
load plus up to the last job's length). Handing modules out longest first (LPT) bounds that
tail by the shortest of the long jobs. The durations come from one measured run of the suite
(`MODULE_SECONDS_FILE`, written by `python -m tests.schedule_order TIMING_LOG`); a module
missing from it (new since) goes after the measured ones, in collection order. A stale file
only changes how well the two workers are balanced, never what runs.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

import pytest

MODULE_SECONDS_FILE = Path(__file__).with_name("module_seconds.json")


def module_seconds(path: Path = MODULE_SECONDS_FILE) -> dict[str, float]:
    """Measured seconds per test module (`tests/harness/test_trial.py`), {} without a file."""
    return json.loads(path.read_text()) if path.is_file() else {}


def module_of(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


def longest_modules_first(items: list[pytest.Item], seconds: dict[str, float]) -> None:
    """Reorder `items` in place: whole modules, by measured seconds descending; unmeasured
    modules last, in their collection order; tests keep their order inside a module."""
    first_seen: dict[str, int] = {}
    for index, item in enumerate(items):
        first_seen.setdefault(module_of(item), index)
    items.sort(
        key=lambda item: (
            -seconds.get(module_of(item), -1.0),
            first_seen[module_of(item)],
        )
    )


def seconds_from_timing_log(lines: list[str]) -> dict[str, float]:
    """Sum a timing log's setup, call and teardown seconds per module (one JSON object a line:
    `id`, the test's node id, and `d`, a phase's seconds), rounded to 0.1 s."""
    totals: dict[str, float] = defaultdict(float)
    for line in lines:
        entry = json.loads(line)
        totals[entry["id"].split("::", 1)[0]] += entry["d"]
    return {module: round(s, 1) for module, s in sorted(totals.items(), key=lambda kv: -kv[1])}


if __name__ == "__main__":
    log = Path(sys.argv[1]).read_text().splitlines()
    MODULE_SECONDS_FILE.write_text(json.dumps(seconds_from_timing_log(log), indent=1) + "\n")
