"""The checkpoint manifest's model: what it accepts, what it refuses, and its bytes on disk."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from contract.checkpoint_manifest import (
    MANIFEST_FORMAT,
    CheckpointManifest,
    CheckpointSeal,
    is_inside,
    manifest_bytes,
)

HEX = "ab" * 32
GOOD = {
    "format": MANIFEST_FORMAT,
    "step": 4,
    "files": {
        "state.pt": {"sha256": HEX, "bytes": 10},
        "shards/.metadata": {"sha256": HEX, "bytes": 1},
    },
    "records": {"metrics.parquet/part-000000.parquet": {"step": 0, "sha256": HEX}},
}


def test_the_bytes_on_disk_are_json_dumps_in_field_order() -> None:
    manifest = CheckpointManifest.model_validate(GOOD)
    assert manifest_bytes(manifest) == json.dumps(GOOD).encode()


@pytest.mark.parametrize(
    "damage",
    [
        {"format": "gspo-harness checkpoint v0"},
        {"step": "4"},
        {"step": 4.5},
        {"files": []},
        {"files": {"state.pt": {"sha256": HEX[:-1], "bytes": 10}}},
        {"files": {"state.pt": {"sha256": HEX.upper(), "bytes": 10}}},
        {"files": {"state.pt": {"sha256": HEX, "bytes": "10"}}},
        {"files": {"state.pt": {"sha256": HEX}}},
        {"files": {"../state.pt": {"sha256": HEX, "bytes": 10}}},
        {"files": {"/etc/passwd": {"sha256": HEX, "bytes": 10}}},
    ],
)
def test_a_damaged_seal_is_refused(damage: dict) -> None:
    with pytest.raises(ValidationError):
        CheckpointSeal.model_validate({**GOOD, **damage})


def test_records_are_checked_apart_from_the_seal() -> None:
    """Bad records do not make the checkpoint directory look damaged (it is not skipped); they
    fail the resume that loads it (`learner.runtime.checkpoint.verify_records`)."""
    bad = {**GOOD, "records": {"x": {"step": "0", "sha256": HEX}}}
    assert CheckpointSeal.model_validate(bad).step == 4
    with pytest.raises(ValidationError):
        CheckpointManifest.model_validate(bad)
    with pytest.raises(ValidationError):
        CheckpointManifest.model_validate({k: v for k, v in GOOD.items() if k != "records"})
    # a record name leaving the trial directory is valid here: the resume reports it missing
    odd = {**GOOD, "records": {"../x": {"step": 0, "sha256": HEX}}}
    assert not is_inside(next(iter(CheckpointManifest.model_validate(odd).records)))
