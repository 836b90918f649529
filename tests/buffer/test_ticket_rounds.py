"""Extra rounds of a batch (DAPO's dynamic sampling): their tickets, how generators claim them,
how the buffer takes them as draws of their own, and what the intake accepts of them."""

from __future__ import annotations

import dataclasses

import pytest
import redis

from buffer.consumer import RolloutConsumer
from buffer.inbox import Delivery
from buffer.intake import IntakeRules, ModelLimits, TrialSlots, identity_problem
from buffer.producer import RolloutProducer
from buffer.schema import make_group_id
from buffer.tickets import (
    MAX_EXTRA_ROUNDS,
    ROUND_SPAN,
    TicketDispenser,
    draw_batch,
    draw_key,
    draw_round,
    round_tickets,
    ticket_batch,
    ticket_draw,
    ticket_round,
)
from learner.config import make_arm
from tests.buffer.factories import RUN_ID, fast_config, make_group

P = 4


def _group_of(ticket: int, batch: int, *, policy_version: int = 0):
    """A valid group for `ticket` (tokens from its position in the batch: the factory's token
    values grow with the prompt index and an extra round's would overflow int32)."""
    group = make_group(ticket % ROUND_SPAN, policy_version=policy_version)
    return dataclasses.replace(group, prompt_index=ticket, group_id=make_group_id(0, batch, ticket))


def test_round_zero_is_the_plain_ticket_space() -> None:
    # An arm without dynamic sampling issues exactly the tickets, prompts and draws it always did.
    assert round_tickets(3, 0, P) == [12, 13, 14, 15]
    assert [ticket_batch(t, P) for t in (0, 3, 4, 15)] == [0, 0, 1, 3]
    assert all(ticket_round(t) == 0 and ticket_draw(t, P) == t // P for t in range(64))
    assert draw_key(5, 0) == 5


def test_extra_round_tickets_carry_batch_and_round() -> None:
    tickets = round_tickets(3, 2, P)
    assert tickets == [2 * ROUND_SPAN + 12 + s for s in range(P)]
    assert {ticket_batch(t, P) for t in tickets} == {3}
    assert {ticket_round(t) for t in tickets} == {2}
    key = ticket_draw(tickets[0], P)
    assert key == draw_key(3, 2) and draw_batch(key) == 3 and draw_round(key) == 2
    # every ticket of the deepest round stays below 1e14 (exact as a Redis Lua number/string)
    assert max(round_tickets(2**40 // P - 1, MAX_EXTRA_ROUNDS, P)) < 10**14
    with pytest.raises(ValueError, match="round <= 63"):
        round_tickets(0, MAX_EXTRA_ROUNDS + 1, P)
    # the arm setting's bound is the ticket layout's
    field = make_arm(name="a", objective="grpo").model_fields["dynamic_sampling_rounds"]
    assert any(getattr(m, "le", None) == MAX_EXTRA_ROUNDS for m in field.metadata)


def test_requested_rounds_are_claimed_first_and_issued_once(client: redis.Redis) -> None:
    tickets = TicketDispenser(client, RUN_ID)
    assert [tickets.claim("g", limit=2 * P) for _ in range(2)] == [0, 1]
    assert tickets.request_round(0, 1, P) == P
    assert tickets.request_round(0, 1, P) == 0  # idempotent: a resumed learner asks again
    extra = round_tickets(0, 1, P)
    # the learner waits for them: they go before the new round-0 tickets 2, 3, ...
    assert [tickets.claim("g", limit=2 * P) for _ in range(P)] == extra
    assert tickets.claim("g", limit=2 * P) == 2
    assert tickets.request_round(0, 1, P) == 0  # issued: never requested (or issued) again
    assert tickets.requested_extra() == []
    assert tickets.issued() == 3 + P
    assert set(tickets.outstanding()) == {0, 1, 2, *extra}


def test_extra_rounds_respect_the_admission_limit_by_batch(client: redis.Redis) -> None:
    tickets = TicketDispenser(client, RUN_ID)
    tickets.request_round(2, 1, P)  # batch 2 is beyond limit P (only batch 0 admitted)
    assert tickets.claim("g", limit=P) == 0  # the extra round waits; round 0 goes on
    assert tickets.requested_extra() == round_tickets(2, 1, P)
    assert tickets.claim("g", limit=3 * P) == round_tickets(2, 1, P)[0]


def test_an_expired_extra_lease_is_reissued(client: redis.Redis) -> None:
    tickets = TicketDispenser(client, RUN_ID, lease_s=0.2)
    tickets.request_round(0, 1, P)
    first = tickets.claim("crashy", limit=P)
    assert first == round_tickets(0, 1, P)[0]
    tickets.release(first)  # as an expired lease
    assert tickets.claim("steady", limit=P) == first
    assert tickets.outstanding()[first] == "steady"


def test_all_done_waits_for_requested_rounds_and_completed_counts_them(
    client: redis.Redis,
) -> None:
    tickets = TicketDispenser(client, RUN_ID)
    producer = RolloutProducer(client, RUN_ID, fast_config())
    for _ in range(P):
        t = tickets.claim("g", limit=P)
        producer.push(make_group(t), batch_index=0, ticket=t)
    assert tickets.all_done(P) and tickets.completed() == P
    tickets.request_round(0, 1, P)
    assert not tickets.all_done(P)  # a requested round is work left
    for t in round_tickets(0, 1, P):
        assert tickets.claim("g", limit=P) == t
        producer.push(_group_of(t, 0), batch_index=draw_key(0, 1), ticket=t)
    assert tickets.all_done(P) and tickets.completed() == 2 * P


def _push_draw(producer: RolloutProducer, batch: int, round_index: int) -> None:
    for t in round_tickets(batch, round_index, 2):
        producer.push(_group_of(t, batch), batch_index=draw_key(batch, round_index))


def test_a_round_is_taken_as_its_own_draw_and_never_made_late_by_its_batch(
    client: redis.Redis,
) -> None:
    producer = RolloutProducer(client, RUN_ID, fast_config())
    consumer = RolloutConsumer(client, RUN_ID, fast_config())
    _push_draw(producer, 0, 1)  # the extra round arrives first (stashed under its draw key)
    _push_draw(producer, 0, 0)
    _push_draw(producer, 1, 1)  # a round of a later batch waits too
    batch0 = consumer.take_batch(0, 2, "learner", 5)
    assert [d.group.prompt_index for d in batch0] == [0, 1]
    round1 = consumer.take_batch(draw_key(0, 1), 2, "learner", 5)  # not dropped as late
    assert [d.group.prompt_index for d in round1] == round_tickets(0, 1, 2)
    _push_draw(producer, 1, 0)
    assert [d.group.prompt_index for d in consumer.take_batch(1, 2, "learner", 5)] == [2, 3]
    later = consumer.take_batch(draw_key(1, 1), 2, "learner", 5)
    assert [d.group.prompt_index for d in later] == round_tickets(1, 1, 2)
    # a round of batch 0 arriving after the learner moved to batch 1 is late: dropped
    _push_draw(producer, 0, 2)
    _push_draw(producer, 2, 0)
    consumer.take_batch(2, 2, "learner", 5)
    with pytest.raises(TimeoutError, match="has 0 of 2 groups"):
        consumer.take_batch(draw_key(0, 2), 2, "learner", 0.3)


def _rules(extra_rounds: int) -> IntakeRules:
    return IntakeRules(
        mode="fixed",
        lag=1,
        seed=0,
        prompts_per_step=2,
        group_size=2,
        max_new_tokens=8,
        reward_range=(0.0, 1.0),
        limits=ModelLimits(vocab_size=100_000),
        extra_rounds=extra_rounds,
    )


def _delivery(batch: int, round_index: int, slot: int, *, key: int | None = None, version=None):
    prompt = round_tickets(batch, round_index, 2)[slot]
    version = max(0, batch - 1) if version is None else version
    group = _group_of(prompt, batch, policy_version=version)
    key = draw_key(batch, round_index) if key is None else key
    return Delivery("1-0", group, key, version)


def test_intake_accepts_an_extra_round_only_where_the_arm_asks_for_it() -> None:
    assert identity_problem(_delivery(3, 2, 1), _rules(2), 3) is None
    refused = identity_problem(_delivery(3, 2, 1), _rules(1), 3)
    assert refused == "claims extra round 2 of batch 3, but the arm's dynamic_sampling_rounds is 1"
    # an extra round is generated with its batch's fixed version, not a later one
    refused = identity_problem(_delivery(3, 1, 0, version=3), _rules(2), 3)
    assert "policy_version 3, but fixed mode at lag 1 generates batch 3 with version 2" in refused
    # a round-0 prompt claiming to be a round-1 draw (or the reverse) is refused
    wrong = _delivery(3, 0, 0, key=draw_key(3, 1))
    first = ROUND_SPAN + 6
    assert identity_problem(wrong, _rules(2), 3) == (
        f"prompt_index 6 is outside batch 3 round 1's [{first}, {first + 2})"
    )
    assert "outside batch 3's [6, 8)" in identity_problem(_delivery(3, 1, 0, key=3), _rules(2), 3)


def test_trial_slots_hold_the_extra_rounds_the_arm_may_read() -> None:
    slots = TrialSlots(seed=0, prompts_per_step=2, steps=4, extra_rounds=2)
    assert make_group_id(0, 3, round_tickets(3, 2, 2)[1]) in slots
    assert make_group_id(0, 3, round_tickets(3, 3, 2)[1]) not in slots
    assert make_group_id(0, 4, round_tickets(4, 1, 2)[0]) not in slots  # beyond the steps
    plain = TrialSlots(seed=0, prompts_per_step=2, steps=4)
    assert make_group_id(0, 3, 7) in plain
    assert make_group_id(0, 3, round_tickets(3, 1, 2)[0]) not in plain
