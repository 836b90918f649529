"""Per-step metrics on disk: `metrics.parquet/` is a directory of one Parquet part per step
(`contract.step_tables` owns that format: why parts, and how a resumed trial drops the newer
ones), and the ledger of trained groups.

A checkpoint of step k vouches for the per-step files of steps <= k (metric and eval parts,
ledger files: `learner.runtime.records.StepRecords.vouched`) with their sha256 in its manifest; a
resumed learner checks them (`learner.runtime.checkpoint.CheckpointStore.verify_records`) and
fails in one line on a missing or damaged one instead of completing with rows or groups silently
missing.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pyarrow as pa

from contract import metrics as M
from contract import step_tables
from contract.durable import write_atomic
from contract.layout import TrialPaths

_LEDGER_FILE = re.compile(r"^step-(\d{6,})\.json$")

METRICS_SCHEMA = pa.schema(
    [pa.field(M.STEP, pa.int64()), pa.field(M.TIMESTAMP, pa.float64())]
    + [pa.field(name, pa.float64()) for name in M.ALL_METRICS]
)


class MetricsLog:
    """Append-only per-step metric rows under `<trial_dir>/metrics.parquet/`."""

    def __init__(self, trial_dir: Path) -> None:
        self.root = TrialPaths(Path(trial_dir)).metrics
        self.root.mkdir(parents=True, exist_ok=True)

    def append(self, step: int, timestamp: float, metrics: dict[str, float]) -> None:
        """Write one step's row atomically, with every registered metric (NaN if unmeasured)
        and the family members it carries (`contract.metrics.FAMILY_REDUCTIONS`: per-layer
        MoE shares), as columns after them, in name order.

        Unknown names are refused: metric names come from `contract.metrics` only.
        """
        unknown = sorted(name for name in metrics if not M.is_metric(name))
        if unknown:
            raise KeyError(f"metrics {unknown} are not in contract.metrics; register them there")
        row: dict[str, list] = {M.STEP: [step], M.TIMESTAMP: [float(timestamp)]}
        for name in M.ALL_METRICS:
            value = metrics.get(name)
            row[name] = [math.nan if value is None else float(value)]
        family = sorted(set(metrics) - set(M.ALL_METRICS))
        schema = METRICS_SCHEMA
        for name in family:  # a trial's rows all carry the same ones (its model's layers)
            row[name] = [float(metrics[name])]
            schema = schema.append(pa.field(name, pa.float64()))
        step_tables.write_part(self.root, step, pa.table(row, schema=schema))

    def steps(self) -> list[int]:
        return step_tables.part_steps(self.root)

    def truncate_after(self, step: int) -> None:
        """Drop rows of steps > `step` (written by a run killed after its last checkpoint)."""
        step_tables.truncate_after(self.root, step)

    def read(self) -> pa.Table:
        """All rows so far, sorted by step; columns are the union over parts (raises
        `contract.step_tables.DamagedPartError` if a part cannot be read)."""
        table = step_tables.read_steps(self.root).table
        return pa.table({M.STEP: pa.array([], pa.int64())}) if table is None else table


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
        # durable before a checkpoint vouches for it
        write_atomic(self.path(step), json.dumps(rows).encode())

    def path(self, step: int) -> Path:
        return self.root / f"step-{step:06d}.json"

    def steps(self) -> list[int]:
        """Steps with a ledger file, ascending (temporary files are skipped)."""
        return sorted(
            int(m.group(1)) for p in self.root.iterdir() if (m := _LEDGER_FILE.match(p.name))
        )

    def truncate_after(self, step: int) -> None:
        for existing in self.steps():
            if existing > step:
                self.path(existing).unlink()

    def record_lost(self, timeline: int, rows: list[dict[str, object]]) -> None:
        """Groups trained after the checkpoint a bounded-mode rewind went back to, lost with
        the steps that trained them (`learner.runtime.resume`): `lost-NNN.json`, NNN the
        timeline number the rewind made. Kept for good (no resume truncates it), so the trail
        says which ids were trained in steps that no longer exist; `read` leaves them out."""
        write_atomic(self.root / f"lost-{timeline:03d}.json", json.dumps(rows).encode())

    def lost(self, after_timeline: int = 0) -> list[dict[str, object]]:
        """Rows of the rewinds with a timeline number > `after_timeline`, in order."""
        rows: list[dict[str, object]] = []
        for path in sorted(self.root.glob("lost-*.json")):
            if int(path.stem.split("-")[1]) > after_timeline:
                rows += json.loads(path.read_text())
        return rows

    def read(self) -> list[dict[str, object]]:
        rows: list[dict[str, object]] = []
        for path in sorted(self.root.glob("step-*.json")):
            step = int(path.stem.split("-")[1])
            rows += [{"step": step, **row} for row in json.loads(path.read_text())]
        return rows
