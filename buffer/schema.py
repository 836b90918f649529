"""The rollout record (design section 4): one Arrow row per sampled response, one group per message.

A group (all samples of one prompt draw) travels as one Arrow IPC stream message. Nothing here
pickles or evaluates received bytes: `decode_group` parses Arrow and checks every field, and any
violation raises `RecordError`, whose message says what was wrong, so the consumer can send the
message to the dead letter with that reason and carry on.

Token columns are held as numpy arrays (views into the received buffer after a decode), not as
Python lists: materialising ~16k Python ints per group would cost more than the Redis round trip
itself (see benchmarks/buffer_bench.py). Constructors accept lists and coerce them.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, fields
from datetime import UTC, datetime, timedelta
from typing import Literal

import numpy as np
import numpy.typing as npt
import pyarrow as pa

FinishReason = Literal["stop", "length"]
FINISH_REASONS: frozenset[str] = frozenset({"stop", "length"})

_TIMESTAMP = pa.timestamp("us", tz="UTC")

ROLLOUT_SCHEMA = pa.schema(
    [
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("group_id", pa.string(), nullable=False),
        pa.field("prompt_index", pa.int64(), nullable=False),
        pa.field("sample_index", pa.int32(), nullable=False),
        pa.field("prompt_ids", pa.list_(pa.int32()), nullable=False),
        pa.field("response_ids", pa.list_(pa.int32()), nullable=False),
        pa.field("behavior_logprobs", pa.list_(pa.float32()), nullable=False),
        pa.field("reward", pa.float32(), nullable=False),
        pa.field("reward_info", pa.string(), nullable=False),
        pa.field("finish_reason", pa.string(), nullable=False),
        pa.field("policy_version", pa.int64(), nullable=False),
        pa.field("generator_id", pa.string(), nullable=False),
        pa.field("created_at", _TIMESTAMP, nullable=False),
    ]
)

IntArray = npt.NDArray[np.int32]
FloatArray = npt.NDArray[np.float32]


class RecordError(ValueError):
    """A rollout record is malformed; the message names the field and what was wrong with it."""


def make_group_id(seed: int, batch_index: int, prompt_index: int) -> str:
    """Deterministic group id: the same (seed, batch, prompt) names the same group in every arm.

    Readable on purpose, so a dead-letter entry or a checkpoint's trained-id list can be traced
    back to its prompt draw without a lookup table.
    """
    if min(batch_index, prompt_index) < 0:
        raise ValueError(
            f"make_group_id: batch_index={batch_index} and prompt_index={prompt_index} must be >= 0"
        )
    return f"s{seed}-b{batch_index}-p{prompt_index}"


@dataclass(frozen=True, eq=False)
class RolloutGroup:
    """All samples of one prompt draw. Checked on construction, so a bad group never exists.

    `prompt_ids` is shared by every sample; the other per-sample fields have one entry per sample
    in sample order. Token fields accept lists and are stored as int32/float32 numpy arrays.
    """

    run_id: str
    group_id: str
    prompt_index: int
    prompt_ids: IntArray
    response_ids: list[IntArray]
    behavior_logprobs: list[FloatArray]
    rewards: list[float]
    reward_infos: list[str]
    finish_reasons: list[FinishReason]
    policy_version: int
    generator_id: str
    created_at: datetime

    def __post_init__(self) -> None:
        try:
            prompt = _int32(self.prompt_ids)
            responses = [_int32(r) for r in self.response_ids]
            logprobs = [np.asarray(lp, dtype=np.float32) for lp in self.behavior_logprobs]
            rewards = [float(r) for r in self.rewards]
        except (TypeError, ValueError, OverflowError) as exc:
            raise RecordError(
                f"group {self.group_id!r}: tokens must be int32 ids, logprobs and rewards "
                f"floats ({exc})"
            ) from None
        coerce = object.__setattr__  # frozen dataclass: coerce once, here, then never again
        coerce(self, "prompt_ids", prompt)
        coerce(self, "response_ids", responses)
        coerce(self, "behavior_logprobs", logprobs)
        coerce(self, "rewards", rewards)
        coerce(self, "reward_infos", list(self.reward_infos))
        coerce(self, "finish_reasons", list(self.finish_reasons))
        _check_group(self)

    @property
    def num_samples(self) -> int:
        """G, the number of sampled responses in this group."""
        return len(self.response_ids)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RolloutGroup):
            return NotImplemented
        return all(
            _field_equal(getattr(self, f.name), getattr(other, f.name)) for f in fields(self)
        )

    __hash__ = None  # type: ignore[assignment]  # mutable numpy payload: not hashable


_INT32_MAX = np.iinfo(np.int32).max


def _int32(values: object) -> IntArray:
    """Token ids as int32, refusing what a plain cast would silently wrap or truncate."""
    array = np.asarray(values)
    if array.dtype == np.int32 or array.size == 0:
        return array.astype(np.int32, copy=False)
    if not np.issubdtype(array.dtype, np.integer):
        raise TypeError(f"token ids have dtype {array.dtype}, not an integer type")
    if array.max() > _INT32_MAX:
        raise OverflowError(f"token id {array.max()} does not fit int32")
    return array.astype(np.int32)


def _field_equal(a: object, b: object) -> bool:
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and np.array_equal(a, b)
    if isinstance(a, list) and a and isinstance(a[0], np.ndarray):
        return (
            isinstance(b, list)
            and len(a) == len(b)
            and all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
        )
    return a == b


def _check_group(g: RolloutGroup) -> None:
    """Every invariant the learner relies on; raises RecordError naming the first violation."""
    where = f"group {g.group_id!r}"
    for name in ("run_id", "group_id", "generator_id"):
        if not isinstance(getattr(g, name), str) or not getattr(g, name):
            raise RecordError(f"{where}: {name} must be a non-empty string")
    if g.prompt_index < 0 or g.policy_version < 0:
        raise RecordError(
            f"{where}: prompt_index={g.prompt_index} and policy_version={g.policy_version} "
            "must be >= 0"
        )
    n = len(g.response_ids)
    if n == 0:
        raise RecordError(f"{where} is empty: a group needs at least one sampled response")
    per_sample = {
        "behavior_logprobs": g.behavior_logprobs,
        "rewards": g.rewards,
        "reward_infos": g.reward_infos,
        "finish_reasons": g.finish_reasons,
    }
    for name, values in per_sample.items():
        if len(values) != n:
            raise RecordError(f"{where}: {len(values)} {name} for {n} responses; give one each")
    if g.prompt_ids.ndim != 1 or g.prompt_ids.size == 0:
        raise RecordError(f"{where}: prompt_ids must be a non-empty 1-D token list")
    if any(a.ndim != 1 for a in (*g.response_ids, *g.behavior_logprobs)):
        raise RecordError(f"{where}: each response and its logprobs must be a 1-D list")
    lengths = [len(r) for r in g.response_ids]
    lp_lengths = [len(lp) for lp in g.behavior_logprobs]
    if lengths != lp_lengths:
        raise RecordError(
            f"{where}: response_ids lengths {lengths} != behavior_logprobs lengths {lp_lengths}; "
            "the generator must emit exactly one logprob per response token"
        )
    tokens = np.concatenate([g.prompt_ids, *g.response_ids])
    if tokens.min() < 0:
        raise RecordError(f"{where}: negative token id {int(tokens.min())}")
    if sum(lengths) and not np.isfinite(np.concatenate(g.behavior_logprobs)).all():
        raise RecordError(f"{where}: non-finite behavior logprob (NaN or inf) in a response")
    if not all(math.isfinite(r) for r in g.rewards):
        raise RecordError(f"{where}: non-finite reward in {g.rewards}")
    bad = sorted(set(g.finish_reasons) - FINISH_REASONS)
    if bad:
        raise RecordError(f"{where}: finish_reason {bad} is not one of {sorted(FINISH_REASONS)}")
    for info in set(g.reward_infos):
        try:
            json.loads(info)
        except (TypeError, ValueError) as exc:
            raise RecordError(f"{where}: reward_info {info!r:.80} is not JSON ({exc})") from None
    if not isinstance(g.created_at, datetime) or g.created_at.tzinfo is None:
        raise RecordError(f"{where}: created_at must be timezone-aware (use datetime.now(UTC))")


_NUMPY_TYPE = {pa.int32(): np.int32, pa.float32(): np.float32, pa.int64(): np.int64}


def _numeric(values: np.ndarray, arrow_type: pa.DataType) -> pa.Array:
    """Zero-copy Arrow view of a contiguous numpy array of the matching width.

    Built from buffers rather than with pa.array(), whose array-like probing imports pandas
    (about a second on first use in every generator process) and costs a few µs per call.
    """
    values = np.ascontiguousarray(values)
    return pa.Array.from_buffers(arrow_type, len(values), [None, pa.py_buffer(values)])


def _strings(values: Sequence[str]) -> pa.Array:
    """A string column from its UTF-8 bytes and int32 offsets (see `_numeric` for why)."""
    encoded = [v.encode() for v in values]
    offsets = np.zeros(len(encoded) + 1, dtype=np.int32)
    np.cumsum([len(e) for e in encoded], out=offsets[1:])
    buffers = [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(encoded))]
    return pa.Array.from_buffers(pa.string(), len(encoded), buffers)


def _repeated(value: str, n: int) -> pa.Array:
    """A string column holding `value` n times (group-level fields repeat on every row)."""
    raw = value.encode()
    offsets = np.arange(n + 1, dtype=np.int32) * np.int32(len(raw))
    buffers = [None, pa.py_buffer(offsets), pa.py_buffer(raw * n)]
    return pa.Array.from_buffers(pa.string(), n, buffers)


def _list_array(rows: Sequence[np.ndarray], value_type: pa.DataType) -> pa.ListArray:
    """One Arrow list column from per-sample arrays: flat values + int32 offsets, no row loop."""
    offsets = np.zeros(len(rows) + 1, dtype=np.int32)
    np.cumsum([len(r) for r in rows], out=offsets[1:])
    flat = np.concatenate(rows).astype(_NUMPY_TYPE[value_type], copy=False)
    return pa.ListArray.from_arrays(_numeric(offsets, pa.int32()), _numeric(flat, value_type))


def encode_group(group: RolloutGroup) -> bytes:
    """One Arrow IPC stream message with one row per sample (the group was checked when built)."""
    n = group.num_samples
    columns = {
        "run_id": _repeated(group.run_id, n),
        "group_id": _repeated(group.group_id, n),
        "prompt_index": _numeric(np.full(n, group.prompt_index, dtype=np.int64), pa.int64()),
        "sample_index": _numeric(np.arange(n, dtype=np.int32), pa.int32()),
        "prompt_ids": _list_array([group.prompt_ids] * n, pa.int32()),
        "response_ids": _list_array(group.response_ids, pa.int32()),
        "behavior_logprobs": _list_array(group.behavior_logprobs, pa.float32()),
        "reward": _numeric(np.asarray(group.rewards, dtype=np.float32), pa.float32()),
        "reward_info": _strings(group.reward_infos),
        "finish_reason": _strings(group.finish_reasons),
        "policy_version": _numeric(np.full(n, group.policy_version, dtype=np.int64), pa.int64()),
        "generator_id": _repeated(group.generator_id, n),
        "created_at": _numeric(np.full(n, _micros(group.created_at), dtype=np.int64), _TIMESTAMP),
    }
    batch = pa.RecordBatch.from_arrays(
        [columns[name] for name in ROLLOUT_SCHEMA.names], schema=ROLLOUT_SCHEMA
    )
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, ROLLOUT_SCHEMA) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def decode_group(
    data: bytes, expected_run_id: str | None = None, max_bytes: int | None = None
) -> RolloutGroup:
    """Parse and check one group message; any problem raises RecordError saying what it was.

    Token columns come back as numpy views into `data` (zero-copy); per-row scalar columns hold G
    values and are compared in Python, which is cheaper than an Arrow compute call at this size.
    """
    if max_bytes is not None and len(data) > max_bytes:
        raise RecordError(
            f"message is {len(data)} bytes, over the limit of {max_bytes} "
            "(buffer.max_message_bytes); shorten responses or raise the limit"
        )
    batch = _read_single_batch(data)
    _check_schema(batch.schema)
    cols = dict(zip(ROLLOUT_SCHEMA.names, batch.columns, strict=True))
    for name, column in cols.items():
        if column.null_count or (isinstance(column, pa.ListArray) and column.values.null_count):
            raise RecordError(f"column {name!r} has nulls; every field is required")
    scalars = {name: cols[name].to_pylist() for name in _GROUP_SCALARS}
    scalars["created_at"] = cols["created_at"].view(pa.int64()).to_pylist()  # µs since epoch
    for name, values in scalars.items():
        if values.count(values[0]) != len(values):
            raise RecordError(f"inconsistent group: rows disagree on {name} ({values[:4]}...)")
    run_id = scalars["run_id"][0]
    if expected_run_id is not None and run_id != expected_run_id:
        raise RecordError(f"unknown run id {run_id!r}: this buffer serves run {expected_run_id!r}")
    n = batch.num_rows
    if cols["sample_index"].to_pylist() != list(range(n)):
        raise RecordError(f"sample_index must be 0..{n - 1} in row order")
    resp_values, resp_offsets = _flat(cols["response_ids"])
    lp_values, lp_offsets = _flat(cols["behavior_logprobs"])
    if not np.array_equal(resp_offsets, lp_offsets):
        raise RecordError(
            f"response_ids lengths {np.diff(resp_offsets)} != behavior_logprobs lengths "
            f"{np.diff(lp_offsets)}; the generator must emit one logprob per response token"
        )
    bounds = list(itertools.pairwise(resp_offsets.tolist()))
    return RolloutGroup(
        run_id=run_id,
        group_id=scalars["group_id"][0],
        prompt_index=scalars["prompt_index"][0],
        prompt_ids=_shared_prompt(cols["prompt_ids"], n),
        response_ids=[resp_values[a:b] for a, b in bounds],
        behavior_logprobs=[lp_values[a:b] for a, b in bounds],
        rewards=cols["reward"].to_pylist(),
        reward_infos=cols["reward_info"].to_pylist(),
        finish_reasons=cols["finish_reason"].to_pylist(),
        policy_version=scalars["policy_version"][0],
        generator_id=scalars["generator_id"][0],
        created_at=_EPOCH + timedelta(microseconds=scalars["created_at"][0]),
    )


def _micros(moment: datetime) -> int:
    """Microseconds since the Unix epoch, exact (no float rounding)."""
    return (moment - _EPOCH) // timedelta(microseconds=1)


_GROUP_SCALARS = ("run_id", "group_id", "prompt_index", "policy_version", "generator_id")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _read_single_batch(data: bytes) -> pa.RecordBatch:
    try:
        reader = pa.ipc.open_stream(data)
        batch = next(reader, None)
        extra = next(reader, None)
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise RecordError(f"not an Arrow IPC stream ({len(data)} bytes): {exc}") from None
    if batch is None or batch.num_rows == 0:
        raise RecordError("empty group: the message has no rows (a group needs >= 1 sample)")
    if extra is not None:
        raise RecordError("a group message holds exactly one record batch, got more")
    return batch


def _check_schema(schema: pa.Schema) -> None:
    """Names and types must match ROLLOUT_SCHEMA; nullability and metadata are not compared."""
    if schema.equals(ROLLOUT_SCHEMA):  # the fast path: every message from encode_group
        return
    got = {f.name: f.type for f in schema}
    want = {f.name: f.type for f in ROLLOUT_SCHEMA}
    if schema.names == ROLLOUT_SCHEMA.names and got == want:
        return
    missing = sorted(want.keys() - got.keys())
    extra = sorted(got.keys() - want.keys())
    wrong = [f"{k}: {got[k]} (want {want[k]})" for k in want if k in got and got[k] != want[k]]
    raise RecordError(
        f"schema mismatch: missing {missing}, unexpected {extra}, wrong types {wrong}, "
        f"order {schema.names}; producers must encode with buffer.schema.encode_group"
    )


def _flat(column: pa.ListArray) -> tuple[np.ndarray, np.ndarray]:
    """Flat values and 0-based offsets of a list column (zero-copy views into the message)."""
    offsets = _view(column.offsets)
    values = _view(column.values)
    return values[offsets[0] : offsets[-1]], offsets - offsets[0]


def _view(array: pa.Array) -> np.ndarray:
    """numpy view of a null-free numeric Arrow array's data buffer (not Array.to_numpy, which
    imports pandas on first use)."""
    dtype = np.dtype(_NUMPY_TYPE[array.type])
    data = array.buffers()[1]
    if data is None:
        return np.zeros(0, dtype=dtype)
    return np.frombuffer(data, dtype=dtype, count=len(array), offset=array.offset * dtype.itemsize)


def _shared_prompt(column: pa.ListArray, n: int) -> IntArray:
    values, offsets = _flat(column)
    width = int(offsets[1])
    if (
        not (np.diff(offsets) == width).all()
        or not (values.reshape(n, width) == values[:width]).all()
    ):
        raise RecordError("inconsistent group: rows carry different prompt_ids")
    return values[:width]
