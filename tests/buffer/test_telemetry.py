"""Telemetry: per-generator figures and the buffer counters the learner logs."""

from __future__ import annotations

import redis

from buffer.consumer import RolloutConsumer
from buffer.producer import RolloutProducer
from buffer.telemetry import Telemetry
from contract import metrics as m
from tests.buffer.factories import RUN_ID, make_group


def test_generators_report_and_learner_reads_all(client: redis.Redis) -> None:
    telemetry = Telemetry(client, RUN_ID)
    telemetry.report("gen-0", {m.PERF_GEN_TOKENS_PER_S: 1500.0, m.PERF_GEN_IDLE_FRAC: 0.25})
    telemetry.report("gen-1", {m.PERF_GEN_TOKENS_PER_S: 500.0, m.PERF_WEIGHT_SYNC_S: 1.5})
    telemetry.report("gen-0", {m.PERF_GEN_TOKENS_PER_S: 1700.0, m.PERF_GEN_IDLE_FRAC: 0.5})
    figures = telemetry.generators()
    assert sorted(figures) == ["gen-0", "gen-1"]
    assert figures["gen-0"][m.PERF_GEN_TOKENS_PER_S] == 1700.0
    assert figures["gen-0"][m.PERF_GEN_IDLE_FRAC] == 0.5
    assert figures["gen-1"][m.PERF_WEIGHT_SYNC_S] == 1.5
    assert figures["gen-1"]["updated_at"] > 0
    # Fleet figures: tokens/s add up (1700 + 500); idle and sync average over who reported them.
    assert telemetry.generator_metrics() == {
        m.PERF_GEN_TOKENS_PER_S: 2200.0, m.PERF_GEN_IDLE_FRAC: 0.5, m.PERF_WEIGHT_SYNC_S: 1.5,
    }  # fmt: skip


def test_buffer_metrics(
    client: redis.Redis, producer: RolloutProducer, consumer: RolloutConsumer
) -> None:
    telemetry = Telemetry(client, RUN_ID)
    assert telemetry.buffer_metrics() == {
        m.BUFFER_DEPTH: 0.0, m.BUFFER_DROPPED_STALE: 0.0, m.BUFFER_DEAD_LETTER: 0.0,
    }  # fmt: skip
    producer.push(make_group(0, policy_version=0), batch_index=0)
    producer.push(make_group(1, policy_version=5), batch_index=0)
    consumer.take(1, learner_version=5, max_lag=1, consumer="learner", timeout_s=2)
    metrics = telemetry.buffer_metrics()
    assert metrics[m.BUFFER_DEPTH] == 1.0  # the taken, unacked group
    assert metrics[m.BUFFER_DROPPED_STALE] == 1.0  # lag 5 > 1
    assert metrics[m.BUFFER_DEAD_LETTER] == 0.0
