"""The rollout record's versions: each version's Arrow schema, the group-level columns it
repeats on every row, and how a message names its version (its schema's metadata).

Versions. The schema's metadata carries `gspo.schema_version`; a message without it is version 1.
- v1: the 13 columns of design section 4.
- v2: v1 plus `generation_started_at` (wall clock when the generator
  started the engine call that produced the group; staleness accounting measures generation time
  from it) and the experts the generator routed every token to (`routed_experts`, for routing
  replay from the rollout, R3: Ma et al. 2025, arXiv:2510.11370). Per sample that is an int16
  array [P + R - 1, layers, top_k]: every position the generator ran a forward on (P prompt
  tokens, the first R - 1 response tokens; the last one is never fed back), stored flat, with
  `routing_layers` and `routing_top_k` (0 and 0 when the generator did not record routing) as
  group-level columns giving the shape.
- v3 (written by this build): v2 plus `token_versions`, per sample the policy version that
  sampled each response token (int32, one per response token). With partial rollouts a generator
  loads new weights mid-response and continues it, so one response spans several versions;
  `policy_version` stays the version the group started with (the oldest of its tokens, what the
  staleness rules read). Checked: one per response token, non-decreasing, none older than
  `policy_version` (the learner checks, at intake, that none is newer than itself).
`decode_group` reads all three (a v1 group has generation_started_at = created_at and no routing;
a v1 or v2 group has every token at its `policy_version`) and refuses any other version with a
RecordError naming it.
"""

from __future__ import annotations

import pyarrow as pa

from buffer.arrow_columns import TIMESTAMP
from buffer.record_types import SCHEMA_VERSION_KEY, RecordError

SCHEMA_VERSION = 3  # what encode_group writes
READABLE_VERSIONS = (1, 2, 3)  # what decode_group reads

ROLLOUT_SCHEMA_V1 = pa.schema(
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
        pa.field("created_at", TIMESTAMP, nullable=False),
    ]
)
ROLLOUT_SCHEMA_V2 = pa.schema(
    [
        *ROLLOUT_SCHEMA_V1,
        pa.field("generation_started_at", TIMESTAMP, nullable=False),
        pa.field("routing_layers", pa.int32(), nullable=False),
        pa.field("routing_top_k", pa.int32(), nullable=False),
        pa.field("routed_experts", pa.list_(pa.int16()), nullable=False),
    ],
    metadata={SCHEMA_VERSION_KEY: b"2"},
)
ROLLOUT_SCHEMA = pa.schema(
    [*ROLLOUT_SCHEMA_V2, pa.field("token_versions", pa.list_(pa.int32()), nullable=False)],
    metadata={SCHEMA_VERSION_KEY: str(SCHEMA_VERSION).encode()},
)
SCHEMAS = {1: ROLLOUT_SCHEMA_V1, 2: ROLLOUT_SCHEMA_V2, 3: ROLLOUT_SCHEMA}

# Columns a group repeats on every row (read once, checked equal) and its timestamp columns.
_V1_SCALARS = ("run_id", "group_id", "prompt_index", "policy_version", "generator_id")
_V2_SCALARS = (*_V1_SCALARS, "routing_layers", "routing_top_k")
GROUP_SCALARS = {1: _V1_SCALARS, 2: _V2_SCALARS, 3: _V2_SCALARS}
_V2_TIMESTAMPS = ("created_at", "generation_started_at")
TIMESTAMPS = {1: ("created_at",), 2: _V2_TIMESTAMPS, 3: _V2_TIMESTAMPS}


def schema_version(schema: pa.Schema) -> int:
    """The record version a message's schema declares: 1 without the metadata key."""
    raw = (schema.metadata or {}).get(SCHEMA_VERSION_KEY)
    if raw is None:
        return 1
    version = int(raw) if raw.isdigit() else None
    if version not in READABLE_VERSIONS:
        raise RecordError(
            f"rollout record schema version {raw.decode(errors='replace')!r} "
            f"({SCHEMA_VERSION_KEY.decode()}) is not one this build reads (versions "
            f"{', '.join(map(str, READABLE_VERSIONS))}); run generators and the learner "
            "from the same release"
        )
    return version
