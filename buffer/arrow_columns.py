"""Zero-copy conversions between numpy arrays and the Arrow columns of a rollout record.

Split from `buffer.schema` (which owns what a record is) because these helpers are the fast
path of its codec: every column is built from buffers and read back as numpy views, never with
`pa.array()` / `Array.to_numpy()`, whose array-like probing imports pandas (about a second on
first use in every generator process) and costs a few µs per call (see
benchmarks/buffer_bench.py).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np
import pyarrow as pa

TIMESTAMP = pa.timestamp("us", tz="UTC")

NUMPY_TYPE = {
    pa.int16(): np.int16,
    pa.int32(): np.int32,
    pa.float32(): np.float32,
    pa.int64(): np.int64,
}


def numeric(values: np.ndarray, arrow_type: pa.DataType) -> pa.Array:
    """Zero-copy Arrow view of a contiguous numpy array of the matching width."""
    values = np.ascontiguousarray(values)
    return pa.Array.from_buffers(arrow_type, len(values), [None, pa.py_buffer(values)])


def strings(values: Sequence[str]) -> pa.Array:
    """A string column from its UTF-8 bytes and int32 offsets."""
    encoded = [v.encode() for v in values]
    offsets = np.zeros(len(encoded) + 1, dtype=np.int32)
    np.cumsum([len(e) for e in encoded], out=offsets[1:])
    buffers = [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(encoded))]
    return pa.Array.from_buffers(pa.string(), len(encoded), buffers)


def repeated(value: str, n: int) -> pa.Array:
    """A string column holding `value` n times (group-level fields repeat on every row)."""
    raw = value.encode()
    offsets = np.arange(n + 1, dtype=np.int32) * np.int32(len(raw))
    buffers = [None, pa.py_buffer(offsets), pa.py_buffer(raw * n)]
    return pa.Array.from_buffers(pa.string(), n, buffers)


def list_array(rows: Sequence[np.ndarray], value_type: pa.DataType) -> pa.ListArray:
    """One Arrow list column from per-sample 1-D arrays: flat values + int32 offsets, no row
    loop."""
    offsets = np.zeros(len(rows) + 1, dtype=np.int32)
    np.cumsum([len(r) for r in rows], out=offsets[1:])
    flat = np.concatenate(rows).astype(NUMPY_TYPE[value_type], copy=False)
    return pa.ListArray.from_arrays(numeric(offsets, pa.int32()), numeric(flat, value_type))


def flat(column: pa.ListArray) -> tuple[np.ndarray, np.ndarray]:
    """Flat values and 0-based offsets of a list column (zero-copy views into the message)."""
    offsets = view(column.offsets)
    values = view(column.values)
    return values[offsets[0] : offsets[-1]], offsets - offsets[0]


def view(array: pa.Array) -> np.ndarray:
    """numpy view of a null-free numeric Arrow array's data buffer."""
    dtype = np.dtype(NUMPY_TYPE[array.type])
    data = array.buffers()[1]
    if data is None:
        return np.zeros(0, dtype=dtype)
    return np.frombuffer(data, dtype=dtype, count=len(array), offset=array.offset * dtype.itemsize)


_NO_EXPERTS = np.zeros(0, dtype=np.int16)


# Columns that repeat across the groups of a run are built once (Arrow arrays are immutable, so
# sharing them between messages is safe): a group's encode then builds only its own columns.
@functools.lru_cache(maxsize=64)
def no_routing(n: int) -> pa.ListArray:
    offsets = numeric(np.zeros(n + 1, dtype=np.int32), pa.int32())
    return pa.ListArray.from_arrays(offsets, numeric(_NO_EXPERTS, pa.int16()))


@functools.lru_cache(maxsize=64)
def sample_index(n: int) -> pa.Array:
    return numeric(np.arange(n, dtype=np.int32), pa.int32())


@functools.lru_cache(maxsize=256)
def constant_strings(value: str, n: int) -> pa.Array:
    """run_id and generator_id: one value per run or generator."""
    return repeated(value, n)


@functools.lru_cache(maxsize=256)
def constant_ints(value: int, n: int) -> pa.Array:
    """routing_layers and routing_top_k: one pair per model."""
    return filled(value, n, pa.int32())


def filled(value: int, n: int, arrow_type: pa.DataType) -> pa.Array:
    """A numeric column holding `value` n times (timestamps as int64 µs since the epoch)."""
    dtype = np.int32 if arrow_type == pa.int32() else np.int64
    return numeric(np.full(n, value, dtype=dtype), arrow_type)
