"""When runs were made under different software: one line naming the lock and the packages.

A trial's provenance (`harness.provenance`, in trial.json) records every installed package's
version and the lock the environment was installed from (`lock`: its name, the sha256 of the lock
file, and how the environment departs from it). Two runs of one config under different packages
can differ for that reason alone, so `harness report`, `harness run --resume` and the tuned
comparison say so in one line, naming what differs. Pure functions of provenance dicts, so the
harness (which writes them) and the analysis (which reads them) share one rule.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

MAX_NAMED = 8
"""Packages named in one line; the rest are counted ("and 3 more")."""


def lock_label(provenance: Mapping[str, Any] | None) -> str | None:
    """`lock cpu@1a2b3c4d5e6f`, with ` (departed)` when the environment was not exactly the
    lock, `no lock` when none matched, or None when the record predates lock recording (unknown:
    never counted as a difference)."""
    if not provenance or "lock" not in provenance:
        return None
    lock = provenance["lock"]
    if not lock:
        return "no lock"
    departed = " (departed)" if lock.get("departures") else ""
    return f"lock {lock.get('name')}@{str(lock.get('sha256'))[:12]}{departed}"


def _packages(provenance: Mapping[str, Any] | None) -> dict[str, str]:
    return dict((provenance or {}).get("packages") or {})


def changed_packages(before: Mapping[str, str], after: Mapping[str, str]) -> list[str]:
    """`torch 2.13.0+cpu -> 2.14.1` per package whose version differs, `uv - -> 0.13.9` for one
    only one side has, sorted by name."""
    out = []
    for name in sorted(before.keys() | after.keys()):
        old, new = before.get(name, "-"), after.get(name, "-")
        if old != new:
            out.append(f"{name} {old} -> {new}")
    return out


def _named(items: list[str]) -> str:
    shown = ", ".join(items[:MAX_NAMED])
    more = len(items) - MAX_NAMED
    return f"{shown} and {more} more" if more > 0 else shown


def resume_line(
    previous: Mapping[str, Any] | None, current: Mapping[str, Any] | None
) -> str | None:
    """What a resumed trial says when its packages or lock are not those it began under (None
    when they are, or when the earlier attempt recorded no packages to compare)."""
    before, after = _packages(previous), _packages(current)
    if not before:
        return None
    changed = changed_packages(before, after)
    locks = (lock_label(previous) or "lock unknown", lock_label(current) or "lock unknown")
    if not changed and (locks[0] == locks[1] or "lock unknown" in locks):
        return None
    lock_part = f"{locks[0]} -> {locks[1]}" if locks[0] != locks[1] else locks[1]
    packages = f"; packages: {_named(changed)}" if changed else ""
    return f"resuming under other software than the trial began with ({lock_part}){packages}"


def mixed_line(provenances: Mapping[str, Mapping[str, Any] | None], subject: str) -> str | None:
    """One line when the runs (name -> provenance) were made under more than one lock or
    package set, naming each lock's run count and the packages whose versions differ; None
    when they agree. A package is named when runs that recorded it disagree on its version
    (records made before every package was recorded hold a few: a missing entry is not a
    difference). `subject` names the runs: "the 12 trials", "the trials on disk and this launch".
    """
    if len(provenances) < 2:
        return None
    locks = Counter(label for p in provenances.values() if (label := lock_label(p)) is not None)
    versions: dict[str, Counter[str]] = {}
    for provenance in provenances.values():
        for name, version in _packages(provenance).items():
            versions.setdefault(name, Counter())[version] += 1
    differing = [
        f"{name} ({', '.join(f'{v}: {n}' for v, n in sorted(counts.items()))})"
        for name, counts in sorted(versions.items())
        if len(counts) > 1
    ]
    if len(locks) < 2 and not differing:
        return None
    parts = ["; ".join(f"{label}: {n}" for label, n in sorted(locks.items()))] if locks else []
    parts += [f"packages that differ: {_named(differing)}"] if differing else []
    return (
        f"{subject} were made under different software ({'; '.join(parts)}): "
        "differences between them may come from that alone"
    )
