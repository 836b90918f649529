"""Trial identity, staleness modes and the two status vocabularies."""

from __future__ import annotations

import json

from contract.trial import (
    RESUMABLE_STATUSES,
    STALENESS_MODES,
    TERMINAL_STATUSES,
    LaunchStatus,
    TrialSpec,
    TrialStatus,
)


def test_trial_name_is_sortable_and_path_safe() -> None:
    spec = TrialSpec(arm="gspo_token", seed=3, lag=2, mode="bounded")
    assert spec.name == "gspo_token__seed3__lag2__bounded"
    assert "/" not in spec.name and " " not in spec.name


def test_staleness_modes_come_from_the_literal() -> None:
    assert STALENESS_MODES == ("fixed", "bounded")


def test_status_values_are_what_trial_json_holds() -> None:
    assert [s.value for s in TrialStatus] == ["running", "completed", "diverged", "failed"]
    # a StrEnum is its string: in JSON, in comparisons and in f-strings
    assert json.dumps({"status": TrialStatus.DIVERGED}) == '{"status": "diverged"}'
    assert TrialStatus.FAILED == "failed" and f"{TrialStatus.RUNNING}" == "running"


def test_terminal_and_resumable_partition_the_statuses() -> None:
    assert {"completed", "diverged"} == TERMINAL_STATUSES
    assert {"running", "failed"} == RESUMABLE_STATUSES
    assert TERMINAL_STATUSES.isdisjoint(RESUMABLE_STATUSES)
    assert set(TrialStatus) == TERMINAL_STATUSES | RESUMABLE_STATUSES


def test_launch_statuses_extend_the_trial_outcomes() -> None:
    # every way a trial process can end is a launch status, plus what only the experiment sees
    assert {s.value for s in TERMINAL_STATUSES | {TrialStatus.FAILED}} <= set(LaunchStatus)
    assert set(LaunchStatus) - set(TrialStatus) == {"interrupted", "not_started"}
    assert TrialStatus.RUNNING not in set(LaunchStatus)  # a launch always ends a trial's run
