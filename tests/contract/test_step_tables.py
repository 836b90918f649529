"""contract.step_tables: whole parts only, truncation on resume, schema union across versions, and
damaged parts reported (read_parts, read_steps lenient) or refused (read_steps)."""

from __future__ import annotations

import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from contract import step_tables
from contract.step_tables import DamagedPartError


def test_steps_list_only_whole_parts_and_truncate_drops_newer_ones(tmp_path: Path) -> None:
    root = tmp_path / "metrics.parquet"
    for step in (0, 1, 2, 5):
        step_tables.write_part(root, step, pa.table({"step": [step]}))
    (root / ".part-000006.parquet.tmp").write_bytes(b"half a part")  # a killed writer
    assert step_tables.part_steps(root) == [0, 1, 2, 5]
    step_tables.truncate_after(root, 1)
    assert step_tables.part_steps(root) == [0, 1]
    assert (root / ".part-000006.parquet.tmp").exists()  # not a part: left alone
    assert not list(root.glob(".part-000002*"))


def test_union_schema_reads_a_later_column_as_null(tmp_path: Path) -> None:
    root = tmp_path / "evals.parquet"
    step_tables.write_part(root, 0, pa.table({"step": [0], "a": [1.0]}))
    step_tables.write_part(root, 1, pa.table({"step": [1], "a": [2.0], "b": [3.0]}))
    schema = step_tables.union_schema(step_tables.list_parts(root))
    assert schema.names == ["step", "a", "b"]
    # read back: part 0 has no `b`, so its row reads b = null
    table = step_tables.read_steps(root).table
    assert table is not None
    assert table.to_pydict() == {"step": [0, 1], "a": [1.0, 2.0], "b": [None, 3.0]}


def test_round_trip_names_parts_by_step_and_leaves_no_temporary(tmp_path: Path) -> None:
    root = tmp_path / "evals.parquet"  # created by the first write
    two_sets = pa.table({"step": [4, 4], "eval_set": ["zeta", "alpha"], "score": [0.5, 0.25]})
    written = step_tables.write_part(root, 4, two_sets)
    step_tables.write_part(root, 12, two_sets.slice(0, 1))
    assert written == root / "part-000004.parquet"
    assert sorted(p.name for p in root.iterdir()) == ["part-000004.parquet", "part-000012.parquet"]
    assert step_tables.list_parts(root) == [written, root / "part-000012.parquet"]
    # rows in part order, and within a part in written order (zeta before alpha)
    table = step_tables.read_steps(root).table
    assert table is not None and table.equals(pa.concat_tables([two_sets, two_sets.slice(0, 1)]))
    # rewriting a step replaces its part (a resumed learner re-running the step)
    step_tables.write_part(root, 12, pa.table({"step": [12], "eval_set": ["x"], "score": [1.0]}))
    table = step_tables.read_steps(root).table
    assert table is not None and table["score"].to_pylist() == [0.5, 0.25, 1.0]


def test_missing_and_empty_roots_read_as_no_table(tmp_path: Path) -> None:
    missing = tmp_path / "nothing"
    assert step_tables.part_steps(missing) == [] and step_tables.list_parts(missing) == []
    assert step_tables.read_parts(missing) == step_tables.PartsRead(None, [])
    assert step_tables.read_steps(missing).table is None
    step_tables.truncate_after(missing, 0)  # nothing to drop, no error
    empty = tmp_path / "metrics.parquet"
    empty.mkdir()
    (empty / "_metadata.parquet").write_bytes(b"dataset metadata, not a part")
    assert step_tables.read_parts(empty) == step_tables.PartsRead(None, [])


def test_a_single_file_root_is_read_as_one_part(tmp_path: Path) -> None:
    # an older trial wrote metrics.parquet as one file instead of a directory
    single = tmp_path / "metrics.parquet"
    pq.write_table(pa.table({"step": [0, 1]}), single)
    assert step_tables.list_parts(single) == [single]
    found = step_tables.read_parts(single)
    assert found.problems == [] and found.table is not None
    assert found.table["step"].to_pylist() == [0, 1]


def test_types_are_promoted_across_parts(tmp_path: Path) -> None:
    root = tmp_path / "metrics.parquet"
    step_tables.write_part(root, 0, pa.table({"step": [0], "x": pa.array([1], pa.int64())}))
    step_tables.write_part(root, 1, pa.table({"step": [1], "x": pa.array([0.5], pa.float64())}))
    table = step_tables.read_steps(root).table
    assert table is not None and table.schema.field("x").type == pa.float64()
    assert table["x"].to_pylist() == [1.0, 0.5]


def assert_steps_0_1_read_and_reported(root: Path, damaged: str) -> None:
    """The tolerant reader keeps the good part (steps 0, 1) and names the one `damaged` part;
    the strict reader refuses the table, naming that part."""
    found = step_tables.read_parts(root)
    assert found.table is not None and found.table["step"].to_pylist() == [0, 1]
    assert len(found.problems) == 1
    assert found.problems[0].startswith(f"unreadable {root.name} part {damaged}: ")
    with pytest.raises(DamagedPartError, match=re.escape(damaged)):
        step_tables.read_steps(root)


def test_part_without_a_footer_is_reported_and_the_rest_read(tmp_path: Path) -> None:
    root = tmp_path / "metrics.parquet"
    step_tables.write_part(root, 0, pa.table({"step": [0, 1], "a": [0.1, 0.2]}))
    (root / "part-000001.parquet").write_bytes(b"half-written")
    assert_steps_0_1_read_and_reported(root, "part-000001.parquet")


def test_part_corrupt_past_its_footer_is_reported_and_the_rest_read(tmp_path: Path) -> None:
    root = tmp_path / "evals.parquet"
    step_tables.write_part(root, 0, pa.table({"step": [0, 1], "a": [0.1, 0.2]}))
    damaged = step_tables.write_part(root, 2, pa.table({"step": [2, 3], "a": [0.3, 0.4]}))
    data = bytearray(damaged.read_bytes())
    data[4:40] = b"\xff" * 36  # the first page header (after the 4-byte magic); footer intact
    damaged.write_bytes(bytes(data))
    assert pq.read_schema(damaged).names == ["step", "a"]  # the footer still reads
    assert_steps_0_1_read_and_reported(root, "part-000002.parquet")


def test_all_parts_damaged_reads_no_table_and_reports_each(tmp_path: Path) -> None:
    root = tmp_path / "metrics.parquet"
    root.mkdir()
    for name in ("part-000000.parquet", "part-000001.parquet"):
        (root / name).write_bytes(b"PAR1 not really")
    found = step_tables.read_parts(root)
    assert found.table is None
    assert [p.split(":")[0] for p in found.problems] == [
        "unreadable metrics.parquet part part-000000.parquet",
        "unreadable metrics.parquet part part-000001.parquet",
    ]
