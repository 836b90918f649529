"""StepParts: whole parts only, truncation on resume, and schema union across versions."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from learner.step_parts import StepParts


def test_steps_list_only_whole_parts_and_truncate_drops_newer_ones(tmp_path: Path) -> None:
    parts = StepParts(tmp_path / "metrics.parquet")
    for step in (0, 1, 2, 5):
        parts.write(step, pa.table({"step": [step]}))
    (parts.root / ".part-000006.parquet.tmp").write_bytes(b"half a part")  # a killed writer
    assert parts.steps() == [0, 1, 2, 5]
    parts.truncate_after(1)
    assert parts.steps() == [0, 1]
    assert (parts.root / ".part-000006.parquet.tmp").exists()  # not a part: left alone
    assert not list(parts.root.glob(".part-000002*"))


def test_union_schema_reads_a_later_column_as_null(tmp_path: Path) -> None:
    parts = StepParts(tmp_path / "evals.parquet")
    parts.write(0, pa.table({"step": [0], "a": [1.0]}))
    parts.write(1, pa.table({"step": [1], "a": [2.0], "b": [3.0]}))
    schema = parts.union_schema(parts.paths())
    assert schema.names == ["step", "a", "b"]
