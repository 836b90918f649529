"""Staleness accounting: how old each trained group is, where that time went, what was dropped.

Why the learner measures this and not the buffer: the answer to "how much staleness can an arm
take" needs the lag *and* the time behind it, per trained group, plus what the staleness rule
threw away. Three clocks meet here:
- generation start: the generator's wall clock when its generate call began
  (`RolloutGroup.generation_started_at`, schema v2; v1 records fall back to `created_at`);
- push: the Redis server's clock, read from the stream entry id (`<ms>-<seq>`), so a group that
  waited in a generator's outbox counts that wait as generation, not queue;
- take: the learner's wall clock when the step's batch was handed over.
generation_s = push - start, queue_s = take - push, age_s = take - start = generation_s + queue_s.
On one machine these share a clock; across hosts they need NTP-synchronised clocks (a skew
moves time between generation and queue, never changes the age measured on one host pair).

Dropping stale groups (bounded mode) is a selection: prompts that generate fast (short, often
easy ones) arrive young and survive, so the trained batch can be biased against what was
generated. `bias_*` measure it per step: trained mean minus the mean over every group read
(trained + dropped).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from buffer.schema import RolloutGroup
from buffer.streams import Delivery
from contract import metrics as M


@dataclass(frozen=True)
class GroupTiming:
    """Where one trained group's age went (seconds) and its version lag."""

    lag: int
    generation_s: float
    queue_s: float
    age_s: float


def entry_time(entry_id: str) -> float:
    """Seconds since the epoch at which Redis appended a stream entry (`<ms>-<seq>`)."""
    millis, _, _ = entry_id.partition("-")
    return int(millis) / 1000.0


def group_timing(delivery: Delivery, learner_version: int, taken_at: float) -> GroupTiming:
    """The group's lag and times; `taken_at` is the learner's wall clock at the take."""
    group = delivery.group
    started = (group.generation_started_at or group.created_at).timestamp()
    pushed = entry_time(delivery.entry_id)
    return GroupTiming(
        lag=learner_version - group.policy_version,
        generation_s=pushed - started,
        queue_s=taken_at - pushed,
        age_s=taken_at - started,
    )


def _group_rewards(groups: Sequence[RolloutGroup]) -> np.ndarray:
    """Per-prompt reward: each group's mean over its samples."""
    return np.array([np.mean(g.rewards) for g in groups], dtype=np.float64)


def _lengths(groups: Sequence[RolloutGroup]) -> np.ndarray:
    return np.array([len(r) for g in groups for r in g.response_ids], dtype=np.float64)


def staleness_metrics(
    timings: Sequence[GroupTiming],
    trained: Sequence[RolloutGroup],
    dropped: Sequence[RolloutGroup],
) -> dict[str, float]:
    """Step metrics (`contract.metrics` staleness/*) from the trained groups' timings and the
    groups dropped as too stale while this step's batch was taken."""
    metrics = {
        M.STALENESS_GENERATION_S: float(np.mean([t.generation_s for t in timings])),
        M.STALENESS_QUEUE_S: float(np.mean([t.queue_s for t in timings])),
        M.STALENESS_AGE_S: float(np.mean([t.age_s for t in timings])),
        M.STALENESS_DROPPED: float(len(dropped)),
        M.STALENESS_DROPPED_REWARD_MEAN: math.nan,
        M.STALENESS_DROPPED_LENGTH_MEAN: math.nan,
        M.STALENESS_BIAS_REWARD: 0.0,
        M.STALENESS_BIAS_LENGTH: 0.0,
    }
    if dropped:
        trained_rewards, dropped_rewards = _group_rewards(trained), _group_rewards(dropped)
        trained_lengths, dropped_lengths = _lengths(trained), _lengths(dropped)
        all_rewards = np.concatenate([trained_rewards, dropped_rewards])
        all_lengths = np.concatenate([trained_lengths, dropped_lengths])
        metrics |= {
            M.STALENESS_DROPPED_REWARD_MEAN: float(dropped_rewards.mean()),
            M.STALENESS_DROPPED_LENGTH_MEAN: float(dropped_lengths.mean()),
            M.STALENESS_BIAS_REWARD: float(trained_rewards.mean() - all_rewards.mean()),
            M.STALENESS_BIAS_LENGTH: float(trained_lengths.mean() - all_lengths.mean()),
        }
    return metrics
