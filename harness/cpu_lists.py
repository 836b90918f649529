"""Linux CPU lists (`taskset -c` / cpuset syntax: `0`, `0-3`, `0-1,6`) as sets and back: a
leaf both the config (`executor.cpu_sets`) and the provenance record (a process's CPUs) use."""

from __future__ import annotations


def parse_cpu_list(text: str) -> frozenset[int]:
    """The CPUs of a Linux CPU list (`taskset -c` / cpuset syntax): `0`, `0-3`, `0-1,6`.

    Raises ValueError naming what is wrong; the caller names the field."""
    cpus: set[int] = set()
    for part in text.replace(" ", "").split(","):
        low, dash, high = part.partition("-")
        if not low.isdigit() or (dash and not high.isdigit()):
            raise ValueError(
                f"{text!r} is not a CPU list: write CPU numbers and ranges as taskset -c takes "
                "them, e.g. '0', '2-3' or '0-1,6'"
            )
        first, last = int(low), int(high) if dash else int(low)
        if last < first:
            raise ValueError(f"{text!r}: the range {part!r} runs backwards")
        cpus.update(range(first, last + 1))
    return frozenset(cpus)


def format_cpu_list(cpus: frozenset[int] | set[int]) -> str:
    """`cpus` as the shortest CPU list (`0-2,5`), the form `taskset -c` and /proc print."""
    ranges: list[str] = []
    ordered = sorted(cpus)
    start = prev = ordered[0] if ordered else 0
    for cpu in [*ordered[1:], None]:
        if cpu is not None and cpu == prev + 1:
            prev = cpu
            continue
        ranges.append(str(start) if start == prev else f"{start}-{prev}")
        if cpu is not None:
            start = prev = cpu
    return ",".join(ranges) if ordered else ""
