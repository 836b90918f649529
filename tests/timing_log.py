"""Where the suite's time goes: `TESTS_TIMING_LOG=FILE pytest -n 2 --dist loadscope` makes the
controller write one JSON line per test phase (tests/conftest.py); `python -m tests.timing_log
FILE...` prints each worker's busy seconds and when it finished, and the slowest modules
(setup + call + teardown), to see what to cut or share.

`--write tests/module_seconds.json` also stores each module's seconds (the mean over the logs
given) for the suite's order: tests/conftest.py hands the longest modules to the workers first.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path


def summary(lines: list[str], top: int = 25) -> str:
    entries = [json.loads(line) for line in lines if line.strip()]
    start = min(entry["t"] - entry["d"] for entry in entries)
    busy: dict[str, float] = defaultdict(float)
    end: dict[str, float] = defaultdict(float)
    for entry in entries:
        busy[entry["w"]] += entry["d"]
        end[entry["w"]] = max(end[entry["w"]], entry["t"] - start)
    modules = module_seconds(lines)
    out = [f"{w}: busy {busy[w]:.0f} s, done at {end[w]:.0f} s" for w in sorted(busy)]
    out.append(f"total {sum(modules.values()):.0f} worker-seconds; slowest modules:")
    for module, seconds in sorted(modules.items(), key=lambda kv: -kv[1])[:top]:
        out.append(f"{seconds:8.1f}  {module}")
    return "\n".join(out)


def module_seconds(lines: list[str]) -> dict[str, float]:
    """Seconds per test module (its tests' setup + call + teardown) in one log."""
    modules: dict[str, float] = defaultdict(float)
    for line in lines:
        if line.strip():
            entry = json.loads(line)
            modules[entry["id"].split("::", 1)[0]] += entry["d"]
    return dict(modules)


def mean_module_seconds(logs: list[list[str]]) -> dict[str, float]:
    """Each module's mean over the logs that ran it, rounded to 0.1 s, longest first."""
    runs: dict[str, list[float]] = defaultdict(list)
    for lines in logs:
        for module, seconds in module_seconds(lines).items():
            runs[module].append(seconds)
    means = {module: round(sum(s) / len(s), 1) for module, s in runs.items()}
    return dict(sorted(means.items(), key=lambda kv: (-kv[1], kv[0])))


# A module the table does not hold yet (added since it was written) counts this much per test.
UNKNOWN_SECONDS_PER_TEST = 0.3


def longest_first(modules: list[str], known: dict[str, float]) -> list[str]:
    """The distinct modules of `modules` (one per collected test), longest first: by `known`
    seconds, else UNKNOWN_SECONDS_PER_TEST per test; ties by name. Handed out in this order, the
    long modules start early and the short ones fill in at the end (longest processing time
    first), so neither worker finishes the suite alone."""
    counts: dict[str, int] = defaultdict(int)
    for module in modules:
        counts[module] += 1

    def seconds(module: str) -> float:
        return known.get(module, UNKNOWN_SECONDS_PER_TEST * counts[module])

    return sorted(counts, key=lambda module: (-seconds(module), module))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("logs", nargs="+", type=Path, help="TESTS_TIMING_LOG files")
    parser.add_argument("--write", type=Path, help="store the modules' mean seconds here")
    args = parser.parse_args()
    logs = [path.read_text().splitlines() for path in args.logs]
    for path, lines in zip(args.logs, logs, strict=True):
        print(f"== {path}\n{summary(lines)}")
    if args.write is not None:
        args.write.write_text(json.dumps(mean_module_seconds(logs), indent=1) + "\n")
        print(f"wrote {args.write}")


if __name__ == "__main__":
    main()
