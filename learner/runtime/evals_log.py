"""Per-eval-set scores on disk: `evals.parquet/` holds one Parquet part per eval step.

The same layout and rules as `metrics.parquet/` (`contract.step_tables` owns that format and says
why a directory of parts): readers see only whole eval steps, and a resumed trial drops the parts
newer than its checkpoint. A part holds one row per eval set (column names in `contract.evals`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa

from contract import evals as E
from contract import step_tables
from contract.evals import EvalSetScore
from contract.layout import TrialPaths

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

    def append(self, step: int, scores: Sequence[EvalSetScore]) -> None:
        """Write one eval step's rows atomically. Every set must report the same k values."""
        ks = {tuple(sorted(score.pass_at_k)) for score in scores}
        if len(ks) != 1:
            raise ValueError(f"step {step}: eval sets report different pass@k values {sorted(ks)}")
        schema = evals_schema(next(iter(ks)))
        rows = [score.row(step) for score in scores]
        table = pa.Table.from_pylist(rows, schema=schema)
        step_tables.write_part(self.root, step, table)

    def steps(self) -> list[int]:
        return step_tables.part_steps(self.root)

    def truncate_after(self, step: int) -> None:
        """Drop the parts of steps > `step` (written by a run killed after its last checkpoint)."""
        step_tables.truncate_after(self.root, step)

    def read(self) -> pa.Table:
        """All rows so far, sorted by (step, file order of the sets); empty with the fixed columns
        when no eval has run (raises `contract.step_tables.DamagedPartError` if a part cannot be
        read)."""
        table = step_tables.read_steps(self.root).table  # sets keep their order in a step
        return evals_schema([]).empty_table() if table is None else table
