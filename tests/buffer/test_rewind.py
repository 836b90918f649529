"""Rewinding groups committed after a checkpoint (`buffer.rewind`, issue 41), on a real Redis.

A rewound group is trainable again (no `trained` mark), its ticket is handed out before any new
one (an expired lease, lowest first), and its id admits exactly one more push: the copy that
was trained (same digest). Another copy is a conflict, dead-lettered with both digests.
"""

from __future__ import annotations

import dataclasses

import pytest
import redis

from buffer.connection import RunKeys
from buffer.consumer import RolloutConsumer
from buffer.producer import RolloutProducer
from buffer.rewind import REWIND_OWNER, rewind_groups, ticket_of
from buffer.tickets import TicketDispenser
from tests.buffer.factories import RUN_ID, make_group
from tests.buffer.run_state import counter, dead_letter_count

KEYS = RunKeys(RUN_ID)


def _trained_and_committed(
    producer: RolloutProducer, consumer: RolloutConsumer, prompts: range
) -> list[str]:
    """Push, take and commit the groups of `prompts` (batch 0): what a checkpoint's commit
    leaves in Redis (marked trained, gone from the stream)."""
    for prompt in prompts:
        producer.push(make_group(prompt), batch_index=0)
    taken = consumer.take_batch(0, len(prompts), "learner", timeout_s=5)
    consumer.commit(taken)
    return [d.group.group_id for d in taken]


def test_a_rewound_group_is_trainable_again_from_its_reissued_ticket(
    producer: RolloutProducer, consumer: RolloutConsumer, client: redis.Redis
) -> None:
    ids = _trained_and_committed(producer, consumer, range(3))
    assert client.xlen(KEYS.stream) == 0 and client.scard(KEYS.trained) == 3
    client.set(KEYS.ticket_next, 10)  # the run has issued tickets 0-9 since
    rewound = consumer.rewind(ids[1:])  # prompts 1 and 2
    assert (rewound.unmarked, rewound.reopened, rewound.marked) == (2, 2, 2)
    assert consumer.rewind(ids[1:]) == dataclasses.replace(
        rewound, unmarked=0, reopened=0, marked=0
    )
    assert client.smembers(KEYS.trained) == {ids[0].encode()}
    assert client.hget(KEYS.ticket_owners, "1") == REWIND_OWNER.encode()
    dispenser = TicketDispenser(client, RUN_ID)
    claims = [dispenser.claim("gen-0", limit=100) for _ in range(3)]
    assert claims == [1, 2, 10]  # the rewound ones first, lowest first, then new ones
    for prompt in (1, 2):  # made again exactly (a generator restart's copy: new timestamps)
        again = dataclasses.replace(make_group(prompt), generator_id="gen-9")
        assert producer.push(again, batch_index=0, ticket=prompt)
    assert client.zscore(KEYS.ticket_leases, "1") is None  # completed by the push
    taken = consumer.take_batch(0, 2, "learner", timeout_s=5, slots=set(ids))
    assert sorted(d.group.group_id for d in taken) == ids[1:]
    assert counter(client, "duplicate") == 0


def test_only_the_copy_that_was_trained_is_admitted_again(
    producer: RolloutProducer, consumer: RolloutConsumer, client: redis.Redis
) -> None:
    (group_id,) = _trained_and_committed(producer, consumer, range(1))
    trained_digest = client.get(KEYS.digest(group_id))
    consumer.rewind([group_id])
    assert client.get(KEYS.digest(group_id)) == b"r:" + trained_digest
    other = make_group(0, lengths=(2, 2))  # same id, other contents (other weights)
    assert producer.push(other, batch_index=0) == ""
    assert counter(client, "conflicting_duplicate") == 1 and dead_letter_count(client) == 1
    assert client.xlen(KEYS.stream) == 0
    assert producer.push(make_group(0), batch_index=0)  # the trained copy
    assert client.get(KEYS.digest(group_id)) == trained_digest  # an ordinary id again
    assert producer.push(make_group(0), batch_index=0) == ""  # and a duplicate after that
    assert counter(client, "duplicate") == 1


def test_a_group_already_regenerated_is_not_rewound_twice(
    producer: RolloutProducer, consumer: RolloutConsumer, client: redis.Redis
) -> None:
    """A learner killed after its rewind, once the generators pushed the group again, rewinds
    the same ids on its next resume: the copy waiting in the stream keeps its plain digest."""
    (group_id,) = _trained_and_committed(producer, consumer, range(1))
    consumer.rewind([group_id])
    assert producer.push(make_group(0), batch_index=0, ticket=0)
    digest = client.get(KEYS.digest(group_id))
    again = rewind_groups(client, RUN_ID, [group_id])
    assert (again.unmarked, again.reopened, again.marked) == (0, 0, 0)
    assert client.get(KEYS.digest(group_id)) == digest and client.xlen(KEYS.stream) == 1


def test_ids_not_made_by_make_group_id_are_refused() -> None:
    assert ticket_of("s7-b2-p4") == 4
    assert ticket_of(f"s0-b1-p{(3 << 40) + 9}") == (3 << 40) + 9  # an extra round's ticket
    with pytest.raises(ValueError, match="does not end in -p<prompt index>"):
        ticket_of("forged-group")
