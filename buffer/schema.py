"""The rollout record's wire format (design section 4): one Arrow row per sampled response, one
group per message.

A group (`buffer.rollout_group.RolloutGroup`) travels as one Arrow IPC stream message. Nothing
here pickles or evaluates received bytes: `decode_group` parses Arrow and checks every field, and
any violation raises `RecordError` (`buffer.record_types`), whose message says what was wrong, so
the consumer can send the message to the dead letter with that reason and carry on.

The versions (v1-v3), their schemas and how a message names its version: `buffer.record_versions`.
A group's id (`make_group_id`) is part of the record's format: rewinds parse the prompt index
back out of it (`buffer.rewind`). Token columns decode to numpy views into the received buffer
(zero-copy), never Python lists.
"""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

import numpy as np
import pyarrow as pa

from buffer.arrow_columns import (
    TIMESTAMP,
    constant_ints,
    constant_strings,
    filled,
    flat,
    list_array,
    no_routing,
    numeric,
    repeated,
    sample_index,
    strings,
    view,
)
from buffer.record_checks import check_payload, check_schema, read_single_batch
from buffer.record_types import ExpertArray, IntArray, RecordError
from buffer.record_versions import (
    GROUP_SCALARS,
    ROLLOUT_SCHEMA,
    SCHEMAS,
    TIMESTAMPS,
    schema_version,
)
from buffer.rollout_group import RolloutGroup


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


def encode_group(group: RolloutGroup) -> bytes:
    """One Arrow IPC stream message (schema v3) with one row per sample (the group was checked
    when built)."""
    n = group.num_samples
    layers, top_k = group.routing_shape
    started = group.generation_started_at
    assert started is not None  # filled in by __post_init__
    columns = {
        "run_id": constant_strings(group.run_id, n),
        "group_id": repeated(group.group_id, n),
        "prompt_index": filled(group.prompt_index, n, pa.int64()),
        "sample_index": sample_index(n),
        "prompt_ids": list_array([group.prompt_ids] * n, pa.int32()),
        "response_ids": list_array(group.response_ids, pa.int32()),
        "behavior_logprobs": list_array(group.behavior_logprobs, pa.float32()),
        "reward": numeric(np.asarray(group.rewards, dtype=np.float32), pa.float32()),
        "reward_info": strings(group.reward_infos),
        "finish_reason": strings(group.finish_reasons),
        "policy_version": filled(group.policy_version, n, pa.int64()),
        "generator_id": constant_strings(group.generator_id, n),
        "created_at": filled(_micros(group.created_at), n, TIMESTAMP),
        "generation_started_at": filled(_micros(started), n, TIMESTAMP),
        "routing_layers": constant_ints(layers, n),
        "routing_top_k": constant_ints(top_k, n),
        "routed_experts": _routed_column(group.routed_experts, n),
        "token_versions": list_array(group.versions_per_token(), pa.int32()),
    }
    batch = pa.RecordBatch.from_arrays(
        [columns[name] for name in ROLLOUT_SCHEMA.names], schema=ROLLOUT_SCHEMA
    )
    # The bytes pa.ipc.new_stream writes (schema message, record batch message, end-of-stream
    # marker), with the schema message serialised once per process: half the writer's cost.
    return b"".join((_SCHEMA_MESSAGE, memoryview(batch.serialize()), _END_OF_STREAM))


_SCHEMA_MESSAGE = ROLLOUT_SCHEMA.serialize().to_pybytes()
_END_OF_STREAM = b"\xff\xff\xff\xff\x00\x00\x00\x00"  # continuation marker + 0 length


def _routed_column(routed: list[ExpertArray] | None, n: int) -> pa.ListArray:
    """Flat per-sample routing; without routing, n empty lists (cached: the common case)."""
    if routed is not None:
        return list_array([a.reshape(-1) for a in routed], pa.int16())
    return no_routing(n)


def decode_group(
    data: bytes, expected_run_id: str | None = None, max_bytes: int | None = None
) -> RolloutGroup:
    """Parse and check one group message (schema v1, v2 or v3); any problem raises RecordError
    saying what it was.

    Token columns come back as numpy views into `data` (zero-copy); per-row scalar columns hold G
    values and are compared in Python, which is cheaper than an Arrow compute call at this size.
    """
    if max_bytes is not None and len(data) > max_bytes:
        raise RecordError(
            f"message is {len(data)} bytes, over the limit of {max_bytes} "
            "(buffer.max_message_bytes); shorten responses or raise the limit"
        )
    batch = read_single_batch(data)
    version = schema_version(batch.schema)
    schema = SCHEMAS[version]
    check_schema(batch.schema, schema)
    cols = dict(zip(schema.names, batch.columns, strict=True))
    for name, column in cols.items():
        if column.null_count or (isinstance(column, pa.ListArray) and column.values.null_count):
            raise RecordError(f"column {name!r} has nulls; every field is required")
    scalars = {name: _group_scalar(name, cols[name]) for name in GROUP_SCALARS[version]}
    for name in TIMESTAMPS[version]:
        scalars[name] = _group_scalar(name, cols[name].view(pa.int64()))  # µs since epoch
    run_id = scalars["run_id"]
    if expected_run_id is not None and run_id != expected_run_id:
        raise RecordError(f"unknown run id {run_id!r}: this buffer serves run {expected_run_id!r}")
    n = batch.num_rows
    if not np.array_equal(view(cols["sample_index"]), np.arange(n)):
        raise RecordError(f"sample_index must be 0..{n - 1} in row order")
    resp_values, resp_offsets = flat(cols["response_ids"])
    lp_values, lp_offsets = flat(cols["behavior_logprobs"])
    if not np.array_equal(resp_offsets, lp_offsets):
        raise RecordError(
            f"response_ids lengths {np.diff(resp_offsets)} != behavior_logprobs lengths "
            f"{np.diff(lp_offsets)}; the generator must emit one logprob per response token"
        )
    bounds = list(itertools.pairwise(resp_offsets.tolist()))
    prompt = _shared_prompt(cols["prompt_ids"], n)
    check_payload(prompt, resp_values, lp_values, f"group {scalars['group_id']!r}")
    created = _EPOCH + timedelta(microseconds=scalars["created_at"])
    started, routed = created, None
    if version >= 2:
        started = _EPOCH + timedelta(microseconds=scalars["generation_started_at"])
        shape = (scalars["routing_layers"], scalars["routing_top_k"])
        routed = _routing(cols["routed_experts"], shape, len(prompt), np.diff(resp_offsets))
    token_versions = None
    if version >= 3:
        values, offsets = flat(cols["token_versions"])
        if not np.array_equal(offsets, resp_offsets):
            raise RecordError(
                f"token_versions lengths {np.diff(offsets)} != response_ids lengths "
                f"{np.diff(resp_offsets)}; the generator must give every response token a version"
            )
        token_versions = [values[a:b] for a, b in bounds]
    return RolloutGroup(
        run_id=run_id,
        group_id=scalars["group_id"],
        prompt_index=scalars["prompt_index"],
        prompt_ids=prompt,
        response_ids=[resp_values[a:b] for a, b in bounds],
        behavior_logprobs=[lp_values[a:b] for a, b in bounds],
        rewards=view(cols["reward"]).tolist(),
        reward_infos=cols["reward_info"].to_pylist(),
        finish_reasons=cols["finish_reason"].to_pylist(),
        policy_version=scalars["policy_version"],
        generator_id=scalars["generator_id"],
        created_at=created,
        generation_started_at=started,
        routed_experts=routed,
        token_versions=token_versions,
        payload_checked=True,
    )


def _group_scalar(name: str, column: pa.Array) -> int | str:
    """The one value a group-level column repeats on every row; RecordError if rows disagree."""
    values = column.to_pylist()
    if values.count(values[0]) != len(values):
        raise RecordError(f"inconsistent group: rows disagree on {name} ({values[:4]}...)")
    return values[0]


def _routing(
    column: pa.ListArray, shape: tuple[int, int], prompt_length: int, lengths: np.ndarray
) -> list[ExpertArray] | None:
    """Per-sample [P + R - 1, layers, top_k] views of the flat routed_experts column."""
    layers, top_k = shape
    if layers == 0 and top_k == 0 and len(column.values) == 0:
        return None  # no routing: nothing to slice (the common case, skipped cheaply)
    values, offsets = flat(column)
    if layers == 0 and top_k == 0:
        if offsets[-1]:
            raise RecordError(
                "routed_experts holds values but routing_layers = routing_top_k = 0; the "
                "shape columns must describe the routing"
            )
        return None
    if layers <= 0 or top_k <= 0:
        raise RecordError(
            f"routing_layers={layers} and routing_top_k={top_k} must both be > 0 (or both 0 "
            "for a group without routing)"
        )
    want = (prompt_length + lengths - 1) * layers * top_k
    if not np.array_equal(np.diff(offsets), want):
        raise RecordError(
            f"routed_experts lengths {np.diff(offsets)} != (P + R - 1) * routing_layers * "
            f"routing_top_k = {want}"
        )
    return [values[a:b].reshape(-1, layers, top_k) for a, b in itertools.pairwise(offsets.tolist())]


def _micros(moment: datetime) -> int:
    """Microseconds since the Unix epoch, exact (no float rounding)."""
    return (moment - _EPOCH) // timedelta(microseconds=1)


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _shared_prompt(column: pa.ListArray, n: int) -> IntArray:
    values, offsets = flat(column)
    width = int(offsets[1])
    if (
        not (np.diff(offsets) == width).all()
        or not (values.reshape(n, width) == values[:width]).all()
    ):
        raise RecordError("inconsistent group: rows carry different prompt_ids")
    return values[:width]
