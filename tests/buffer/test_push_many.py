"""push_many: a generator's round of groups in two round trips, with push's guarantees intact.

Real Redis throughout. What must hold for a batch exactly as for single pushes: every group added
once, in order, with its ticket completed in the same MULTI; the max_depth bound; nothing sent
when one group is invalid; a group id claimed by a push that died between its two round trips is
taken over once the claim expires, not lost and not added twice.
"""

from __future__ import annotations

import threading
import time

import pytest
import redis

from buffer.connection import RunKeys
from buffer.consumer import RolloutConsumer
from buffer.outbox import BufferFullError, group_digest
from buffer.producer import RolloutProducer
from buffer.record_types import RecordError
from buffer.schema import decode_group
from buffer.telemetry import DUPLICATE
from buffer.tickets import TicketDispenser
from tests.buffer.factories import RUN_ID, fast_config, make_group
from tests.buffer.run_state import counter

KEYS = RunKeys(RUN_ID)


def _stream_ids(client: redis.Redis) -> list[str]:
    return [f[b"group_id"].decode() for _, f in client.xrange(KEYS.stream)]


def test_a_round_lands_in_order_with_every_ticket_completed(
    client: redis.Redis, producer: RolloutProducer
) -> None:
    tickets = TicketDispenser(client, RUN_ID)
    claimed = [tickets.claim("gen-0", limit=4) for _ in range(4)]
    groups = [make_group(t, batch_index=0) for t in claimed]
    entry_ids = producer.push_many(groups, batch_index=0, tickets=claimed)
    assert all(entry_ids) and len(set(entry_ids)) == 4
    assert [e.decode() for e, _ in client.xrange(KEYS.stream)] == entry_ids  # one per group
    assert _stream_ids(client) == [g.group_id for g in groups]
    assert tickets.outstanding() == {}
    assert client.zcard(KEYS.reservations) == 0
    for g in groups:  # every claim was replaced by the group's digest, with no expiry left
        assert client.get(KEYS.digest(g.group_id)).decode() == group_digest(g, 0)
        assert client.pttl(KEYS.digest(g.group_id)) == -1
    entries = client.xrange(KEYS.stream)
    delivered = [decode_group(f[b"data"], expected_run_id=RUN_ID) for _, f in entries]
    assert delivered == groups


def test_one_invalid_group_sends_nothing(client: redis.Redis) -> None:
    config = fast_config(max_message_bytes=3000)
    producer = RolloutProducer(client, RUN_ID, config)
    consumer = RolloutConsumer(client, RUN_ID, config)
    groups = [make_group(0), make_group(1, lengths=(400, 400)), make_group(2)]
    with pytest.raises(RecordError, match="max_message_bytes=3000"):
        producer.push_many(groups, batch_index=0)
    assert consumer.depth() == 0
    assert client.keys(KEYS.digest("*")) == []  # no claim was made either


def test_the_same_id_twice_in_one_round_is_added_once(
    client: redis.Redis, producer: RolloutProducer, consumer: RolloutConsumer
) -> None:
    group = make_group(5)
    entry_ids = producer.push_many([group, group], batch_index=0)
    assert entry_ids[0] and entry_ids[1] == ""  # the second waited for the first's claim
    assert consumer.depth() == 1 and counter(client, DUPLICATE) == 1


def test_a_full_buffer_takes_what_fits_then_waits_for_room(client: redis.Redis) -> None:
    config = fast_config(max_depth=2, push_timeout_s=10.0)
    producer = RolloutProducer(client, RUN_ID, config)
    consumer = RolloutConsumer(client, RUN_ID, config)
    groups = [make_group(i) for i in range(4)]
    freed = threading.Event()

    def consume() -> None:  # a learner: takes and commits the first two once they are there
        while consumer.depth() < 2:
            time.sleep(0.01)
        deliveries = consumer.take_batch(0, 2, consumer="learner", timeout_s=5)
        consumer.commit(deliveries)
        freed.set()

    learner = threading.Thread(target=consume)
    learner.start()
    entry_ids = producer.push_many(groups, batch_index=0)
    learner.join(timeout=10)
    assert freed.is_set() and all(entry_ids)
    assert consumer.depth() == 2  # the bound held: at most 2 at any time


def test_full_for_push_timeout_raises_and_keeps_what_was_added(client: redis.Redis) -> None:
    producer = RolloutProducer(client, RUN_ID, fast_config(max_depth=2, push_timeout_s=0.3))
    groups = [make_group(i) for i in range(3)]
    with pytest.raises(BufferFullError, match=groups[2].group_id):
        producer.push_many(groups, batch_index=0)
    assert _stream_ids(client) == [groups[0].group_id, groups[1].group_id]
    assert client.zcard(KEYS.reservations) == 0  # the refused group reserved nothing


def test_a_claim_left_by_a_dead_push_is_taken_over_after_it_expires(
    client: redis.Redis, producer: RolloutProducer, consumer: RolloutConsumer
) -> None:
    """A producer killed between claiming an id and adding it leaves `c:<token>:<digest>`; the
    restarted generator's push waits for the claim to expire, then adds the group once."""
    group = make_group(7)
    key = KEYS.digest(group.group_id)
    client.set(key, f"c:deadbeefdeadbeef:{group_digest(group, 0)}", px=400)
    started = time.monotonic()
    [entry_id] = producer.push_many([group], batch_index=0)
    assert entry_id and time.monotonic() - started >= 0.3
    assert consumer.depth() == 1
    assert client.get(key).decode() == group_digest(group, 0)


def test_a_live_claim_renews_the_waiting_pushers_ticket(client: redis.Redis) -> None:
    """Waiting on another push's claim keeps the waiter's ticket leased, as waiting for room does
    (so it is not reissued to a second generator meanwhile)."""
    tickets = TicketDispenser(client, RUN_ID, lease_s=1.0)
    ticket = tickets.claim("gen-0", limit=1)
    group = make_group(ticket)  # generator_id gen-0, the ticket's owner
    client.set(KEYS.digest(group.group_id), "c:0123456789abcdef:other", px=2500)
    reissued: list[int | None] = []

    def second_generator() -> None:  # past the 1 s lease, while the push still waits
        time.sleep(1.6)
        reissued.append(TicketDispenser(client, RUN_ID, lease_s=1.0).claim("gen-1", limit=1))

    thread = threading.Thread(target=second_generator)
    thread.start()
    producer = RolloutProducer(client, RUN_ID, fast_config())
    [entry_id] = producer.push_many([group], batch_index=0, tickets=[ticket])
    thread.join(timeout=10)
    assert entry_id  # added once the claim expired
    assert reissued == [None]  # the lease was renewed while waiting: not reissued
    assert tickets.outstanding() == {}
