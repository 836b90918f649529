"""Where the suite's time goes: `TESTS_TIMING_LOG=FILE pytest -n 2 --dist loadscope` makes the
controller write one JSON line per test phase (tests/conftest.py); `python -m tests.timing_log
FILE` prints each worker's busy seconds and when it finished, and the slowest modules
(setup + call + teardown), to see what to cut or share."""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path


def summary(lines: list[str], top: int = 25) -> str:
    entries = [json.loads(line) for line in lines if line.strip()]
    start = min(entry["t"] - entry["d"] for entry in entries)
    busy: dict[str, float] = defaultdict(float)
    end: dict[str, float] = defaultdict(float)
    modules: dict[str, float] = defaultdict(float)
    for entry in entries:
        busy[entry["w"]] += entry["d"]
        end[entry["w"]] = max(end[entry["w"]], entry["t"] - start)
        modules[entry["id"].split("::", 1)[0]] += entry["d"]
    out = [f"{w}: busy {busy[w]:.0f} s, done at {end[w]:.0f} s" for w in sorted(busy)]
    out.append(f"total {sum(modules.values()):.0f} worker-seconds; slowest modules:")
    for module, seconds in sorted(modules.items(), key=lambda kv: -kv[1])[:top]:
        out.append(f"{seconds:8.1f}  {module}")
    return "\n".join(out)


if __name__ == "__main__":
    print(summary(Path(sys.argv[1]).read_text().splitlines()))
