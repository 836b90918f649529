"""Failures with real processes: SIGKILLed consumer, generator and Redis; concurrent producers."""

from __future__ import annotations

import json
import multiprocessing
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from buffer.connection import RunKeys, connect
from buffer.consumer import RolloutConsumer
from buffer.producer import RolloutProducer
from buffer.run_control import request_stop
from buffer.server import EmbeddedRedis
from buffer.tickets import TicketDispenser, admission_limit
from buffer.versions import VersionRegistry
from tests.buffer.factories import RUN_ID, fast_config, make_group
from tests.buffer.run_state import dropped_stale_count
from tests.buffer.workers import produce_bounded
from tests.conftest import RedisInstance

REPO = Path(__file__).resolve().parents[2]
KEYS = RunKeys(RUN_ID)


def _start_worker(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.buffer.workers", *args],
        cwd=REPO, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip


def _report_then_kill(process: subprocess.Popen[str]) -> object:
    try:
        line = process.stdout.readline()
        assert line, "worker exited before reporting"
        return json.loads(line)
    finally:
        process.kill()  # SIGKILL: no cleanup, no ack
        process.wait(timeout=10)


def test_killed_consumer_entries_are_claimed_and_trained_once(
    redis_server: RedisInstance, client: redis.Redis
) -> None:
    consumer = RolloutConsumer(client, RUN_ID, fast_config(claim_idle_ms=300))
    producer = RolloutProducer(client, RUN_ID, fast_config(claim_idle_ms=300))
    pushed = [producer.push(make_group(i), batch_index=0) for i in range(4)]
    doomed = _start_worker("take-and-hang", redis_server.url, "4", "doomed")
    assert sorted(_report_then_kill(doomed)) == sorted(pushed)
    assert client.xpending(KEYS.stream, KEYS.consumer_group)["pending"] == 4

    got = consumer.take_batch(0, 4, consumer="survivor", timeout_s=10)  # after claim_idle_ms
    assert sorted(d.entry_id for d in got) == sorted(pushed)
    consumer.commit(got)
    trained = {m.decode() for m in client.smembers(KEYS.trained)}
    assert trained == {f"s0-b0-p{i}" for i in range(4)}

    # The dead consumer restarted under its name finds nothing left, and copies pushed again by
    # a re-issued ticket are recognised as trained: each group was trained exactly once.
    for i in range(4):
        producer.push(make_group(i), batch_index=0)
    restarted = RolloutConsumer(client, RUN_ID, fast_config(claim_idle_ms=300))
    with pytest.raises(TimeoutError):
        restarted.take(1, learner_version=0, max_lag=0, consumer="doomed", timeout_s=0.5)
    assert int(client.hget(KEYS.counters, "duplicate")) == 4
    assert consumer.depth() == 0


def test_crashed_generator_ticket_is_reissued(redis_server: RedisInstance, client) -> None:
    crashed = _start_worker("claim-and-hang", redis_server.url, "gen-crash", "1.0")
    assert _report_then_kill(crashed) == 0
    tickets = TicketDispenser(client, RUN_ID, lease_s=1.0)
    # limit=1: ticket 0 is the only one, so claims return None until the dead lease expires.
    assert tickets.claim("gen-ok", limit=1) is None
    deadline = time.monotonic() + 5.0
    while (ticket := tickets.claim("gen-ok", limit=1)) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ticket == 0
    assert tickets.outstanding() == {0: "gen-ok"}
    assert tickets.issued() == 1  # handed out again, not counted as a new start


def test_redis_sigkill_with_aof_always_loses_no_pushed_group(tmp_path: Path) -> None:
    config = fast_config(claim_idle_ms=60_000)
    with EmbeddedRedis(tmp_path, appendfsync="always") as server:
        first_client = connect(server.url)
        consumer = RolloutConsumer(first_client, RUN_ID, config)
        producer = RolloutProducer(first_client, RUN_ID, config)
        for i in range(12):
            producer.push(make_group(i, batch_index=i // 4), batch_index=i // 4)
        read_before_crash = consumer.take_batch(0, 4, consumer="learner", timeout_s=2)
        server.kill()  # SIGKILL: no shutdown, no final fsync
        server.restart()
        revived = RolloutConsumer(connect(server.url), RUN_ID, config)
        assert revived.depth() == 12
        got = [revived.take_batch(k, 4, consumer="learner", timeout_s=5) for k in range(3)]
        # Batch 0 comes back from the learner's pending list, batches 1-2 as new entries.
        assert [d.entry_id for d in got[0]] == [d.entry_id for d in read_before_crash]
        ids = [d.group.group_id for batch in got for d in batch]
        assert ids == [f"s0-b{i // 4}-p{i}" for i in range(12)]


def test_bounded_mode_with_concurrent_producer_processes(
    redis_server: RedisInstance, client: redis.Redis
) -> None:
    prompts_per_step, max_lag, steps = 4, 1, 8
    consumer = RolloutConsumer(client, RUN_ID, fast_config(max_depth=64))
    tickets = TicketDispenser(client, RUN_ID)
    versions = VersionRegistry(client, RUN_ID)
    versions.publish(0, "weights/v0")
    context = multiprocessing.get_context("spawn")
    producers = [
        context.Process(
            target=produce_bounded, args=(redis_server.url, f"gen-{i}", prompts_per_step, max_lag)
        )
        for i in range(3)
    ]
    for process in producers:
        process.start()
    consumed: list[str] = []
    dropped = 0
    try:
        for step in range(steps):
            result = consumer.take(
                prompts_per_step, learner_version=step, max_lag=max_lag, consumer="learner",
                timeout_s=60,
            )  # fmt: skip
            lags = [step - d.policy_version for d in result.deliveries]
            assert max(lags) <= max_lag, f"step {step}: lags {lags}"
            assert tickets.issued() <= admission_limit(step, max_lag, prompts_per_step)
            consumed += [d.group.group_id for d in result.deliveries]
            dropped += result.dropped_stale
            consumer.commit(result.deliveries)
            versions.publish(step + 1, f"weights/v{step + 1}")
    finally:
        request_stop(client, RUN_ID)
        for process in producers:
            process.join(timeout=30)
            if process.is_alive():
                process.kill()
    assert all(p.exitcode == 0 for p in producers)
    assert len(consumed) == len(set(consumed)) == steps * prompts_per_step
    issued = tickets.issued()
    assert issued <= admission_limit(steps, max_lag, prompts_per_step)
    # Every started group is accounted for: trained, dropped as stale, waiting, or unfinished.
    assert issued == len(consumed) + dropped + consumer.depth() + len(tickets.outstanding())
    assert dropped_stale_count(client) == dropped
