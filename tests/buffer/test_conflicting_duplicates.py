"""A group id pushed twice: identical copies are counted duplicates, different ones dead-lettered.

Real Redis throughout. The first push of an id is the one kept (and trained); what changes with
the digest is that a second push with other contents is no longer dropped silently as a plain
duplicate but dead-lettered with both digests, counted and logged.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from datetime import UTC, datetime

import numpy as np
import pytest
import redis

from buffer.connection import RunKeys, connect
from buffer.consumer import RolloutConsumer
from buffer.outbox import group_digest
from buffer.producer import RolloutProducer
from buffer.rollout_group import RolloutGroup
from buffer.schema import decode_group
from buffer.telemetry import CONFLICTING_DUPLICATE, DUPLICATE
from buffer.tickets import TicketDispenser
from tests.buffer.factories import RUN_ID, fast_config, make_group
from tests.buffer.run_state import counter, dead_letter_count
from tests.conftest import RedisInstance

KEYS = RunKeys(RUN_ID)
LATER = datetime(2026, 1, 2, 3, 9, 0, tzinfo=UTC)


def _regenerated(group: RolloutGroup) -> RolloutGroup:
    """The same group made again after a generator restart: new timestamps, another generator."""
    return dataclasses.replace(
        group, created_at=LATER, generation_started_at=LATER, generator_id="gen-7"
    )


def _with_logprob_nudged(group: RolloutGroup) -> RolloutGroup:
    """One logprob moved by one float32 ulp: the smallest change the wire can carry."""
    logprobs = [lp.copy() for lp in group.behavior_logprobs]
    logprobs[0][1] = np.nextafter(logprobs[0][1], np.float32(0))
    return dataclasses.replace(group, behavior_logprobs=logprobs)


def _stream_groups(client: redis.Redis) -> list[RolloutGroup]:
    return [decode_group(f[b"data"], expected_run_id=RUN_ID) for _, f in client.xrange(KEYS.stream)]


def test_identical_repush_is_a_counted_duplicate(
    producer: RolloutProducer, consumer: RolloutConsumer, client: redis.Redis
):
    first = make_group(0)
    entry_id = producer.push(first, batch_index=0)
    assert entry_id
    assert producer.push(_regenerated(first), batch_index=0) == ""  # nothing added
    assert producer.push(first, batch_index=0) == ""  # a plain retry
    assert consumer.depth() == 1
    assert counter(client, DUPLICATE) == 2
    assert dead_letter_count(client) == 0 and client.xlen(KEYS.dead_letter) == 0
    assert client.get(KEYS.digest(first.group_id)).decode() == group_digest(first, 0)
    [got] = consumer.take_batch(0, 1, consumer="learner", timeout_s=2)
    assert got.entry_id == entry_id and got.group.generator_id == "gen-0"


@pytest.mark.parametrize(
    "forge",
    [
        pytest.param(_with_logprob_nudged, id="logprob-one-ulp"),
        pytest.param(lambda g: dataclasses.replace(g, policy_version=999), id="future-version"),
        pytest.param(lambda g: dataclasses.replace(g, rewards=[1.0, 1.0]), id="rewards"),
    ],
)
def test_conflicting_repush_is_dead_lettered_and_the_first_stays(
    producer: RolloutProducer,
    consumer: RolloutConsumer,
    client: redis.Redis,
    caplog: pytest.LogCaptureFixture,
    forge,
) -> None:
    first = make_group(0)
    forged = forge(first)
    producer.push(first, batch_index=0)
    with caplog.at_level(logging.WARNING, logger="buffer.outbox"):
        assert producer.push(forged, batch_index=0) == ""
    first_digest, forged_digest = group_digest(first, 0), group_digest(forged, 0)
    assert first_digest != forged_digest
    [(_, dead)] = client.xrange(KEYS.dead_letter)
    reason = dead[b"reason"].decode()
    assert "'s0-b0-p0'" in reason and first_digest in reason and forged_digest in reason
    assert dead[b"first_digest"].decode() == first_digest
    assert dead[b"digest"].decode() == forged_digest
    assert decode_group(dead[b"payload"], expected_run_id=RUN_ID) == forged  # kept for diagnosis
    assert counter(client, CONFLICTING_DUPLICATE) == 1 and dead_letter_count(client) == 1
    assert counter(client, DUPLICATE) == 0
    assert [r.levelno for r in caplog.records] == [logging.WARNING]
    assert "s0-b0-p0" in caplog.records[0].getMessage()
    assert _stream_groups(client) == [first]
    [got] = consumer.take_batch(0, 1, consumer="learner", timeout_s=2)
    assert got.group == first


def test_same_contents_under_another_batch_index_conflict(
    producer: RolloutProducer, consumer: RolloutConsumer, client
) -> None:
    producer.push(make_group(0), batch_index=0)
    producer.push(make_group(0), batch_index=5)  # the header, not the payload, says batch 5
    assert counter(client, CONFLICTING_DUPLICATE) == 1 and consumer.depth() == 1


def test_repushes_complete_their_tickets(
    client: redis.Redis, producer: RolloutProducer, consumer: RolloutConsumer
) -> None:
    tickets = TicketDispenser(client, RUN_ID)
    claimed = [tickets.claim("gen-0", limit=3) for _ in range(3)]
    assert claimed == [0, 1, 2]
    producer.push(make_group(0), batch_index=0, ticket=0)
    producer.push(_regenerated(make_group(0)), batch_index=0, ticket=1)  # identical: duplicate
    producer.push(_with_logprob_nudged(make_group(0)), batch_index=0, ticket=2)  # conflicting
    # Every ticket is done (none reissued to regenerate), and no reservation is left holding room.
    assert tickets.outstanding() == {}
    assert client.zcard(KEYS.reservations) == 0
    assert consumer.depth() == 1


def test_racing_pushes_of_one_id_add_exactly_one(redis_server: RedisInstance) -> None:
    """Eight producers push eight different versions of one id at once: WATCH lets exactly one
    add its entry; the other seven see its digest and are dead-lettered."""
    variants = [dataclasses.replace(make_group(0), rewards=[float(i), 0.5]) for i in range(8)]
    start = threading.Barrier(len(variants))
    results: dict[int, str] = {}

    def push(i: int) -> None:
        with connect(redis_server.url) as own:
            producer = RolloutProducer(own, RUN_ID, fast_config())
            start.wait()
            results[i] = producer.push(variants[i], batch_index=0)

    threads = [threading.Thread(target=push, args=(i,)) for i in range(len(variants))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    with connect(redis_server.url) as client:
        winners = [i for i, entry_id in results.items() if entry_id]
        assert len(results) == 8 and len(winners) == 1
        [kept] = _stream_groups(client)
        assert kept == variants[winners[0]]
        assert client.get(KEYS.digest(kept.group_id)).decode() == group_digest(kept, 0)
        assert counter(client, CONFLICTING_DUPLICATE) == 7 and client.xlen(KEYS.dead_letter) == 7


# ---- the digest itself ---------------------------------------------------------------------------


def test_digest_ignores_timestamps_and_generator_only() -> None:
    group = make_group(3, batch_index=1)
    base = group_digest(group, 1)
    assert group_digest(_regenerated(group), 1) == base
    changed = {
        "batch index": group_digest(group, 2),
        "logprob ulp": group_digest(_with_logprob_nudged(group), 1),
        "token": group_digest(
            dataclasses.replace(group, response_ids=[[3100, 3101, 3103], [3200]]), 1
        ),
        "prompt": group_digest(dataclasses.replace(group, prompt_ids=[3001, 3003]), 1),
        "reward info": group_digest(
            dataclasses.replace(group, reward_infos=['{"correct": false}'] * 2), 1
        ),
        "finish": group_digest(dataclasses.replace(group, finish_reasons=["stop", "stop"]), 1),
        "version": group_digest(dataclasses.replace(group, policy_version=1), 1),
        "prompt index": group_digest(dataclasses.replace(group, prompt_index=4), 1),
        "run": group_digest(dataclasses.replace(group, run_id="other-run"), 1),
    }
    assert base not in changed.values()
    assert len(set(changed.values())) == len(changed)


def test_digest_encoding_is_unambiguous() -> None:
    # The same flat tokens split differently between samples ([1 2][3] vs [1][2 3]) must differ:
    # each array is length-prefixed.
    def group(responses: list[list[int]]) -> RolloutGroup:
        return RolloutGroup(
            run_id=RUN_ID, group_id="g", prompt_index=0, prompt_ids=[7], response_ids=responses,
            behavior_logprobs=[[-1.0] * len(r) for r in responses], rewards=[0.0, 0.0],
            reward_infos=["{}", "{}"], finish_reasons=["stop", "stop"], policy_version=0,
            generator_id="gen-0", created_at=LATER,
        )  # fmt: skip

    assert group_digest(group([[1, 2], [3]]), 0) != group_digest(group([[1], [2, 3]]), 0)


def test_digest_covers_routed_experts() -> None:
    def routed(values: list[int]) -> RolloutGroup:
        experts = np.array(values, dtype=np.int16).reshape(len(values), 1, 1)  # [P + R - 1, 1, 1]
        return RolloutGroup(
            run_id=RUN_ID, group_id="g", prompt_index=0, prompt_ids=[7, 8],
            response_ids=[[1, 2]], behavior_logprobs=[[-1.0, -1.0]], rewards=[0.0],
            reward_infos=["{}"], finish_reasons=["stop"], policy_version=0, generator_id="gen-0",
            created_at=LATER, routed_experts=[experts],
        )  # fmt: skip

    with_routing = routed([4, 5, 6])
    without = dataclasses.replace(with_routing, routed_experts=None)
    digests = {group_digest(g, 0) for g in (with_routing, routed([4, 5, 7]), without)}
    assert len(digests) == 3
