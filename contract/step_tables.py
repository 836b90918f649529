"""The on-disk step tables `metrics.parquet/`, `evals.parquet/` and `rollouts.parquet/`: their
one writer and reader.

Each is a directory of one Parquet part per step, `part-NNNNNN.parquet` (`contract.layout` names
the directories, `contract.metrics`, `contract.evals` and `contract.rollout_log` the columns).
The learner appends and truncates through this module, analysis and the harness read through
it, and the synthetic experiments of analysis are written by it, so every trial directory is
laid out the same way.

Why a directory of parts: Parquet files cannot be appended to, and rewriting one file per step
would leave a window where a kill corrupts it. Each part is written to a temporary name, fsynced
and renamed into place (atomic on POSIX; the directory is fsynced too, so the part survives a
power loss), so readers see only whole steps while the trial runs, and a resumed trial drops the
parts newer than its checkpoint with `truncate_after`, after checking the older ones against
the checkpoint's manifest (`learner.runtime.checkpoint`).

Reading: `read_steps` is every table's one reader, for the learner, the harness and analysis
alike. The parts are read under the union of their schemas (a column first written by a later
version reads as null in earlier parts) and sorted by step, stably, so the rows of one step keep
their written order. Strict by default: a damaged part raises (the harness must not log half a
trial to MLflow without saying so); analysis reads leniently, where a damaged part becomes a
problem line and the rest is read (one broken file never hides a trial).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from contract.durable import write_atomic

_PART = re.compile(r"^part-(\d{6})\.parquet$")
STEP = "step"  # every step table's step column (contract.metrics, .evals and .rollout_log)


class DamagedPartError(OSError):
    """A step table holds parts that cannot be read (`read_steps`, strict)."""


@dataclass(frozen=True)
class PartsRead:
    """What `read_parts` found: the rows of every readable part in part order (None when no part
    could be read, or there is none), and one problem line per unreadable part."""

    table: pa.Table | None
    problems: list[str] = field(default_factory=list)


def part_path(root: Path, step: int) -> Path:
    """`root/part-NNNNNN.parquet`: the part of `step`."""
    return Path(root) / f"part-{step:06d}.parquet"


def write_part(root: Path, step: int, table: pa.Table) -> Path:
    """Write `step`'s part atomically (`root` created if missing); an existing part of that step
    is replaced. A temporary name, fsync, rename into place: readers never see a partial part,
    and a kill leaves at most a hidden temporary file, which no listing here returns."""
    final = part_path(root, step)
    final.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(final, lambda tmp: pq.write_table(table, tmp))
    return final


def part_steps(root: Path) -> list[int]:
    """Steps with a complete part, ascending (temporary files are skipped; none if no `root`)."""
    if not Path(root).is_dir():
        return []
    return sorted(int(m.group(1)) for p in Path(root).iterdir() if (m := _PART.match(p.name)))


def read_part(root: Path, step: int) -> pa.Table:
    """The part of one step (a reader that follows a live trial reads only its new parts).
    Raises OSError or pyarrow.ArrowException when the part vanished or cannot be read."""
    return pq.read_table(part_path(root, step))


def truncate_after(root: Path, step: int) -> None:
    """Drop the parts of steps > `step` (written by a run killed after its last checkpoint)."""
    for existing in part_steps(root):
        if existing > step:
            part_path(root, existing).unlink()


def list_parts(root: Path) -> list[Path]:
    """The Parquet files to read, by name: `root` itself if it is a file, else its `*.parquet`
    files except hidden (`.`: a writer's temporary) and `_` ones (dataset metadata).
    Empty when `root` does not exist."""
    root = Path(root)
    if not root.exists():
        return []
    parts = [root] if root.is_file() else sorted(root.glob("*.parquet"))
    return [p for p in parts if not p.name.startswith((".", "_"))]


def union_schema(parts: list[Path]) -> pa.Schema:
    """The union of the parts' schemas (a column added in a later version reads as null; types
    promoted permissively, e.g. int64 and float64 to float64)."""
    return pa.unify_schemas([pq.read_schema(p) for p in parts], promote_options="permissive")


def read_parts(root: Path) -> PartsRead:
    """Every readable part of `root` as one table under the union of their schemas.

    A part whose footer cannot be read is left out and reported; if the parts then fail to read
    as one dataset (a part corrupt past its footer), they are read one by one and the failing
    ones reported. Rows keep part order; deduplicating steps is the caller's choice.
    """
    readable, schemas, problems = [], [], []
    for part in list_parts(root):
        try:
            schemas.append(pq.read_schema(part))
            readable.append(part)
        except (OSError, pa.ArrowException) as err:
            problems.append(_unreadable(root, part, err))
    if not readable:
        return PartsRead(None, problems)
    schema = pa.unify_schemas(schemas, promote_options="permissive")
    try:
        return PartsRead(_dataset(readable, schema), problems)
    except (OSError, pa.ArrowException):
        pass
    tables = []
    for part in readable:
        try:
            tables.append(_dataset([part], schema))
        except (OSError, pa.ArrowException) as err:
            problems.append(_unreadable(root, part, err))
    return PartsRead(pa.concat_tables(tables) if tables else None, problems)


def read_steps(root: Path, *, strict: bool = True) -> PartsRead:
    """Every part of `root` as one table sorted by step, stably (the rows of one step in the
    order written); its table is None when there is no part (or no readable one).

    `strict` raises `DamagedPartError` naming the parts that cannot be read; otherwise they are
    left out and listed in `problems`. A table without a step column is returned unsorted, for
    the caller to report.
    """
    found = read_parts(root)
    if strict and found.problems:
        raise DamagedPartError(
            f"{root}: {'; '.join(found.problems)}; restore or delete the damaged parts "
            "(analysis reads the rest and reports them)"
        )
    table = found.table
    if table is not None and STEP in table.column_names:
        table = table.sort_by(STEP)  # Arrow's sort is stable
    return PartsRead(table, found.problems)


def _dataset(parts: list[Path], schema: pa.Schema) -> pa.Table:
    return ds.dataset([str(p) for p in parts], schema=schema, format="parquet").to_table()


def _unreadable(root: Path, part: Path, err: Exception) -> str:
    return f"unreadable {Path(root).name} part {part.name}: {err}"
