"""A restarted generator takes its own tickets back at once instead of waiting out the lease."""

from __future__ import annotations

import redis

from buffer.producer import RolloutProducer
from buffer.tickets import DEFAULT_LEASE_S, TicketDispenser
from tests.buffer.factories import RUN_ID, fast_config, make_group


def test_release_owned_frees_only_that_generators_leases(client: redis.Redis) -> None:
    tickets = TicketDispenser(client, RUN_ID)  # the production lease: 120 s
    assert DEFAULT_LEASE_S >= 60
    assert [tickets.claim("gen-0", limit=8) for _ in range(3)] == [0, 1, 2]
    assert tickets.claim("gen-1", limit=8) == 3
    # Before the release the leases are live: a claim gets a new ticket, not 0..2.
    assert tickets.claim("gen-1", limit=8) == 4
    assert tickets.release_owned("gen-0") == 3
    # The restarted gen-0 (same id) gets its tickets back, lowest first, with no wait.
    assert [tickets.claim("gen-0", limit=8) for _ in range(3)] == [0, 1, 2]
    assert tickets.outstanding() == {0: "gen-0", 1: "gen-0", 2: "gen-0", 3: "gen-1", 4: "gen-1"}
    assert tickets.claim("gen-0", limit=8) == 5  # gen-1's live leases 3 and 4 were not touched


def test_release_owned_skips_completed_tickets(client: redis.Redis) -> None:
    tickets = TicketDispenser(client, RUN_ID)
    producer = RolloutProducer(client, RUN_ID, fast_config())
    assert [tickets.claim("gen-0", limit=8) for _ in range(2)] == [0, 1]
    producer.push(make_group(0), batch_index=0, ticket=0)  # completes ticket 0
    assert tickets.release_owned("gen-0") == 1  # only ticket 1 was outstanding
    assert tickets.release_owned("nobody") == 0
    assert tickets.claim("gen-0", limit=8) == 1
    assert tickets.issued() == 2  # a re-issue is not a new ticket


def test_completed_counts_pushed_tickets_and_never_decreases(client: redis.Redis) -> None:
    tickets = TicketDispenser(client, RUN_ID)
    producer = RolloutProducer(client, RUN_ID, fast_config())
    assert tickets.completed() == 0
    assert [tickets.claim("g", limit=8) for _ in range(3)] == [0, 1, 2]
    assert tickets.completed() == 0  # 3 issued, 3 outstanding
    producer.push(make_group(1), batch_index=0, ticket=1)
    assert tickets.completed() == 1  # 3 issued - 2 outstanding
    tickets.release_owned("g")
    assert tickets.claim("g", limit=8) == 0  # a re-issue: still 1 completed
    assert tickets.completed() == 1
    tickets.complete(0)
    assert tickets.completed() == 2
