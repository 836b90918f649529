"""Schema v2: generation start time and rollout routing; v1 messages still read, others refused."""

from __future__ import annotations

from datetime import datetime, timedelta

import numpy as np
import pyarrow as pa
import pytest

from buffer.record_types import RecordError
from buffer.record_versions import ROLLOUT_SCHEMA, schema_version
from buffer.rollout_group import RolloutGroup
from buffer.schema import decode_group, encode_group
from tests.buffer.factories import CREATED_AT, RUN_ID, make_group, write_stream

STARTED_AT = CREATED_AT - timedelta(seconds=2, microseconds=5)
LAYERS, TOP_K = 2, 2


def routing_for(group: RolloutGroup) -> list[np.ndarray]:
    """[P + R - 1, layers, top_k] per sample, values 100 * sample + 10 * position + slot.

    make_group(0) has a 2-token prompt and responses of 3 and 1 tokens: 4 and 2 positions.
    """
    arrays = []
    for j, response in enumerate(group.response_ids):
        positions = len(group.prompt_ids) + len(response) - 1
        base = 100 * j + 10 * np.arange(positions)[:, None, None]  # (T, 1, 1)
        slots = np.arange(LAYERS * TOP_K).reshape(1, LAYERS, TOP_K)  # (1, layers, k)
        arrays.append((base + slots).astype(np.int16))
    return arrays


def routed_group(**overrides: object) -> RolloutGroup:
    base = make_group(0)
    values = {name: getattr(base, name) for name in base.__dataclass_fields__}
    values |= {"generation_started_at": STARTED_AT, "routed_experts": routing_for(base)}
    values.update(overrides)
    return RolloutGroup(**values)


def test_round_trip_with_routing() -> None:
    group = routed_group()
    back = decode_group(encode_group(group), expected_run_id=RUN_ID)
    assert back == group
    assert back.generation_started_at == STARTED_AT  # microsecond precision kept
    assert back.routing_shape == (LAYERS, TOP_K)
    assert [a.shape for a in back.routed_experts] == [(4, 2, 2), (2, 2, 2)]
    assert all(a.dtype == np.int16 for a in back.routed_experts)
    # Sample 1, position 1, layer 1, slot 0: 100 * 1 + 10 * 1 + (1 * 2 + 0) = 112.
    assert back.routed_experts[1][1, 1, 0] == 112


def test_routing_travels_flat_with_its_shape_per_row() -> None:
    batch = pa.ipc.open_stream(encode_group(routed_group())).read_next_batch()
    assert batch.schema.metadata == {b"gspo.schema_version": b"3"}  # v2's columns, and v3's
    assert batch.column("routing_layers").to_pylist() == [2, 2]
    assert batch.column("routing_top_k").to_pylist() == [2, 2]
    flat = batch.column("routed_experts").to_pylist()
    assert [len(row) for row in flat] == [4 * 2 * 2, 2 * 2 * 2]
    # Sample 1 row-major: position 0 -> 100..103, position 1 -> 110..113.
    assert flat[1] == [100, 101, 102, 103, 110, 111, 112, 113]


def test_round_trip_without_routing_and_default_start() -> None:
    group = make_group(3, lengths=(2, 0, 1))  # an empty response too
    assert group.generation_started_at == group.created_at  # None means created_at
    assert group.routed_experts is None and group.routing_shape == (0, 0)
    back = decode_group(encode_group(group))
    assert back == group and back.routed_experts is None
    batch = pa.ipc.open_stream(encode_group(group)).read_next_batch()
    assert batch.column("routing_layers").to_pylist() == [0, 0, 0]
    assert batch.column("routed_experts").to_pylist() == [[], [], []]


def test_routing_of_an_empty_response_covers_the_prompt_but_its_last_token() -> None:
    group = make_group(0, lengths=(0,))  # P = 2, R = 0: one position (the first prompt token)
    routed = [np.array([[[1, 2]]], dtype=np.int16)]  # (1, 1, 2)
    values = {name: getattr(group, name) for name in group.__dataclass_fields__}
    back = decode_group(encode_group(RolloutGroup(**(values | {"routed_experts": routed}))))
    assert back.routed_experts[0].tolist() == [[[1, 2]]]


# ---- v1 compatibility and unknown versions -----------------------------------------------------

V1_SCHEMA = pa.schema(  # design section 4 as written before v2; no metadata
    [
        ("run_id", pa.string()),
        ("group_id", pa.string()),
        ("prompt_index", pa.int64()),
        ("sample_index", pa.int32()),
        ("prompt_ids", pa.list_(pa.int32())),
        ("response_ids", pa.list_(pa.int32())),
        ("behavior_logprobs", pa.list_(pa.float32())),
        ("reward", pa.float32()),
        ("reward_info", pa.string()),
        ("finish_reason", pa.string()),
        ("policy_version", pa.int64()),
        ("generator_id", pa.string()),
        ("created_at", pa.timestamp("us", tz="UTC")),
    ]
)


def v1_bytes(group: RolloutGroup) -> bytes:
    """What a v1 producer sent: plain pa.array columns under the 13-column schema."""
    n = group.num_samples
    rows = {
        "run_id": [group.run_id] * n,
        "group_id": [group.group_id] * n,
        "prompt_index": [group.prompt_index] * n,
        "sample_index": list(range(n)),
        "prompt_ids": [group.prompt_ids.tolist()] * n,
        "response_ids": [r.tolist() for r in group.response_ids],
        "behavior_logprobs": [lp.tolist() for lp in group.behavior_logprobs],
        "reward": group.rewards,
        "reward_info": group.reward_infos,
        "finish_reason": group.finish_reasons,
        "policy_version": [group.policy_version] * n,
        "generator_id": [group.generator_id] * n,
        "created_at": [group.created_at] * n,
    }
    batch = pa.RecordBatch.from_pydict(rows, schema=V1_SCHEMA)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, V1_SCHEMA) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def test_v1_messages_still_decode() -> None:
    group = make_group(5, batch_index=2, policy_version=1, lengths=(3, 0, 2))
    data = v1_bytes(group)
    assert schema_version(pa.ipc.open_stream(data).schema) == 1
    back = decode_group(data, expected_run_id=RUN_ID)
    assert back == group  # the v2 fields: start = created_at, no routing
    assert back.generation_started_at == CREATED_AT and back.routed_experts is None


def test_v1_checks_still_apply() -> None:
    data = v1_bytes(make_group(0, run_id="another-run"))
    with pytest.raises(RecordError, match="unknown run id"):
        decode_group(data, expected_run_id=RUN_ID)


@pytest.mark.parametrize("version", [b"4", b"0", b"two"])
def test_unknown_versions_are_refused_by_name(version: bytes) -> None:
    columns = pa.ipc.open_stream(encode_group(make_group(0))).read_next_batch()
    batch = columns.replace_schema_metadata({b"gspo.schema_version": version})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    with pytest.raises(RecordError, match=rf"version '{version.decode()}'.*versions 1, 2, 3"):
        decode_group(sink.getvalue().to_pybytes())


def test_v2_metadata_on_v1_columns_is_a_schema_mismatch() -> None:
    batch = pa.ipc.open_stream(v1_bytes(make_group(0))).read_next_batch()
    columns = dict(zip(batch.schema.names, batch.columns, strict=True))
    with pytest.raises(RecordError, match=r"schema mismatch \(version 3\).*missing"):
        decode_group(write_stream(columns))  # write_stream declares the current version


# ---- checks on the new fields ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        ({"generation_started_at": CREATED_AT + timedelta(microseconds=1)}, "after created_at"),
        ({"generation_started_at": datetime(2026, 1, 1)}, "generation_started_at must be timezone"),
        ({"routed_experts": [np.zeros((4, 2, 2), np.int16)]}, "1 routed_experts for 2 responses"),
        (
            {"routed_experts": [np.zeros((4, 2, 2), np.int16), np.zeros((3, 2, 2), np.int16)]},
            r"cover \[4, 3\] positions, but P \+ R - 1 = \[4, 2\]",
        ),
        (
            {"routed_experts": [np.zeros((4, 2, 2), np.int16), np.zeros((2, 2, 1), np.int16)]},
            "one positive pair",
        ),
        (
            {"routed_experts": [np.zeros((4, 4), np.int16), np.zeros((2, 4), np.int16)]},
            r"\[P \+ R - 1, layers, top_k\]",
        ),
        (
            {"routed_experts": [np.full((4, 2, 2), -1), np.zeros((2, 2, 2), np.int16)]},
            "negative expert index -1",
        ),
        (
            {"routed_experts": [np.full((4, 2, 2), 40000), np.zeros((2, 2, 2))]},
            "int16",
        ),
    ],
)  # fmt: skip
def test_new_field_construction_checks(overrides: dict[str, object], reason: str) -> None:
    with pytest.raises(RecordError, match=reason):
        routed_group(**overrides)


def _columns() -> dict[str, pa.Array]:
    batch = pa.ipc.open_stream(encode_group(routed_group())).read_next_batch()
    return dict(zip(batch.schema.names, batch.columns, strict=True))


@pytest.mark.parametrize(
    ("replacements", "reason"),
    [
        ({"routing_layers": pa.array([3, 3], pa.int32())}, "routed_experts lengths"),
        ({"routing_layers": pa.array([2, 1], pa.int32())}, "rows disagree on routing_layers"),
        (
            {"routing_layers": pa.array([0, 0], pa.int32()),
             "routing_top_k": pa.array([0, 0], pa.int32())},
            "routing_layers = routing_top_k = 0",
        ),
        ({"routing_top_k": pa.array([0, 0], pa.int32())}, "must both be > 0"),
        (
            {"generation_started_at": pa.array([CREATED_AT + timedelta(seconds=1)] * 2,
                                               pa.timestamp("us", tz="UTC"))},
            "after created_at",
        ),
        (
            {"routed_experts": pa.array([[0] * 16, [-3] * 8], pa.list_(pa.int16()))},
            "negative expert index -3",
        ),
    ],
)  # fmt: skip
def test_malformed_routing_in_a_message(replacements: dict[str, pa.Array], reason: str) -> None:
    columns = _columns() | replacements
    with pytest.raises(RecordError, match=reason):
        decode_group(write_stream(columns))


def test_schema_version_reads_the_metadata() -> None:
    assert schema_version(ROLLOUT_SCHEMA) == 3
    assert schema_version(V1_SCHEMA) == 1


@pytest.mark.parametrize("routed", [False, True])
def test_encode_writes_exactly_the_arrow_stream_writers_bytes(routed: bool) -> None:
    """encode_group joins a cached schema message, the batch and the end-of-stream marker; the
    result must be byte for byte what pyarrow's stream writer makes of the same batch."""
    group = routed_group() if routed else make_group(3)
    data = encode_group(group)
    batch = pa.ipc.open_stream(data).read_next_batch()
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    assert data == sink.getvalue().to_pybytes()
    assert decode_group(data) == group
