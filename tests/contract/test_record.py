"""The trial.json record: what the runner writes validates, what it never writes is refused with
the file and the field named, and unknown keys survive a round trip."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from contract.record import (
    TrialRecord,
    TrialRecordError,
    parse_trial_record,
    read_trial_record,
    write_trial_record,
)
from contract.regime import TrialRegime
from contract.trial import TrialStatus

# What harness/trial/prepare.py writes when a trial starts (every key it writes).
RUNNER_RECORD = {
    "experiment": "quickstart",
    "trial_name": "gspo__seed0__lag2__fixed",
    "arm": "gspo",
    "objective": "gspo",
    "seed": 0,
    "lag": 2,
    "mode": "fixed",
    "status": "running",
    "diverged": False,
    "diverged_reason": None,
    "failure_reason": None,
    "steps_planned": 50,
    "steps_completed": 0,
    "config_hash": "0123abcd",
    "initial_weights_digest": "w0",
    "prompt_set_digest": "p0",
    "model_dir": "/cache/models/abc",
    "started_at": "2026-01-01T00:00:00+00:00",
    "finished_at": None,
    "resumed": False,
    "provenance": {"git": {"commit": "abc123", "dirty": False}, "packages": {}, "hardware": {}},
    "regime": {
        "mode": "fixed",
        "lag": 2,
        "partial_rollouts": False,
        "sync_every": 1,
        "correction": "",
    },
}


def _write(trial_dir: Path, data: object) -> Path:
    trial_dir.mkdir(parents=True, exist_ok=True)
    path = trial_dir / "trial.json"
    path.write_text(json.dumps(data))
    return path


def test_runner_record_round_trips_exactly(tmp_path: Path) -> None:
    record = TrialRecord.model_validate(RUNNER_RECORD)
    assert record.status is TrialStatus.RUNNING and record.lag == 2
    assert record.to_json() == RUNNER_RECORD
    write_trial_record(tmp_path, record)
    on_disk = json.loads((tmp_path / "trial.json").read_text())
    assert on_disk == RUNNER_RECORD  # statuses written as plain strings
    assert read_trial_record(tmp_path) == record


def test_finished_record_is_a_copy_with_updates(tmp_path: Path) -> None:
    started = TrialRecord.model_validate(RUNNER_RECORD)
    finished = started.model_copy(update={"status": TrialStatus.DIVERGED, "diverged": True})
    write_trial_record(tmp_path, finished)
    back = read_trial_record(tmp_path)
    assert back is not None and back.status == "diverged" and back.diverged is True
    assert started.status == "running"  # frozen: the original is untouched


def test_only_identity_is_required_and_unknown_keys_are_kept(tmp_path: Path) -> None:
    minimal = {"arm": "grpo", "seed": -1, "lag": 0, "mode": "bounded", "status": "failed"}
    _write(tmp_path, {**minimal, "gpu_hours": 1.5})
    record = read_trial_record(tmp_path)
    assert record is not None
    assert (record.seed, record.steps_planned, record.diverged) == (-1, None, False)
    assert record.to_json()["gpu_hours"] == 1.5  # a newer runner's key survives


def test_absent_record_is_none(tmp_path: Path) -> None:
    assert read_trial_record(tmp_path) is None
    assert read_trial_record(tmp_path / "never-created") is None


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"status": "queued"}, "status: unknown status 'queued'"),
        ({"mode": "sideways"}, "mode: Input should be 'fixed' or 'bounded'"),
        ({"seed": "0"}, "seed: Input should be a valid integer"),
        ({"lag": -1}, "lag: Input should be greater than or equal to 0"),
        ({"arm": ""}, "arm: String should have at least 1 character"),
        ({"steps_planned": "many"}, "steps_planned: Input should be a valid integer"),
    ],
)
def test_invalid_field_is_named_with_the_file(
    tmp_path: Path, change: dict[str, object], message: str
) -> None:
    path = _write(tmp_path, RUNNER_RECORD | change)
    with pytest.raises(TrialRecordError) as caught:
        read_trial_record(tmp_path)
    assert str(path) in str(caught.value) and message in str(caught.value)


def test_missing_identity_keys_are_each_named(tmp_path: Path) -> None:
    _write(tmp_path, {"arm": "gspo", "seed": 0, "status": "completed"})
    with pytest.raises(TrialRecordError, match=r"lag: Field required; mode: Field required"):
        read_trial_record(tmp_path)


def test_garbage_is_refused_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "trial.json"
    path.write_text('{"status": "compl')
    with pytest.raises(TrialRecordError, match=r"trial\.json is not valid JSON"):
        read_trial_record(tmp_path)
    _write(tmp_path, ["not", "an", "object"])
    with pytest.raises(TrialRecordError, match=r"trial\.json holds a list, expected a JSON object"):
        read_trial_record(tmp_path)
    assert issubclass(TrialRecordError, ValueError)  # callers that caught ValueError still do


def test_the_regime_round_trips_and_older_records_have_none(tmp_path: Path) -> None:
    """trial.json keeps the resolved regime as written; a record from before it was recorded
    reads as `regime=None`; a misspelt regime key is refused, naming it."""
    regime = TrialRegime(mode="bounded", lag=3, partial_rollouts=True, sync_every=2)
    record = TrialRecord(arm="gspo", seed=0, lag=3, mode="bounded", status="running", regime=regime)
    write_trial_record(tmp_path, record)
    assert read_trial_record(tmp_path).regime == regime
    assert regime.words() == "bounded, max lag 3, partial rollouts, weights synced every 2 steps"
    assert TrialRegime(mode="fixed", lag=0).words() == "fixed lag 0"
    older = {"arm": "gspo", "seed": 0, "lag": 0, "mode": "fixed", "status": "completed"}
    assert parse_trial_record(json.dumps(older), tmp_path / "trial.json").regime is None
    bad = {**older, "regime": {"mode": "fixed", "lag": 0, "sync_evry": 2}}
    with pytest.raises(TrialRecordError, match=r"regime\.sync_evry"):
        parse_trial_record(json.dumps(bad), tmp_path / "trial.json")
