"""`<out_dir>/mlflow_runs.json`: which MLflow run holds which trial of this output directory.

Why a file in the output dir rather than a search by tags (trial_name + config_hash): the same
config run into two output dirs against one tracking server (a reproducibility check) has equal
tags, and a tag search would merge the two. The file is scoped to exactly the trials on disk
next to it. It is keyed by tracking store, so pointing a re-launch at another store starts
fresh there instead of referring to run ids that store never had.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from contract.durable import write_atomic

REGISTRY_FILE = "mlflow_runs.json"
VERSION = 1


@dataclass(frozen=True)
class ChildRecord:
    """The child run of one trial.

    `status`: the trial status last logged to it. `metrics_logged`: whether it holds the
    trial's metrics and artifacts (then a resumed attempt needs a fresh run, see tracking.py).
    """

    run_id: str
    config_hash: str | None
    status: str
    metrics_logged: bool


def store_key(tracking_uri: str) -> str:
    """The tracking URI without user:password, so no credential is written to disk."""
    parts = urlsplit(tracking_uri)
    if not (parts.username or parts.password):
        return tracking_uri
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit(parts._replace(netloc=netloc))


class RunRegistry:
    """Run ids of this output dir's parent runs and trial child runs in one tracking store."""

    def __init__(self, path: Path, store: str, data: dict[str, Any]) -> None:
        self.path = path
        self.store = store
        self._data = data
        self._section = data["stores"].setdefault(store, {"parents": [], "children": {}})

    @classmethod
    def load(cls, out_dir: Path, tracking_uri: str) -> RunRegistry:
        """Read the registry (or start an empty one); raises ValueError if it is corrupt."""
        path = Path(out_dir) / REGISTRY_FILE
        data: dict[str, Any] = {"version": VERSION, "stores": {}}
        if path.exists():
            try:
                data = json.loads(path.read_text())
            except json.JSONDecodeError as exc:
                raise ValueError(
                    f"{path} is not valid JSON ({exc}); delete it to let `harness run` log "
                    "every trial again as new MLflow runs"
                ) from None
            if not isinstance(data, dict) or not isinstance(data.get("stores"), dict):
                raise ValueError(f"{path} is not a harness run registry; delete or move it")
        return cls(path, store_key(tracking_uri), data)

    def parents(self) -> list[str]:
        return list(self._section["parents"])

    def add_parent(self, run_id: str) -> None:
        self._section["parents"].append(run_id)
        self.save()

    def child(self, trial_name: str) -> ChildRecord | None:
        raw = self._section["children"].get(trial_name)
        return None if raw is None else ChildRecord(**raw)

    def set_child(self, trial_name: str, record: ChildRecord) -> None:
        self._section["children"][trial_name] = asdict(record)
        self.save()

    def save(self) -> None:
        """Write atomically (temp file + rename), so a kill never leaves half a file."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps(self._data, indent=2, sort_keys=True) + "\n"
        write_atomic(self.path, text.encode())
