"""Builders shared by the buffer tests and their worker processes."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from datetime import UTC, datetime

import pyarrow as pa

from buffer.config import BufferConfig
from buffer.record_versions import ROLLOUT_SCHEMA
from buffer.rollout_group import RolloutGroup
from buffer.schema import encode_group, make_group_id

RUN_ID = "run-test"
CREATED_AT = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)


def make_group(
    prompt_index: int,
    batch_index: int = 0,
    *,
    policy_version: int = 0,
    lengths: Sequence[int] = (3, 1),
    run_id: str = RUN_ID,
    generator_id: str = "gen-0",
    seed: int = 0,
) -> RolloutGroup:
    """A small valid group whose token values encode where they came from (easy to eyeball)."""
    base = 1000 * prompt_index
    return RolloutGroup(
        run_id=run_id,
        group_id=make_group_id(seed, batch_index, prompt_index),
        prompt_index=prompt_index,
        prompt_ids=[base + 1, base + 2],
        response_ids=[[base + 100 * i + j for j in range(n)] for i, n in enumerate(lengths)],
        behavior_logprobs=[[-0.5 - 0.25 * j for j in range(n)] for n in lengths],
        rewards=[float(i % 2) for i in range(len(lengths))],
        reward_infos=['{"correct": true}'] * len(lengths),
        finish_reasons=["stop"] * (len(lengths) - 1) + ["length"],
        policy_version=policy_version,
        generator_id=generator_id,
        created_at=CREATED_AT,
    )


def fast_config(**overrides: object) -> BufferConfig:
    """Short timeouts so failure paths finish quickly in tests."""
    values: dict[str, object] = {"max_depth": 64, "push_timeout_s": 5.0, "claim_idle_ms": 200}
    values.update(overrides)
    return BufferConfig(**values)


# ---- malformed messages (shared by the decode tests and the dead-letter tests) -------------------

SMALL_MESSAGE_LIMIT = 8192  # max_message_bytes used with the oversize case (a v2 group: ~2 KB)


def _columns(group: RolloutGroup | None = None) -> dict[str, pa.Array]:
    batch = pa.ipc.open_stream(encode_group(group or make_group(0))).read_next_batch()
    return dict(zip(batch.schema.names, batch.columns, strict=True))


def write_stream(columns: dict[str, pa.Array], batches: int = 1) -> bytes:
    """Arrow IPC stream bytes of hand-made columns (types exactly as given), declared as the
    current schema version (`decode_group` reads the layout the metadata names)."""
    batch = pa.RecordBatch.from_arrays(
        list(columns.values()), names=list(columns), metadata=ROLLOUT_SCHEMA.metadata
    )
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        for _ in range(batches):
            writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def _with(**replacements: pa.Array) -> bytes:
    columns = _columns()
    columns.update(replacements)
    return write_stream(columns)


def _without(name: str) -> bytes:
    columns = _columns()
    del columns[name]
    return write_stream(columns)


def _empty() -> bytes:
    return write_stream({name: col.slice(0, 0) for name, col in _columns().items()})


INT_LISTS = pa.list_(pa.int32())
FLOAT_LISTS = pa.list_(pa.float32())

# (case id, payload factory, substring the RecordError / dead-letter reason must contain).
# The default group (make_group(0)) has prompt [1, 2] and responses of lengths 3 and 1.
MALFORMED: list[tuple[str, Callable[[], bytes], str]] = [
    ("bad-bytes", lambda: b"\x00\x01 definitely not arrow", "not an Arrow IPC stream"),
    # The bytes of pickle.dumps({}) (protocol 5): a pickle must be refused, never loaded.
    ("pickle", lambda: b"\x80\x05\x95\x03\x00\x00\x00\x00\x00\x00\x00}\x94.", "not an Arrow"),
    ("two-batches", lambda: write_stream(_columns(), batches=2), "exactly one record batch"),
    ("wrong-type", lambda: _with(reward=pa.array([1.0, 0.0], pa.float64())), "schema mismatch"),
    ("missing-column", lambda: _without("reward_info"), "schema mismatch"),
    ("empty-group", _empty, "empty group"),
    (
        "length-mismatch",
        lambda: _with(behavior_logprobs=pa.array([[-0.5, -0.75], [-0.5]], FLOAT_LISTS)),
        "behavior_logprobs lengths",
    ),
    (
        "nan-logprob",
        lambda: _with(behavior_logprobs=pa.array([[-0.5, math.nan, -1.0], [-0.5]], FLOAT_LISTS)),
        "non-finite behavior logprob",
    ),
    (
        "inf-logprob",
        lambda: _with(behavior_logprobs=pa.array([[-0.5, -math.inf, -1.0], [-0.5]], FLOAT_LISTS)),
        "non-finite behavior logprob",
    ),
    (
        "inf-reward",
        lambda: _with(reward=pa.array([math.inf, 0.0], pa.float32())),
        "non-finite reward",
    ),
    ("null-reward", lambda: _with(reward=pa.array([None, 0.0], pa.float32())), "has nulls"),
    (
        "inconsistent-group-id",
        lambda: _with(group_id=pa.array(["s0-b0-p0", "s0-b0-p9"])),
        "rows disagree on group_id",
    ),
    (
        "inconsistent-prompt",
        lambda: _with(prompt_ids=pa.array([[1, 2], [1, 3]], INT_LISTS)),
        "different prompt_ids",
    ),
    (
        "negative-token",
        lambda: _with(response_ids=pa.array([[-1, 101, 102], [100]], INT_LISTS)),
        "negative token id",
    ),
    ("bad-finish-reason", lambda: _with(finish_reason=pa.array(["stop", "eos"])), "finish_reason"),
    ("reward-info-not-json", lambda: _with(reward_info=pa.array(["{", "{}"])), "not JSON"),
    ("sample-order", lambda: _with(sample_index=pa.array([1, 0], pa.int32())), "sample_index"),
    (
        "unknown-run-id",
        lambda: encode_group(make_group(0, run_id="some-other-run")),
        "unknown run id",
    ),
    (
        "over-size-limit",
        lambda: encode_group(make_group(0, lengths=(SMALL_MESSAGE_LIMIT,))),
        "over the limit",
    ),
    # Schema v3's per-token versions (a partial rollout's response spans versions).
    (
        "token-versions-length",
        lambda: _with(token_versions=pa.array([[0, 0], [0]], INT_LISTS)),
        "token_versions lengths",
    ),
    (
        "token-versions-backwards",
        lambda: _with(token_versions=pa.array([[0, 2, 1], [0]], INT_LISTS)),
        "go backwards",
    ),
    (
        "token-versions-older",
        lambda: _with(
            policy_version=pa.array([3, 3], pa.int64()),
            token_versions=pa.array([[2, 3, 3], [3]], INT_LISTS),
        ),
        "older than the group's policy_version 3",
    ),
]
