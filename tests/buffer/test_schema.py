"""Record schema: exact Arrow types, lossless round trip, and one RecordError per malformed case."""

from __future__ import annotations

from datetime import datetime

import numpy as np
import pyarrow as pa
import pytest

from buffer.record_types import RecordError
from buffer.record_versions import ROLLOUT_SCHEMA
from buffer.rollout_group import RolloutGroup
from buffer.schema import decode_group, encode_group, make_group_id
from tests.buffer.factories import CREATED_AT, MALFORMED, RUN_ID, SMALL_MESSAGE_LIMIT, make_group


def test_schema_has_the_design_types() -> None:
    expected = {
        "run_id": pa.string(),
        "group_id": pa.string(),
        "prompt_index": pa.int64(),
        "sample_index": pa.int32(),
        "prompt_ids": pa.list_(pa.int32()),
        "response_ids": pa.list_(pa.int32()),
        "behavior_logprobs": pa.list_(pa.float32()),
        "reward": pa.float32(),
        "reward_info": pa.string(),
        "finish_reason": pa.string(),
        "policy_version": pa.int64(),
        "generator_id": pa.string(),
        "created_at": pa.timestamp("us", tz="UTC"),
        # Schema v2 (tests/buffer/test_schema_v2.py): generation start and rollout routing.
        "generation_started_at": pa.timestamp("us", tz="UTC"),
        "routing_layers": pa.int32(),
        "routing_top_k": pa.int32(),
        "routed_experts": pa.list_(pa.int16()),
        # Schema v3 (tests/buffer/test_schema_v3.py): the version of every response token.
        "token_versions": pa.list_(pa.int32()),
    }
    assert {f.name: f.type for f in ROLLOUT_SCHEMA} == expected
    assert ROLLOUT_SCHEMA.names == list(expected)
    assert ROLLOUT_SCHEMA.metadata == {b"gspo.schema_version": b"3"}


def test_round_trip_of_a_ragged_group() -> None:
    # Lengths 3, 0 and 2: an empty response (immediate stop) must survive too.
    group = make_group(7, batch_index=3, policy_version=2, lengths=(3, 0, 2))
    data = encode_group(group)
    assert data[:4] == b"\xff\xff\xff\xff"  # Arrow IPC continuation marker, not a pickle
    back = decode_group(data, expected_run_id=RUN_ID, max_bytes=len(data))
    assert back == group
    assert back.group_id == "s0-b3-p7"
    assert back.prompt_index == 7 and back.policy_version == 2
    assert back.prompt_ids.tolist() == [7001, 7002]
    assert [r.tolist() for r in back.response_ids] == [[7000, 7001, 7002], [], [7200, 7201]]
    assert [lp.tolist() for lp in back.behavior_logprobs] == [
        [-0.5, -0.75, -1.0],
        [],
        [-0.5, -0.75],
    ]
    assert all(r.dtype == np.int32 for r in back.response_ids)
    assert all(lp.dtype == np.float32 for lp in back.behavior_logprobs)
    assert back.rewards == [0.0, 1.0, 0.0]
    assert back.reward_infos == ['{"correct": true}'] * 3
    assert back.finish_reasons == ["stop", "stop", "length"]
    assert back.generator_id == "gen-0"
    assert back.created_at == CREATED_AT  # microsecond precision kept


def test_rows_of_the_message_follow_the_schema() -> None:
    batch = pa.ipc.open_stream(encode_group(make_group(1, lengths=(2, 1)))).read_next_batch()
    assert batch.schema.equals(ROLLOUT_SCHEMA)
    assert batch.column("sample_index").to_pylist() == [0, 1]
    assert batch.column("prompt_ids").to_pylist() == [[1001, 1002], [1001, 1002]]
    assert batch.column("response_ids").to_pylist() == [[1000, 1001], [1100]]


def test_group_id_is_deterministic_and_distinct() -> None:
    assert make_group_id(1, 2, 3) == make_group_id(1, 2, 3) == "s1-b2-p3"
    ids = {make_group_id(s, b, p) for s in range(3) for b in range(3) for p in range(3)}
    assert len(ids) == 27
    with pytest.raises(ValueError, match="must be >= 0"):
        make_group_id(0, -1, 0)


@pytest.mark.parametrize(("case", "payload", "reason"), MALFORMED, ids=[c[0] for c in MALFORMED])
def test_malformed_message_raises_record_error(case: str, payload, reason: str) -> None:
    with pytest.raises(RecordError, match=reason):
        decode_group(payload(), expected_run_id=RUN_ID, max_bytes=SMALL_MESSAGE_LIMIT)


def test_record_error_is_a_value_error() -> None:
    assert issubclass(RecordError, ValueError)


def _group_kwargs(**overrides: object) -> dict[str, object]:
    group = make_group(0)
    values = {name: getattr(group, name) for name in group.__dataclass_fields__}
    values.update(overrides)
    return values


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        ({"response_ids": [], "behavior_logprobs": [], "rewards": [], "reward_infos": [],
          "finish_reasons": []}, "is empty"),
        ({"behavior_logprobs": [[-0.5], [-0.5]]}, "behavior_logprobs lengths"),
        ({"rewards": [1.0]}, "1 rewards for 2 responses"),
        ({"prompt_ids": []}, "prompt_ids must be a non-empty"),
        ({"response_ids": [[2**40, 1, 2], [3]]}, "int32"),
        ({"response_ids": [np.array([2**40, 1, 2]), [3]]}, "int32"),  # no silent wrap-around
        ({"prompt_ids": [1.5, 2.0]}, "int32"),  # no silent truncation
        ({"rewards": [float("nan"), 0.0]}, "non-finite reward"),
        ({"created_at": datetime(2026, 1, 1)}, "timezone-aware"),
        ({"group_id": ""}, "group_id must be a non-empty string"),
        ({"policy_version": -1}, "must be >= 0"),
    ],
)  # fmt: skip
def test_group_construction_checks(overrides: dict[str, object], reason: str) -> None:
    with pytest.raises(RecordError, match=reason):
        RolloutGroup(**_group_kwargs(**overrides))


def test_constructor_coerces_lists_to_arrays() -> None:
    group = make_group(0)
    assert isinstance(group.prompt_ids, np.ndarray) and group.prompt_ids.dtype == np.int32
    assert group.num_samples == 2
    assert group != make_group(1)
