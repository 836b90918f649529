"""Per-eval-set scores on disk: `evals.parquet/` holds one Parquet part per eval step.

The same layout and rules as `learner.metrics_log` (whose docstring says why a directory of
parts): each part is written under a temporary name and renamed into place, so readers see only
whole eval steps, and a resumed trial drops the parts newer than its checkpoint. A part holds one
row per eval set (column names in `contract.evals`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from contract import evals as E
from contract.evals import EvalSetScore
from contract.layout import TrialPaths
from learner.metrics_log import write_part

_PART = re.compile(r"^part-(\d{6})\.parquet$")
_FIXED_COLUMNS = (
    pa.field(E.STEP, pa.int64()),
    pa.field(E.EVAL_SET, pa.string()),
    pa.field(E.N_PROMPTS, pa.int64()),
    pa.field(E.GREEDY_PASS_RATE, pa.float64()),
    pa.field(E.SAMPLES, pa.int64()),
    pa.field(E.PASS1_SAMPLED, pa.float64()),
)


def evals_schema(ks: Sequence[int]) -> pa.Schema:
    """The fixed columns, then `pass_at_<k>` for each k in ascending order."""
    return pa.schema(
        [*_FIXED_COLUMNS, *(pa.field(E.pass_at_column(k), pa.float64()) for k in sorted(ks))]
    )


class EvalsLog:
    """Append-only eval rows under `<trial_dir>/evals.parquet/`, one part per eval step."""

    def __init__(self, trial_dir: Path) -> None:
        self.root = TrialPaths(Path(trial_dir)).evals
        self.root.mkdir(parents=True, exist_ok=True)

    def _part(self, step: int) -> Path:
        return self.root / f"part-{step:06d}.parquet"

    def append(self, step: int, scores: Sequence[EvalSetScore]) -> None:
        """Write one eval step's rows atomically. Every set must report the same k values."""
        ks = {tuple(sorted(score.pass_at_k)) for score in scores}
        if len(ks) != 1:
            raise ValueError(f"step {step}: eval sets report different pass@k values {sorted(ks)}")
        schema = evals_schema(next(iter(ks)))
        rows = [score.row(step) for score in scores]
        table = pa.Table.from_pylist(rows, schema=schema)
        write_part(table, self._part(step))

    def steps(self) -> list[int]:
        return sorted(int(m.group(1)) for p in self.root.iterdir() if (m := _PART.match(p.name)))

    def truncate_after(self, step: int) -> None:
        """Drop the parts of steps > `step` (written by a run killed after its last checkpoint)."""
        for existing in self.steps():
            if existing > step:
                self._part(existing).unlink()

    def read(self) -> pa.Table:
        """All rows so far, sorted by (step, file order of the sets); empty with the fixed columns
        when no eval has run."""
        parts = [str(self._part(s)) for s in self.steps()]
        if not parts:
            return evals_schema([]).empty_table()
        schema = pa.unify_schemas([pq.read_schema(p) for p in parts])
        table = ds.dataset(parts, format="parquet", schema=schema).to_table()
        return table.sort_by(E.STEP)  # Arrow's sort is stable: sets keep their order
