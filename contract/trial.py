"""A trial's identity and its files on disk (shared by the trial runner and the experiment)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

# How the learner admits groups (design section 5); buffer, learner and harness share this type.
StalenessMode = Literal["fixed", "bounded"]


@dataclass(frozen=True)
class TrialSpec:
    """One cell of the grid: (arm, seed, lag, mode)."""

    arm: str
    seed: int
    lag: int
    mode: StalenessMode

    @property
    def name(self) -> str:
        return f"{self.arm}__seed{self.seed}__lag{self.lag}__{self.mode}"


@dataclass(frozen=True)
class TrialPaths:
    """Where a trial keeps its outputs; everything a report or a resume needs is here."""

    root: Path

    @property
    def metadata(self) -> Path:
        return self.root / "trial.json"

    @property
    def resolved_config(self) -> Path:
        return self.root / "resolved_config.yaml"

    @property
    def prompts(self) -> Path:
        return self.root / "prompts.parquet"

    @property
    def weights(self) -> Path:
        return self.root / "weights"

    @property
    def redis_dir(self) -> Path:
        return self.root / "redis"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def learner_outcome(self) -> Path:
        return self.root / "learner_outcome.json"


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """Replace `path` atomically so a reader (or a kill) never sees half a file."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True, default=str))
    with tmp.open("rb") as handle:
        os.fsync(handle.fileno())
    tmp.replace(path)


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
