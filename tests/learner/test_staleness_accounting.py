"""Staleness accounting (learner.runtime.step_metrics): per-group times and the drop
bias."""

from __future__ import annotations

import dataclasses
import math
from datetime import UTC, datetime, timedelta

import pytest

from buffer.streams import Delivery
from contract import metrics as M
from learner.runtime.step_metrics import entry_time, group_timing, staleness_metrics
from tests.buffer.factories import make_group

START = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)


def _group(prompt_index: int, rewards: list[float], lengths: tuple[int, ...], version: int = 0):
    group = make_group(prompt_index, policy_version=version, lengths=lengths)
    return dataclasses.replace(group, rewards=rewards)


def test_entry_time_reads_the_redis_milliseconds() -> None:
    assert entry_time("1764590400250-7") == 1764590400.25


def test_generation_and_queue_add_up_to_the_age() -> None:
    group = dataclasses.replace(
        make_group(0, policy_version=3),
        generation_started_at=START,
        created_at=START + timedelta(seconds=1.5),
    )
    pushed_ms = int((START + timedelta(seconds=2)).timestamp() * 1000)
    delivery = Delivery(f"{pushed_ms}-0", group, batch_index=0, policy_version=3)
    timing = group_timing(delivery, learner_version=5, taken_at=START.timestamp() + 7.25)
    assert timing.lag == 2
    assert timing.generation_s == pytest.approx(2.0)
    assert timing.queue_s == pytest.approx(5.25)
    assert timing.age_s == pytest.approx(7.25) == timing.generation_s + timing.queue_s


def test_no_drops_means_no_bias() -> None:
    trained = [_group(0, [1.0, 0.0], (3, 1))]
    timing = group_timing(
        Delivery(f"{int(START.timestamp() * 1000)}-0", trained[0], 0, 0), 0, START.timestamp()
    )
    metrics = staleness_metrics([timing], trained, [])
    assert metrics[M.STALENESS_DROPPED] == 0.0
    assert metrics[M.STALENESS_BIAS_REWARD] == 0.0 and metrics[M.STALENESS_BIAS_LENGTH] == 0.0
    assert math.isnan(metrics[M.STALENESS_DROPPED_REWARD_MEAN])


def test_dropping_hard_long_groups_biases_the_trained_batch() -> None:
    # Trained: per-prompt rewards 1.0 and 0.5, lengths 2,2 and 4,2. Dropped (too stale): one
    # group with per-prompt reward 0.0, lengths 8,8. All read: rewards (1 + 0.5 + 0) / 3 = 0.5,
    # lengths (2+2+4+2+8+8) / 6 = 26/6. Trained: 0.75 and 10/4 = 2.5.
    trained = [_group(0, [1.0, 1.0], (2, 2)), _group(1, [1.0, 0.0], (4, 2))]
    dropped = [_group(2, [0.0, 0.0], (8, 8), version=0)]
    timing = group_timing(
        Delivery(f"{int(START.timestamp() * 1000)}-0", trained[0], 0, 0), 0, START.timestamp()
    )
    metrics = staleness_metrics([timing, timing], trained, dropped)
    assert metrics[M.STALENESS_DROPPED] == 1.0
    assert metrics[M.STALENESS_DROPPED_REWARD_MEAN] == 0.0
    assert metrics[M.STALENESS_DROPPED_LENGTH_MEAN] == 8.0
    assert metrics[M.STALENESS_BIAS_REWARD] == pytest.approx(0.75 - 0.5)
    assert metrics[M.STALENESS_BIAS_LENGTH] == pytest.approx(2.5 - 26 / 6)
