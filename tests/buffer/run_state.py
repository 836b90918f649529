"""Read (and seed) a run's Redis state directly: what tests assert, which no component needs.

The production API has no use for these (the learner reads counters through
`Telemetry.buffer_metrics` and keeps trained ids in its checkpoint), so they live with the tests.
"""

from __future__ import annotations

from collections.abc import Iterable

import redis

from buffer.connection import RunKeys
from buffer.rollout_group import RolloutGroup
from buffer.schema import encode_group
from buffer.telemetry import DEAD_LETTER, DROPPED_STALE
from tests.buffer.factories import RUN_ID


def counter(client: redis.Redis, name: str, run_id: str = RUN_ID) -> int:
    """One run counter (0 before it was first incremented)."""
    return int(client.hget(RunKeys(run_id).counters, name) or 0)


def dead_letter_count(client: redis.Redis, run_id: str = RUN_ID) -> int:
    """Messages sent to the run's dead letter (exported as buffer/dead_letter)."""
    return counter(client, DEAD_LETTER, run_id)


def dropped_stale_count(client: redis.Redis, run_id: str = RUN_ID) -> int:
    """Groups dropped for exceeding max_lag (exported as buffer/dropped_stale)."""
    return counter(client, DROPPED_STALE, run_id)


def is_trained(client: redis.Redis, group_id: str, run_id: str = RUN_ID) -> bool:
    return bool(client.sismember(RunKeys(run_id).trained, group_id))


def mark_trained(client: redis.Redis, group_ids: Iterable[str], run_id: str = RUN_ID) -> None:
    """Record group ids as trained, as a commit of an earlier step would have."""
    ids = list(group_ids)
    if ids:
        client.sadd(RunKeys(run_id).trained, *ids)


def xadd_unchecked(
    client: redis.Redis, group: RolloutGroup, batch_index: int, run_id: str = RUN_ID
) -> str:
    """Add a group's entry as `Outbox` would, but without its claim: no digest key, so the id is
    not taken (a forger with write access to Redis, or a producer stalled past its claim)."""
    fields = {
        "data": encode_group(group), "policy_version": group.policy_version,
        "batch_index": batch_index, "group_id": group.group_id, "producer": group.generator_id,
    }  # fmt: skip
    return client.xadd(RunKeys(run_id).stream, fields).decode()
