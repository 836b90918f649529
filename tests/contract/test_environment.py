"""The one line that says runs were made under different software (contract.environment)."""

from __future__ import annotations

from contract.environment import MAX_NAMED, changed_packages, lock_label, mixed_line, resume_line

LOCK_A = {"name": "cpu", "sha256": "a" * 64, "departures": []}
LOCK_B = {"name": "cpu", "sha256": "b" * 64, "departures": []}
PACKAGES = {"torch": "2.13.0+cpu", "numpy": "2.3.5", "redis": "8.2.0"}


def facts(lock: dict | None = LOCK_A, **versions: str) -> dict:
    return {"git": {}, "packages": PACKAGES | versions, "lock": lock, "hardware": {}}


def test_lock_labels_name_the_lock_and_tell_unknown_from_none() -> None:
    assert lock_label(facts()) == f"lock cpu@{'a' * 12}"
    assert lock_label(facts(LOCK_A | {"departures": ["uv: not installed"]})).endswith("(departed)")
    assert lock_label(facts(None)) == "no lock"
    assert lock_label({"packages": {}}) is None  # recorded before locks were: unknown
    assert lock_label(None) is None


def test_changed_packages_name_old_and_new_versions() -> None:
    before, after = PACKAGES, PACKAGES | {"torch": "2.14.1", "uv": "0.13.9"}
    assert changed_packages(before, after) == ["torch 2.13.0+cpu -> 2.14.1", "uv - -> 0.13.9"]


def test_resume_line_names_what_changed_and_is_silent_otherwise() -> None:
    assert resume_line(facts(), facts()) is None
    line = resume_line(facts(), facts(LOCK_B, torch="2.14.1"))
    assert line == (
        f"resuming under other software than the trial began with (lock cpu@{'a' * 12} -> "
        f"lock cpu@{'b' * 12}); packages: torch 2.13.0+cpu -> 2.14.1"
    )
    # An earlier attempt that recorded no packages (an old record) is not compared.
    assert resume_line({"packages": {}}, facts(torch="2.14.1")) is None


def test_mixed_line_counts_runs_per_lock_and_version() -> None:
    runs = {"a": facts(), "b": facts(), "c": facts(LOCK_B, torch="2.14.1")}
    line = mixed_line(runs, "the 3 trials")
    assert line is not None and line.startswith("the 3 trials were made under different software")
    assert f"lock cpu@{'a' * 12}: 2; lock cpu@{'b' * 12}: 1" in line
    assert "packages that differ: torch (2.13.0+cpu: 2, 2.14.1: 1)" in line
    assert "numpy" not in line and "redis" not in line


def test_mixed_line_is_silent_for_one_environment_and_for_unknowns() -> None:
    assert mixed_line({"a": facts(), "b": facts()}, "the 2 trials") is None
    assert mixed_line({"a": facts()}, "the 1 trials") is None
    # Records without a lock or with only a few packages (made before both were recorded) do
    # not count as differences: only versions that runs recorded and disagree on do.
    old = {"packages": {"torch": "2.13.0+cpu"}}
    assert mixed_line({"old": old, "new": facts()}, "the 2 trials") is None
    assert mixed_line({"old": old, "new": facts(torch="2.14.1")}, "x") is not None


def test_mixed_line_stays_one_line_with_many_packages() -> None:
    many = {f"pkg{i:02d}": "1.0" for i in range(20)}
    newer = {name: "2.0" for name in many}
    line = mixed_line({"a": facts(**many), "b": facts(**newer)}, "the 2 trials")
    assert line is not None and "\n" not in line
    assert f"and {20 - MAX_NAMED} more" in line
