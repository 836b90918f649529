"""A directory of one Parquet part per step: the storage under metrics.parquet/ and evals.parquet/.

Why a directory of parts: Parquet files cannot be appended to, and rewriting one file per step
would leave a window where a kill corrupts it. Each part is written to a temporary name, fsynced
and renamed into place (atomic on POSIX), so readers (`pyarrow.dataset`, `pandas.read_parquet`)
see only whole steps while the trial runs, and a resumed trial drops the parts newer than its
checkpoint with `truncate_after`.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

_PART = re.compile(r"^part-(\d{6})\.parquet$")


def write_part(table: pa.Table, final: Path) -> None:
    """Write one Parquet part atomically: a temporary name, fsync, rename into place (readers
    never see a partial part; a kill leaves at most a hidden temporary file)."""
    tmp = final.with_name(f".{final.name}.tmp")
    pq.write_table(table, tmp)
    with tmp.open("rb") as handle:
        os.fsync(handle.fileno())
    tmp.replace(final)


class StepParts:
    """`root/part-NNNNNN.parquet`, one per step (created if missing)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)

    def part(self, step: int) -> Path:
        return self.root / f"part-{step:06d}.parquet"

    def write(self, step: int, table: pa.Table) -> None:
        write_part(table, self.part(step))

    def steps(self) -> list[int]:
        """Steps with a complete part, ascending (temporary files are skipped)."""
        return sorted(int(m.group(1)) for p in self.root.iterdir() if (m := _PART.match(p.name)))

    def paths(self) -> list[str]:
        return [str(self.part(step)) for step in self.steps()]

    def truncate_after(self, step: int) -> None:
        """Drop the parts of steps > `step` (written by a run killed after its last checkpoint)."""
        for existing in self.steps():
            if existing > step:
                self.part(existing).unlink()

    def union_schema(self, parts: list[str]) -> pa.Schema:
        """The union of the parts' schemas (a column added in a later version reads as null)."""
        return pa.unify_schemas([pq.read_schema(p) for p in parts])
