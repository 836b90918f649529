"""Per-step metrics on disk: `metrics.parquet/` is a directory of one Parquet part per step.

Why a directory of parts: Parquet files cannot be appended to, and rewriting one file per step
would leave a window where a kill corrupts it. Each part is written to a temporary name and
renamed into place (atomic on POSIX), so readers (`pyarrow.dataset`, `pandas.read_parquet`) see
only whole steps while the trial runs, and a resumed trial drops parts newer than its checkpoint.
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from contract import metrics as M
from contract.layout import TrialPaths

_PART = re.compile(r"^part-(\d{6})\.parquet$")
METRICS_SCHEMA = pa.schema(
    [pa.field(M.STEP, pa.int64()), pa.field(M.TIMESTAMP, pa.float64())]
    + [pa.field(name, pa.float64()) for name in M.ALL_METRICS]
)


def write_part(table: pa.Table, final: Path) -> None:
    """Write one Parquet part atomically: a temporary name, fsync, rename into place (readers
    never see a partial part; a kill leaves at most a hidden temporary file)."""
    tmp = final.with_name(f".{final.name}.tmp")
    pq.write_table(table, tmp)
    with tmp.open("rb") as handle:
        os.fsync(handle.fileno())
    tmp.replace(final)


class MetricsLog:
    """Append-only per-step metric rows under `<trial_dir>/metrics.parquet/`."""

    def __init__(self, trial_dir: Path) -> None:
        self.root = TrialPaths(Path(trial_dir)).metrics
        self.root.mkdir(parents=True, exist_ok=True)

    def _part(self, step: int) -> Path:
        return self.root / f"part-{step:06d}.parquet"

    def append(self, step: int, timestamp: float, metrics: dict[str, float]) -> None:
        """Write one step's row atomically, with every registered metric (NaN if unmeasured).

        Unknown names are refused: metric names come from `contract.metrics` only.
        """
        unknown = sorted(set(metrics) - set(M.ALL_METRICS))
        if unknown:
            raise KeyError(f"metrics {unknown} are not in contract.metrics; register them there")
        row: dict[str, list] = {M.STEP: [step], M.TIMESTAMP: [float(timestamp)]}
        for name in M.ALL_METRICS:
            value = metrics.get(name)
            row[name] = [math.nan if value is None else float(value)]
        table = pa.table(row, schema=METRICS_SCHEMA)
        write_part(table, self._part(step))

    def steps(self) -> list[int]:
        return sorted(int(m.group(1)) for p in self.root.iterdir() if (m := _PART.match(p.name)))

    def truncate_after(self, step: int) -> None:
        """Drop rows of steps > `step` (written by a run killed after its last checkpoint)."""
        for existing in self.steps():
            if existing > step:
                self._part(existing).unlink()

    def read(self) -> pa.Table:
        """All rows so far, sorted by step; columns are the union over parts."""
        parts = [str(self._part(s)) for s in self.steps()]
        if not parts:
            return pa.table({M.STEP: pa.array([], pa.int64())})
        table = ds.dataset(parts, format="parquet", schema=_union_schema(parts)).to_table()
        return table.sort_by(M.STEP)


def _union_schema(parts: list[str]) -> pa.Schema:
    return pa.unify_schemas([pq.read_schema(p) for p in parts])


class GroupLedger:
    """Which groups each step trained, from which generator and policy version.

    One small JSON file per step under `<trial_dir>/trained_groups/`, written atomically and
    truncated on resume exactly like the metrics, so it is the audit trail of exactly-once
    training: every group id appears once across the ledger.
    """

    def __init__(self, trial_dir: Path) -> None:
        self.root = TrialPaths(Path(trial_dir)).trained_groups
        self.root.mkdir(parents=True, exist_ok=True)

    def record(self, step: int, rows: list[dict[str, object]]) -> None:
        final = self.root / f"step-{step:06d}.json"
        tmp = final.with_name(f".{final.name}.tmp")
        tmp.write_text(json.dumps(rows))
        tmp.replace(final)

    def truncate_after(self, step: int) -> None:
        for path in self.root.glob("step-*.json"):
            if int(path.stem.split("-")[1]) > step:
                path.unlink()

    def read(self) -> list[dict[str, object]]:
        rows: list[dict[str, object]] = []
        for path in sorted(self.root.glob("step-*.json")):
            step = int(path.stem.split("-")[1])
            rows += [{"step": step, **row} for row in json.loads(path.read_text())]
        return rows
