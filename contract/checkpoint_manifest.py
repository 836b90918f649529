"""A checkpoint's `manifest.json`: the seal that makes `step-NNNNNN/` a checkpoint.

Why a model: the learner writes the manifest and reads it back after a kill, a copy or a hand
edit, so its reader must refuse every damaged manifest rather than half-read it, and its writer
must produce exactly what the reader accepts. On disk (compact `json.dumps`, keys in this order):

    {"format": "gspo-harness checkpoint v1", "step": 4,
     "files": {"state.pt": {"sha256": "<hex>", "bytes": 123456}},
     "records": {"metrics.parquet/part-000000.parquet": {"step": 0, "sha256": "<hex>"}, ...}}

It is read in two stages, because the two halves answer different questions
(`learner.runtime.checkpoint`): `CheckpointSeal` (format, step, files) decides whether the
checkpoint directory is intact, so a bad one is skipped for an older checkpoint; `records` are
checked only for the checkpoint being loaded, and a bad one fails that resume instead.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Final, Literal, get_args

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictInt

MANIFEST: Final = "manifest.json"
ManifestFormat = Literal["gspo-harness checkpoint v1"]
MANIFEST_FORMAT: Final[str] = get_args(ManifestFormat)[0]

Sha256 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]


def is_inside(name: object) -> bool:
    """A manifest name that stays inside its base directory (no absolute path, no `..`)."""
    return (
        isinstance(name, str)
        and bool(name)
        and not Path(name).is_absolute()
        and ".." not in Path(name).parts
    )


def _inside(name: str) -> str:
    if not is_inside(name):
        raise ValueError(f"{name!r} leaves the checkpoint directory")
    return name


class ManifestFile(BaseModel):
    """A file of the checkpoint directory: its sha256 and size."""

    model_config = ConfigDict(frozen=True)

    sha256: Sha256
    bytes: StrictInt


class ManifestRecord(BaseModel):
    """A per-step file of the trial the checkpoint vouches for: its step and sha256."""

    model_config = ConfigDict(frozen=True)

    step: StrictInt
    sha256: Sha256


class CheckpointSeal(BaseModel):
    """What says a checkpoint directory is intact: the format, the step, and every file of the
    directory (names relative to it) with its digest and size."""

    model_config = ConfigDict(frozen=True)

    format: ManifestFormat
    step: StrictInt
    files: dict[Annotated[str, AfterValidator(_inside)], ManifestFile]


class CheckpointManifest(CheckpointSeal):
    """The whole manifest: the seal, plus the trial's per-step files of steps <= `step` (names
    relative to the trial directory, checked where they are read: an unsafe one is missing)."""

    records: dict[str, ManifestRecord]


def manifest_bytes(manifest: CheckpointManifest) -> bytes:
    """The manifest as written: `json.dumps` with its default separators, fields in order."""
    return json.dumps(manifest.model_dump(mode="json")).encode()
