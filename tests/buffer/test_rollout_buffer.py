"""Both sides of the buffer on a real redis-server: delivery, staleness modes, backpressure,
dead letter, run control."""

from __future__ import annotations

import threading
import time

import pytest
import redis

from buffer.connection import RunKeys
from buffer.consumer import RolloutConsumer
from buffer.outbox import BufferFullError
from buffer.producer import RolloutProducer
from buffer.record_types import RecordError
from buffer.run_control import delete_run, request_stop, stop_requested
from buffer.telemetry import Telemetry
from tests.buffer.factories import (
    MALFORMED,
    RUN_ID,
    SMALL_MESSAGE_LIMIT,
    fast_config,
    make_group,
)
from tests.buffer.run_state import dead_letter_count, dropped_stale_count, is_trained, mark_trained

KEYS = RunKeys(RUN_ID)


def _ids(deliveries) -> list[str]:
    return [d.group.group_id for d in deliveries]


def test_push_take_commit_round_trip(
    producer: RolloutProducer, consumer: RolloutConsumer, client: redis.Redis
) -> None:
    group = make_group(0, lengths=(3, 0, 2))
    entry_id = producer.push(group, batch_index=0)
    assert consumer.depth() == 1
    [delivery] = consumer.take_batch(0, 1, consumer="learner", timeout_s=2)
    assert delivery.entry_id == entry_id
    assert delivery.group == group
    assert (delivery.batch_index, delivery.policy_version) == (0, 0)
    assert consumer.depth() == 1  # read but unacked still counts
    consumer.commit([delivery])
    assert consumer.depth() == 0
    assert is_trained(client, group.group_id)
    fields = client.xinfo_groups(KEYS.stream)[0]
    assert fields["pending"] == 0


def test_entry_header_fields(producer: RolloutProducer, client: redis.Redis) -> None:
    producer.push(make_group(5, batch_index=2, policy_version=1), batch_index=2)
    [(_, fields)] = client.xrange(KEYS.stream)
    assert fields[b"policy_version"] == b"1" and fields[b"batch_index"] == b"2"
    assert fields[b"group_id"] == b"s0-b2-p5" and fields[b"producer"] == b"gen-0"


def test_two_consumers_ack_semantics(producer: RolloutProducer, client: redis.Redis) -> None:
    a = RolloutConsumer(client, RUN_ID, fast_config(claim_idle_ms=300))
    b = RolloutConsumer(client, RUN_ID, fast_config(claim_idle_ms=300))
    for i in range(4):
        producer.push(make_group(i), batch_index=0)
    got_a = a.take(2, learner_version=0, max_lag=0, consumer="a", timeout_s=2).deliveries
    got_b = b.take(2, learner_version=0, max_lag=0, consumer="b", timeout_s=2).deliveries
    assert set(_ids(got_a)).isdisjoint(_ids(got_b))  # each entry goes to one consumer
    b.commit(got_b)
    assert b.depth() == 2  # a's two are still pending
    with pytest.raises(TimeoutError):  # a's entries are not idle long enough to be claimed
        b.take(1, learner_version=0, max_lag=0, consumer="b", timeout_s=0.1)
    a.commit(got_a)
    assert a.depth() == 0
    time.sleep(0.4)  # past claim_idle_ms: nothing is left to claim either
    with pytest.raises(TimeoutError):
        b.take(1, learner_version=0, max_lag=0, consumer="b", timeout_s=0.2)


def test_unacked_entries_are_claimed_after_idle(
    producer: RolloutProducer, client: redis.Redis
) -> None:
    a = RolloutConsumer(client, RUN_ID, fast_config(claim_idle_ms=200))
    b = RolloutConsumer(client, RUN_ID, fast_config(claim_idle_ms=200))
    for i in range(3):
        producer.push(make_group(i), batch_index=0)
    held = a.take_batch(0, 3, consumer="a", timeout_s=2)  # a "dies" holding them
    time.sleep(0.3)
    claimed = b.take_batch(0, 3, consumer="b", timeout_s=2)
    assert _ids(claimed) == _ids(held)
    b.commit(claimed)
    assert b.depth() == 0


def test_fixed_mode_out_of_order_arrival(
    producer: RolloutProducer, consumer: RolloutConsumer
) -> None:
    pushes = [(2, 5), (1, 3), (0, 1), (2, 4), (0, 0), (1, 2)]  # (batch, prompt), shuffled
    for batch, prompt in pushes:
        producer.push(make_group(prompt, batch_index=batch), batch_index=batch)
    for batch in range(3):
        got = consumer.take_batch(batch, 2, consumer="learner", timeout_s=2)
        assert _ids(got) == [f"s0-b{batch}-p{2 * batch}", f"s0-b{batch}-p{2 * batch + 1}"]
        assert {d.batch_index for d in got} == {batch}
        consumer.commit(got)
    assert consumer.depth() == 0


def test_take_batch_waits_for_a_late_group(
    producer: RolloutProducer, consumer: RolloutConsumer
) -> None:
    producer.push(make_group(1), batch_index=0)
    timer = threading.Timer(0.3, lambda: producer.push(make_group(0), batch_index=0))
    timer.start()
    got = consumer.take_batch(0, 2, consumer="learner", timeout_s=5)
    timer.join()
    assert _ids(got) == ["s0-b0-p0", "s0-b0-p1"]  # by prompt index, not arrival


def test_take_batch_timeout_names_the_batch(
    producer: RolloutProducer, consumer: RolloutConsumer
) -> None:
    producer.push(make_group(0), batch_index=0)
    with pytest.raises(TimeoutError, match="batch 0 has 1 of 2 groups"):
        consumer.take_batch(0, 2, consumer="learner", timeout_s=0.2)


def test_retried_take_batch_returns_the_same_groups(
    producer: RolloutProducer, consumer: RolloutConsumer
) -> None:
    for i in range(2):
        producer.push(make_group(i), batch_index=0)
    first = consumer.take_batch(0, 2, consumer="learner", timeout_s=2)
    assert consumer.take_batch(0, 2, consumer="learner", timeout_s=0.1) == first


def test_stash_survives_a_consumer_restart(producer: RolloutProducer, client: redis.Redis) -> None:
    first = RolloutConsumer(client, RUN_ID, fast_config())
    for i in (2, 3, 0, 1):  # batch 1 (prompts 2, 3) arrives before batch 0
        producer.push(make_group(i, batch_index=i // 2), batch_index=i // 2)
    first.commit(first.take_batch(0, 2, consumer="learner", timeout_s=2))
    del first  # the process dies with batch 1 stashed in memory only
    restarted = RolloutConsumer(client, RUN_ID, fast_config(claim_idle_ms=60_000))
    got = restarted.take_batch(1, 2, consumer="learner", timeout_s=2)
    assert _ids(got) == ["s0-b1-p2", "s0-b1-p3"]  # from its own pending list, not XAUTOCLAIM


def test_bounded_mode_drops_stale_groups(
    producer: RolloutProducer, consumer: RolloutConsumer, client: redis.Redis
) -> None:
    for i, version in enumerate((0, 3, 1, 2, 3)):
        producer.push(make_group(i, policy_version=version), batch_index=0)
    result = consumer.take(3, learner_version=3, max_lag=1, consumer="learner", timeout_s=2)
    # Lags in arrival order: 3, 0, 2, 1, 0 -> the lag-3 and lag-2 groups are dropped.
    assert [d.policy_version for d in result.deliveries] == [3, 2, 3]
    assert result.dropped_stale == 2
    assert dropped_stale_count(client) == 2
    assert consumer.depth() == 3  # dropped ones are acked and gone; taken ones pending
    consumer.commit(result.deliveries)
    assert consumer.depth() == 0


def test_bounded_take_keeps_partial_results_on_timeout(
    producer: RolloutProducer, consumer: RolloutConsumer
) -> None:
    producer.push(make_group(0), batch_index=0)
    with pytest.raises(TimeoutError, match="only 1 of 2 groups"):
        consumer.take(2, learner_version=0, max_lag=0, consumer="learner", timeout_s=0.2)
    producer.push(make_group(1), batch_index=0)
    result = consumer.take(2, learner_version=0, max_lag=0, consumer="learner", timeout_s=2)
    assert _ids(result.deliveries) == ["s0-b0-p0", "s0-b0-p1"]


def test_backpressure_blocks_then_raises_without_losing_data(client: redis.Redis) -> None:
    config = fast_config(max_depth=3, push_timeout_s=0.3)
    producer = RolloutProducer(client, RUN_ID, config)
    consumer = RolloutConsumer(client, RUN_ID, config)
    for i in range(3):
        producer.push(make_group(i), batch_index=0)
    start = time.monotonic()
    with pytest.raises(BufferFullError, match="buffer full") as info:
        producer.push(make_group(3), batch_index=0)
    assert time.monotonic() - start >= 0.3
    assert "max_depth=3" in str(info.value)
    assert isinstance(info.value, TimeoutError)
    assert consumer.depth() == 3  # nothing trimmed, nothing extra written

    patient = RolloutProducer(client, RUN_ID, fast_config(max_depth=3, push_timeout_s=10))
    pusher = threading.Thread(target=patient.push, args=(make_group(3), 0))
    pusher.start()
    time.sleep(0.3)
    assert pusher.is_alive()  # blocked while full
    first = consumer.take(1, learner_version=0, max_lag=0, consumer="learner", timeout_s=2)
    assert consumer.depth() == 3  # read but unacked still occupies room
    consumer.commit(first.deliveries)
    pusher.join(timeout=5)
    assert not pusher.is_alive()
    rest = consumer.take(3, learner_version=0, max_lag=0, consumer="learner", timeout_s=2)
    assert sorted(_ids(first.deliveries + rest.deliveries)) == [f"s0-b0-p{i}" for i in range(4)]


@pytest.mark.parametrize(("case", "payload", "reason"), MALFORMED, ids=[c[0] for c in MALFORMED])
def test_malformed_message_goes_to_dead_letter(client: redis.Redis, case, payload, reason) -> None:
    config = fast_config(max_message_bytes=SMALL_MESSAGE_LIMIT)
    producer = RolloutProducer(client, RUN_ID, config)
    consumer = RolloutConsumer(client, RUN_ID, config)
    raw = payload()
    bad_id = client.xadd(
        KEYS.stream,
        {"data": raw, "policy_version": 0, "batch_index": 0, "group_id": "s0-b0-p0",
         "producer": "evil-gen"},
    ).decode()  # fmt: skip
    producer.push(make_group(1), batch_index=0)
    [good] = consumer.take_batch(0, 1, consumer="learner", timeout_s=2)
    assert good.group.group_id == "s0-b0-p1"
    assert dead_letter_count(client) == 1
    [(_, dead)] = client.xrange(KEYS.dead_letter)
    assert reason in dead[b"reason"].decode()
    assert dead[b"producer"] == b"evil-gen"
    assert dead[b"entry_id"].decode() == bad_id
    assert dead[b"payload"] == raw[:65536]
    assert int(dead[b"payload_bytes"]) == len(raw)
    consumer.commit([good])
    assert consumer.depth() == 0  # the bad entry was acked and removed too


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"policy_version": 0, "batch_index": 0}, "lacks fields"),
        ({"batch_index": "zero", "policy_version": 0, "group_id": "s0-b0-p0"}, "not integers"),
        ({"batch_index": 0, "policy_version": 7, "group_id": "s0-b0-p0"}, "disagrees"),
        ({"batch_index": 0, "policy_version": 0, "group_id": "s0-b0-p9"}, "disagrees"),
    ],
)
def test_bad_entry_headers_go_to_dead_letter(
    consumer: RolloutConsumer, client, fields, reason
) -> None:
    from buffer.schema import encode_group

    client.xadd(KEYS.stream, {"data": encode_group(make_group(0)), **fields})
    with pytest.raises(TimeoutError):
        consumer.take(1, learner_version=0, max_lag=5, consumer="learner", timeout_s=0.2)
    [(_, dead)] = client.xrange(KEYS.dead_letter)
    assert reason in dead[b"reason"].decode()
    assert dead_letter_count(client) == 1 and consumer.depth() == 0


def test_duplicates_are_never_delivered_twice(
    producer: RolloutProducer, consumer: RolloutConsumer, client: redis.Redis
) -> None:
    producer.push(make_group(0), batch_index=0)
    producer.push(make_group(0), batch_index=0)  # a re-issued ticket's second copy
    producer.push(make_group(1), batch_index=0)
    got = consumer.take_batch(0, 2, consumer="learner", timeout_s=2)
    assert _ids(got) == ["s0-b0-p0", "s0-b0-p1"]
    consumer.commit(got)
    producer.push(make_group(1), batch_index=0)  # arrives after it was trained
    with pytest.raises(TimeoutError):
        consumer.take(1, learner_version=0, max_lag=0, consumer="learner", timeout_s=0.2)
    assert int(client.hget(KEYS.counters, "duplicate")) == 2
    assert consumer.depth() == 0


def test_groups_already_trained_are_skipped(
    producer: RolloutProducer, consumer: RolloutConsumer, client: redis.Redis
) -> None:
    mark_trained(client, ["s0-b0-p0"])  # as a commit of an earlier attempt left it
    producer.push(make_group(0), batch_index=0)
    producer.push(make_group(1), batch_index=0)
    result = consumer.take(1, learner_version=0, max_lag=0, consumer="learner", timeout_s=2)
    assert _ids(result.deliveries) == ["s0-b0-p1"]


def test_producer_side_checks(client: redis.Redis) -> None:
    producer = RolloutProducer(client, RUN_ID, fast_config(max_message_bytes=SMALL_MESSAGE_LIMIT))
    with pytest.raises(RecordError, match=r"over buffer\.max_message_bytes"):
        producer.push(make_group(0, lengths=(SMALL_MESSAGE_LIMIT,)), batch_index=0)
    with pytest.raises(RecordError, match="is for run"):
        producer.push(make_group(0, run_id="other-run"), batch_index=0)
    assert client.xlen(KEYS.stream) == 0  # the depth: nothing was written


def test_lost_run_state_is_named(
    producer: RolloutProducer, consumer: RolloutConsumer, client: redis.Redis
) -> None:
    producer.push(make_group(0), batch_index=0)
    client.flushdb()  # as if Redis restarted without AOF
    with pytest.raises(RuntimeError, match=r"Redis lost run .*'s state"):
        consumer.take_batch(0, 1, consumer="learner", timeout_s=0.5)


def test_run_control_and_the_producers_telemetry(
    producer: RolloutProducer, client: redis.Redis
) -> None:
    assert not producer.stop_requested() and not stop_requested(client, RUN_ID)
    request_stop(client, RUN_ID)
    assert producer.stop_requested() and stop_requested(client, RUN_ID)
    producer.report_generator_stats("gen-0", {"perf/gen_tokens_per_s": 10.0})
    assert Telemetry(client, RUN_ID).generators()["gen-0"]["perf/gen_tokens_per_s"] == 10.0


def test_delete_run_removes_only_this_run(
    producer: RolloutProducer, consumer: RolloutConsumer, client: redis.Redis
) -> None:
    other = RolloutConsumer(client, "other-run", fast_config())
    RolloutProducer(client, "other-run").push(make_group(0, run_id="other-run"), batch_index=0)
    producer.push(make_group(0), batch_index=0)
    mark_trained(client, ["s0-b0-p0"])
    request_stop(client, RUN_ID)
    assert delete_run(client, RUN_ID) >= 3
    assert not stop_requested(client, RUN_ID) and not is_trained(client, "s0-b0-p0")
    assert consumer.depth() == 0 and other.depth() == 1
    producer.push(make_group(1), batch_index=0)  # still usable afterwards,
    fresh = RolloutConsumer(client, RUN_ID, fast_config())  # by the fresh trial's learner
    assert _ids(fresh.take_batch(0, 1, consumer="learner", timeout_s=2)) == ["s0-b0-p1"]
