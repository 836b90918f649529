"""Bounded-mode rewinds (`buffer.rewind.rewind_bounded`, `buffer.timeline`, issue 41), on a real
Redis: versions after the checkpoint are withdrawn in the same script that makes the lost groups
fresh work; a group made from withdrawn weights (told by the timeline number its generator
tagged it with) is dropped by the learner's take, counted, and its ticket reissued; a version
registry that moved back by a rewind is not mistaken for a Redis that lost the run.
"""

from __future__ import annotations

import dataclasses
import threading
import time

import pytest
import redis

from buffer.connection import RunKeys, RunStateLostError
from buffer.consumer import RolloutConsumer
from buffer.intake import IntakeRules, ModelLimits
from buffer.producer import RolloutProducer
from buffer.rewind import REWIND_OWNER, rewind_bounded
from buffer.telemetry import DEAD_LETTER, LOST_TO_REWIND
from buffer.tickets import TicketDispenser
from buffer.timeline import Timeline
from buffer.versions import VersionRegistry
from tests.buffer.factories import RUN_ID, make_group
from tests.buffer.run_state import counter

KEYS = RunKeys(RUN_ID)


def test_withdrawn_by_hand() -> None:
    """Rewinds to v5 (timeline 0 -> 1), then to v3 (1 -> 2)."""
    timeline = Timeline(rewinds=(5, 3), withdrawn_from=(7, 6))
    assert timeline.number == 2
    assert not timeline.withdrawn(3, loaded_at=0) and timeline.withdrawn(6, loaded_at=0)
    assert timeline.withdrawn(4, loaded_at=0)  # below the first rewind, above the second
    assert timeline.withdrawn(4, loaded_at=1) and not timeline.withdrawn(3, loaded_at=1)
    assert not timeline.withdrawn(9, loaded_at=2)  # loaded after both: the new v9
    assert not Timeline().withdrawn(100, loaded_at=0)  # no rewind, nothing withdrawn
    assert timeline.versions_withdrawn(since=0) == 2 + 3 and timeline.versions_withdrawn(1) == 3


def _publish(registry: VersionRegistry, versions: range) -> None:
    for version in versions:
        registry.publish(version, f"/weights/v{version}")


def test_a_bounded_rewind_withdraws_versions_and_makes_lost_groups_fresh_work(
    producer: RolloutProducer, consumer: RolloutConsumer, client: redis.Redis
) -> None:
    registry = VersionRegistry(client, RUN_ID)
    _publish(registry, range(5))
    for prompt in range(3):
        producer.push(make_group(prompt), batch_index=0)
    taken = consumer.take_batch(0, 3, "learner", timeout_s=5)
    consumer.commit(taken)
    ids = [d.group.group_id for d in taken]
    client.set(KEYS.ticket_next, 10)

    rewound = consumer.rewind_bounded(ids[1:], to_version=2)
    assert (rewound.unmarked, rewound.reopened, rewound.withdrawn_from) == (2, 2, 4)
    assert rewound.timeline == 1
    assert client.get(KEYS.version) == b"2"
    assert sorted(int(v) for v in client.hkeys(KEYS.version_locations)) == [0, 1, 2]
    assert client.lrange(KEYS.rewinds, 0, -1) == [b"2:4"]
    assert consumer.timeline() == Timeline((2,), (4,))
    assert client.smembers(KEYS.trained) == {ids[0].encode()}
    assert client.exists(KEYS.digest(ids[1])) == 0  # a new sample is the group from now on
    assert client.hget(KEYS.ticket_owners, "1") == REWIND_OWNER.encode()
    # idempotent: a learner killed right after it, resuming, changes nothing more
    again = consumer.rewind_bounded(ids[1:], to_version=2)
    assert dataclasses.astuple(again) == (0, 0, None, 1)
    assert client.lrange(KEYS.rewinds, 0, -1) == [b"2:4"]

    dispenser = TicketDispenser(client, RUN_ID)
    assert [dispenser.claim("gen-0", limit=100) for _ in range(3)] == [1, 2, 10]
    new_sample = make_group(1, policy_version=2, seed=9)  # other tokens: another digest
    assert producer.push(new_sample, batch_index=0, ticket=1)
    assert counter(client, DEAD_LETTER) == 0
    # the learner republishes v3 under the new timeline
    registry.rewound(2, rewound.timeline)
    registry.publish(3, "/weights/v3-again")
    assert registry.current() == (3, "/weights/v3-again")


def test_a_registry_moved_back_by_a_rewind_is_not_a_lost_run(client: redis.Redis) -> None:
    """A generator saw v4; a rewind moves the registry to v2: its next read (and a fresh
    connection's check) accepts v2. An emptied registry is still a lost run."""
    learner, generator = VersionRegistry(client, RUN_ID), VersionRegistry(client, RUN_ID)
    _publish(learner, range(5))
    assert generator.latest() == 4
    rewind_bounded(client, RUN_ID, 2, [])
    assert generator.latest() == 2 and generator.watch.known == 2
    connection = client.connection_pool.get_connection()
    try:
        generator.watch.check_connection(connection)  # a reconnect's check says the same
    finally:
        client.connection_pool.release(connection)
    client.delete(KEYS.version, KEYS.rewinds)  # Redis lost the run
    with pytest.raises(RunStateLostError):
        generator.latest()


def test_the_take_drops_groups_made_from_withdrawn_weights(
    producer: RolloutProducer, consumer: RolloutConsumer, client: redis.Redis
) -> None:
    """After a rewind to v1 (timeline 1): a v2 group tagged timeline 0 (weights loaded before
    the rewind) is dropped, counted and its ticket reissued, never dead-lettered as newer than
    the learner; a v1 group of timeline 0 and a v2 group of timeline 1 are trained."""
    registry = VersionRegistry(client, RUN_ID)
    _publish(registry, range(4))
    rewind_bounded(client, RUN_ID, 1, [])
    timeline = consumer.timeline()
    pushes = [(0, 2, 0), (1, 1, 0), (2, 2, 1)]  # (prompt, version, timeline)
    for prompt, version, tag in pushes:
        group = make_group(prompt, policy_version=version)
        producer.push_many([group], batch_index=0, tickets=[prompt], timeline=tag)

    # the intake rules refuse any v2 group at v1 as newer than the learner
    rules = IntakeRules(
        mode="bounded", lag=4, seed=0, prompts_per_step=4, group_size=2, max_new_tokens=8,
        reward_range=(-1e4, 1e4), limits=ModelLimits(vocab_size=100_000),
    )  # fmt: skip
    taken = consumer.take(1, 1, 4, "learner", 5, rules=rules, timeline=timeline)
    assert [d.group.prompt_index for d in taken.withdrawn] == [0]
    assert [d.group.prompt_index for d in taken.deliveries] == [1]
    assert counter(client, LOST_TO_REWIND) == 1 and counter(client, DEAD_LETTER) == 0
    assert client.zscore(KEYS.ticket_leases, "0") == 0  # reissued
    assert client.exists(KEYS.digest(make_group(0).group_id)) == 0
    # the timeline-1 v2 group is the learner's own new v2's: accepted once the learner is at v2
    later = consumer.take(1, 2, 4, "learner", 5, timeline=timeline)
    assert [d.group.prompt_index for d in later.deliveries] == [2] and not later.withdrawn


def test_the_take_reissues_withdrawn_groups_before_it_waits_for_more(
    producer: RolloutProducer, consumer: RolloutConsumer, client: redis.Redis
) -> None:
    """The hang this prevents (bounded fault injection, a resume's rewind to the initial
    weights): the stream's only group was made from withdrawn weights, and its ticket was the
    only one the admission limit allowed, so no generator can start anything until the take
    reissues it. Reissued before the take waits, the prompt is made again and the take returns
    its new group; reissued only when the take ended, it waited out its timeout."""
    registry = VersionRegistry(client, RUN_ID)
    _publish(registry, range(3))
    tickets = TicketDispenser(client, RUN_ID)
    assert tickets.claim("gen-0", limit=1) == 0
    stale_weights = make_group(0, policy_version=2)  # v2 of timeline 0
    producer.push_many([stale_weights], batch_index=0, tickets=[0], timeline=0)
    rewind_bounded(client, RUN_ID, 0, [])  # v1-v2 withdrawn; timeline 1
    timeline = consumer.timeline()
    assert tickets.claim("gen-0", limit=1) is None  # nothing else may start
    made: list[int] = []

    def generator() -> None:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            ticket = tickets.claim("gen-0", limit=1)
            if ticket is not None:
                group = make_group(ticket, policy_version=0)
                producer.push_many([group], batch_index=0, tickets=[ticket], timeline=1)
                made.append(ticket)
                return
            time.sleep(0.02)

    thread = threading.Thread(target=generator, daemon=True)
    thread.start()
    taken = consumer.take(1, 1, 4, "learner", 10, timeline=timeline)
    thread.join(timeout=20)
    assert made == [0]
    assert [d.group.prompt_index for d in taken.withdrawn] == [0]
    assert [(d.group.prompt_index, d.policy_version) for d in taken.deliveries] == [(0, 0)]
    assert counter(client, LOST_TO_REWIND) == 1
