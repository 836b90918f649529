"""Schema v3: the policy version of every response token (partial rollouts: a response the
generator continued after loading new weights spans several versions). v1 and v2 messages still
read, with every token at the group's version; bad per-token versions are refused in one line
(and dead-lettered: the MALFORMED cases of tests/buffer/factories.py run through the buffer)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa
import pytest

from buffer.record_types import RecordError
from buffer.rollout_group import RolloutGroup
from buffer.schema import decode_group, encode_group
from tests.buffer.factories import RUN_ID, make_group
from tests.buffer.test_schema_v2 import v1_bytes


def spanning(group: RolloutGroup | None = None) -> RolloutGroup:
    """make_group(0) started at version 2 (responses of 3 and 1 tokens), its first response
    continued after v3 and v4 were loaded."""
    base = dataclasses.replace(group or make_group(0), policy_version=2)
    return dataclasses.replace(base, token_versions=[[2, 3, 4], [2]])


def test_a_spanning_group_round_trips_with_its_versions() -> None:
    group = spanning()
    back = decode_group(encode_group(group), expected_run_id=RUN_ID)
    assert back == group
    assert [v.tolist() for v in back.versions_per_token()] == [[2, 3, 4], [2]]
    assert back.policy_version == 2 and back.newest_token_version == 4
    assert all(v.dtype == np.int32 for v in back.token_versions)


def test_a_whole_group_of_one_version_stores_none_and_reads_its_version() -> None:
    group = make_group(0, policy_version=5)
    assert group.token_versions is None and group.newest_token_version == 5
    batch = pa.ipc.open_stream(encode_group(group)).read_next_batch()
    assert batch.column("token_versions").to_pylist() == [[5, 5, 5], [5]]
    back = decode_group(encode_group(group))
    assert back.token_versions is None and back == group
    # Explicit versions all equal to policy_version are the same group.
    same = dataclasses.replace(group, token_versions=[[5, 5, 5], [5]])
    assert same.token_versions is None and same == group


def test_v1_and_v2_messages_have_every_token_at_the_groups_version() -> None:
    group = make_group(0, policy_version=4)
    back = decode_group(v1_bytes(group))
    assert [v.tolist() for v in back.versions_per_token()] == [[4, 4, 4], [4]]


@pytest.mark.parametrize(
    ("versions", "reason"),
    [
        ([[2, 3], [2]], r"token_versions lengths \[2, 1\] != response_ids lengths \[3, 1\]"),
        ([[2, 4, 3], [2]], "go backwards"),
        ([[1, 2, 2], [2]], "older than the group's policy_version 2"),
    ],
    ids=["length", "backwards", "older"],
)
def test_bad_versions_are_refused_at_construction(versions: list, reason: str) -> None:
    base = dataclasses.replace(make_group(0), policy_version=2)
    with pytest.raises(RecordError, match=reason) as caught:
        dataclasses.replace(base, token_versions=versions)
    assert "\n" not in str(caught.value)


def test_v2_messages_still_decode() -> None:
    """What a v2 producer sent: today's columns but token_versions, declared version 2."""
    group = make_group(0, policy_version=6)
    batch = pa.ipc.open_stream(encode_group(group)).read_next_batch()
    v2 = batch.drop_columns(["token_versions"]).replace_schema_metadata(
        {b"gspo.schema_version": b"2"}
    )
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, v2.schema) as writer:
        writer.write_batch(v2)
    back = decode_group(sink.getvalue().to_pybytes())
    assert back == group and back.token_versions is None
    assert [v.tolist() for v in back.versions_per_token()] == [[6, 6, 6], [6]]
