"""Ticket dispenser: admission limit, leases, re-issue after a crash, completion with the push."""

from __future__ import annotations

import threading
import time

import pytest
import redis

from buffer.outbox import BufferFullError
from buffer.producer import RolloutProducer
from buffer.run_control import clear_stop, request_stop, stop_requested
from buffer.tickets import TicketDispenser, admission_limit, fixed_policy_version, ticket_batch
from tests.buffer.factories import RUN_ID, fast_config, make_group


def test_admission_arithmetic() -> None:
    # (version + lag + 1) * prompts_per_step: v=2, lag=1, 4 prompts/step -> 16 tickets.
    assert admission_limit(2, 1, 4) == 16
    assert admission_limit(0, 0, 8) == 8  # synchronous: only batch 0 before v1
    assert ticket_batch(15, 4) == 3 and ticket_batch(16, 4) == 4
    assert [fixed_policy_version(k, 2) for k in range(5)] == [0, 0, 0, 1, 2]
    with pytest.raises(ValueError, match="must be >= 0"):
        admission_limit(-1, 0, 4)


def test_claims_stop_at_the_limit(client: redis.Redis) -> None:
    tickets = TicketDispenser(client, RUN_ID)
    assert [tickets.claim("g", limit=3) for _ in range(4)] == [0, 1, 2, None]
    assert tickets.claim("g", limit=5) == 3  # a new version raises the limit
    assert tickets.issued() == 4
    assert tickets.outstanding() == {0: "g", 1: "g", 2: "g", 3: "g"}


def test_concurrent_claims_never_share_a_ticket(client: redis.Redis, redis_server) -> None:
    got: list[int] = []
    lock = threading.Lock()

    def worker(name: str) -> None:
        mine = TicketDispenser(redis_server.client(), RUN_ID)
        while (t := mine.claim(name, limit=200)) is not None:
            with lock:
                got.append(t)

    threads = [threading.Thread(target=worker, args=(f"g{i}",)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(got) == list(range(200))


def test_expired_lease_is_reissued_lowest_first(client: redis.Redis) -> None:
    tickets = TicketDispenser(client, RUN_ID, lease_s=0.5)
    producer = RolloutProducer(client, RUN_ID, fast_config())
    assert [tickets.claim("crashy", limit=8) for _ in range(3)] == [0, 1, 2]
    assert tickets.claim("steady", limit=8) == 3
    producer.push(make_group(3), batch_index=0, ticket=3)  # completes ticket 3 with the push
    assert 3 not in tickets.outstanding()
    assert tickets.claim("steady", limit=8) == 4  # crashy's leases are still valid
    producer.push(make_group(4), batch_index=1, ticket=4)
    time.sleep(0.6)  # "crashy" died: its leases expire
    assert [tickets.claim("steady", limit=8) for _ in range(3)] == [0, 1, 2]
    assert tickets.claim("steady", limit=8) == 5
    assert tickets.issued() == 6  # re-issues are not new starts
    assert tickets.outstanding() == {0: "steady", 1: "steady", 2: "steady", 5: "steady"}


def test_reissue_respects_the_limit(client: redis.Redis) -> None:
    tickets = TicketDispenser(client, RUN_ID, lease_s=0.1)
    for _ in range(4):
        tickets.claim("a", limit=4)
    time.sleep(0.2)
    assert tickets.claim("b", limit=2) == 0  # expired tickets above the limit stay parked
    assert tickets.claim("b", limit=2) == 1
    assert tickets.claim("b", limit=2) is None


def test_push_renews_its_lease_while_blocked(client: redis.Redis) -> None:
    tickets = TicketDispenser(client, RUN_ID, lease_s=0.2)
    full = RolloutProducer(client, RUN_ID, fast_config(max_depth=1, push_timeout_s=0.8))
    full.push(make_group(9), batch_index=0)  # the buffer is now full
    ticket = tickets.claim("gen-0", limit=8)  # the id the group carries as its producer
    with pytest.raises(BufferFullError):
        full.push(make_group(ticket), batch_index=0, ticket=ticket)  # blocked 0.8 s > lease
    # The lease was renewed on every attempt, so nobody else got the ticket meanwhile.
    assert tickets.claim("other", limit=8) == 1
    assert tickets.outstanding()[ticket] == "gen-0"


def test_explicit_renew_and_complete(client: redis.Redis) -> None:
    tickets = TicketDispenser(client, RUN_ID, lease_s=0.2)
    first = tickets.claim("a", limit=4)
    assert tickets.renew("b", [first]) == 0  # only the holder may renew
    for _ in range(3):
        time.sleep(0.1)
        assert tickets.renew("a", [first]) == 1
    assert tickets.claim("b", limit=4) == 1  # ticket 0 never expired
    tickets.complete(first)
    assert first not in tickets.outstanding()


def test_stop_flag(client: redis.Redis) -> None:
    tickets = TicketDispenser(client, RUN_ID)
    assert not stop_requested(client, RUN_ID)
    request_stop(client, RUN_ID)
    assert stop_requested(client, RUN_ID)
    assert tickets.claim("g", limit=10) is None
    clear_stop(client, RUN_ID)  # a resumed trial withdraws the previous teardown's stop
    assert not stop_requested(client, RUN_ID)
    assert tickets.claim("g", limit=10) == 0


def test_release_and_expire_all_hand_tickets_back(client: redis.Redis) -> None:
    tickets = TicketDispenser(client, RUN_ID)
    assert [tickets.claim("a", limit=4) for _ in range(3)] == [0, 1, 2]
    tickets.release(1)  # claimed for the wrong batch: give it back undone
    assert tickets.claim("b", limit=4) == 1
    assert tickets.expire_all_leases() == 3  # a resumed trial: every old lease is void
    assert [tickets.claim("c", limit=4) for _ in range(4)] == [0, 1, 2, 3]


def test_all_done_needs_every_ticket_issued_and_finished(client: redis.Redis) -> None:
    tickets = TicketDispenser(client, RUN_ID)
    producer = RolloutProducer(client, RUN_ID, fast_config())
    assert not tickets.all_done(2)
    first, second = tickets.claim("gen-0", limit=2), tickets.claim("gen-0", limit=2)
    producer.push(make_group(first), batch_index=0, ticket=first)
    assert not tickets.all_done(2)  # ticket 1 is still being generated
    producer.push(make_group(second), batch_index=0, ticket=second)
    assert tickets.all_done(2)
