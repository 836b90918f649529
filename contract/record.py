"""The `trial.json` record: written by the trial runner, read by `harness run` and by analysis.

One model and one reader, so the runner cannot write a key the readers spell differently, and a
record that lacks or garbles the trial's identity (arm, seed, lag, mode, status) is refused with
an error naming the file and the field instead of being half-read. Keys this version does not
know are kept (a newer runner may add some); everything but the identity is optional, since a
record is rewritten as the trial progresses and older runners wrote fewer keys.
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from contract.durable import write_atomic
from contract.layout import TrialPaths
from contract.regime import TrialRegime
from contract.trial import StalenessMode, TrialStatus


class TrialRecordError(ValueError):
    """A trial.json exists but is not a valid record; the message names the file and fields."""


class TrialRecord(BaseModel):
    """What a trial directory says about its trial (design section 9: status, provenance)."""

    # `model_dir` is a trial.json key, not pydantic API; no protected namespace to clash with.
    model_config = ConfigDict(extra="allow", frozen=True, protected_namespaces=())

    # Identity: validated, so a copied or hand-edited record is never mistaken for this trial.
    arm: str = Field(min_length=1, description="Arm name from the config's `arms`.")
    seed: int = Field(strict=True, description="Trial seed.")
    lag: int = Field(strict=True, ge=0, description="Lag (fixed) or max lag (bounded).")
    mode: StalenessMode = Field(description="Staleness mode (design section 5).")
    status: TrialStatus = Field(description="How far the trial got; see TrialStatus.")

    experiment: str | None = Field(default=None, description="Experiment `name`.")
    trial_name: str | None = Field(default=None, description="TrialSpec.name of the trial.")
    objective: str | None = Field(default=None, description="The arm's objective.")
    diverged: bool = Field(default=False, description="Stopped on a non-finite loss/gradient.")
    diverged_reason: str | None = Field(default=None, description="Why, when diverged.")
    failure_reason: str | None = Field(default=None, description="Why, when failed.")
    steps_planned: int | None = Field(default=None, ge=0, description="Learner steps planned.")
    steps_completed: int | None = Field(default=None, ge=0, description="Learner steps done.")
    config_hash: str | None = Field(default=None, description="Hash of the resolved config.")
    initial_weights_digest: str | None = Field(default=None, description="sha256 of v0 weights.")
    prompt_set_digest: str | None = Field(default=None, description="sha256 of prompts.parquet.")
    model_dir: str | None = Field(default=None, description="Where the initial model was built.")
    started_at: str | None = Field(default=None, description="ISO 8601 UTC, first start.")
    finished_at: str | None = Field(default=None, description="ISO 8601 UTC; None while running.")
    resumed: bool = Field(default=False, description="This attempt resumed a previous one.")
    provenance: dict[str, Any] | None = Field(
        default=None, description="Git commit and dirty flag, package versions, hardware."
    )
    regime: TrialRegime | None = Field(
        default=None,
        description="The resolved staleness regime and correction; None in records written "
        "before it was recorded (the report then reads them from the resolved config).",
    )

    @field_validator("status", mode="before")
    @classmethod
    def _known_status(cls, value: object) -> object:
        if isinstance(value, str) and value not in TrialStatus._value2member_map_:
            known = ", ".join(TrialStatus)
            raise ValueError(f"unknown status {value!r}; a trial runner writes one of {known}")
        return value

    def to_json(self) -> dict[str, Any]:
        """The record as trial.json holds it (extra keys included, statuses as strings)."""
        return self.model_dump(mode="json")


def _field_errors(exc: ValidationError) -> str:
    """`status: unknown status 'queued' ...; lag: Field required`, one entry per bad field."""
    parts = []
    for error in exc.errors():
        where = ".".join(str(p) for p in error["loc"]) or "record"
        message = error["msg"]
        if error["type"] == "value_error":  # our own validator's message, without pydantic's prefix
            message = str(error["ctx"]["error"])
        parts.append(f"{where}: {message}")
    return "; ".join(parts)


def parse_trial_record(text: str, path: Path) -> TrialRecord:
    """Validate the text of a trial.json; raise TrialRecordError naming `path` and the fields."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TrialRecordError(f"{path} is not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise TrialRecordError(f"{path} holds a {type(data).__name__}, expected a JSON object")
    try:
        return TrialRecord.model_validate(data)
    except ValidationError as exc:
        raise TrialRecordError(
            f"{path} is not a valid trial record ({_field_errors(exc)}); the trial runner writes "
            "arm, seed, lag, mode and status"
        ) from None


def read_trial_record(trial_dir: Path) -> TrialRecord | None:
    """The record in `trial_dir/trial.json`, or None when the trial never started.

    Raises TrialRecordError (naming the file and the fields) when it exists but is not a valid
    record; the runner writes it atomically, so that means someone edited or truncated it.
    """
    path = TrialPaths(Path(trial_dir)).metadata
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    return parse_trial_record(text, path)


def write_trial_record(trial_dir: Path, record: TrialRecord) -> None:
    """Write `trial_dir/trial.json` atomically."""
    write_json_atomic(TrialPaths(Path(trial_dir)).metadata, record.to_json())


def rewrite_trial_record_in_place(trial_dir: Path, record: TrialRecord) -> None:
    """Overwrite `trial_dir/trial.json` in place, within the disk blocks it already holds.

    Only for a full disk, where `write_trial_record`'s temporary file cannot be created (ENOSPC)
    but the trial must still end `failed` rather than stay `running`. Not atomic: a kill halfway
    leaves an invalid record, which readers report and the next attempt replaces. Raises OSError
    (ENOSPC) without touching the file when the new text would need more blocks than it has.
    """
    path = TrialPaths(Path(trial_dir)).metadata
    text = json.dumps(record.to_json(), indent=2, sort_keys=True, default=str).encode()
    with path.open("r+b") as handle:
        allocated = os.fstat(handle.fileno()).st_blocks * 512
        if len(text) > allocated:
            raise OSError(errno.ENOSPC, f"{path} holds {allocated} bytes, the record needs more")
        handle.write(text)
        handle.truncate()
        handle.flush()
        os.fsync(handle.fileno())


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """Replace `path` atomically so a reader (or a kill) never sees half a file."""
    write_atomic(path, json.dumps(data, indent=2, sort_keys=True, default=str).encode())


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON file written by `write_json_atomic`, or None when it does not exist."""
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
