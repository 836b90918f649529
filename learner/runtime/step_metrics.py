"""A learner step's metric row, assembled in one place (names from `contract.metrics`): the
trained batch's rewards, lengths and staleness, the update's own statistics, dynamic sampling's
counts, the tokens generated, gradient spikes and the step's timings; and the ledger's row of
each trained group (`ledger_rows`: its lag and times, the staleness accounting per group).

Staleness accounting: how old each trained group is, where that time went, what was dropped.
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
import os
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from buffer.rollout_group import RolloutGroup
from buffer.staleness import group_lag
from buffer.streams import Delivery
from contract import metrics as M
from learner.runtime.checkpoint import TrainingState
from learner.runtime.take import Taken

SPIKE_WINDOW = 20


@dataclass(frozen=True)
class GroupTiming:
    """Where one trained group's age went (seconds) and its version lag."""

    lag: int
    generation_s: float
    queue_s: float
    age_s: float


def step_metrics(taken: Taken, update: dict[str, float], step: int) -> dict[str, float]:
    """Step `step`'s batch metrics: `group_metrics` of the trained groups, the update's own
    (`update`), dynamic sampling's, `staleness_metrics` and tokens/generated."""
    groups = [d.group for d in taken.trained]
    metrics = group_metrics(groups, step) | update | taken.sampling_metrics
    timings = [group_timing(d, step, taken.taken_at) for d in taken.trained]
    metrics |= staleness_metrics(timings, groups, [d.group for d in taken.dropped])
    metrics[M.TOKENS_GENERATED] = generated_tokens(
        [d.group for d in taken.consumed + taken.dropped]
    )
    return metrics


def ledger_rows(taken: Taken, step: int) -> list[dict[str, object]]:
    """The ledger's row of each group step `step` trained (`trained_groups/`): its identity,
    who generated it with which policy version, its lag and where its age went."""
    rows = []
    for delivery in taken.trained:
        group, timing = delivery.group, group_timing(delivery, step, taken.taken_at)
        rows.append(
            {
                "group_id": group.group_id,
                "prompt_index": group.prompt_index,
                "policy_version": group.policy_version,
                "generator_id": group.generator_id,
                "lag": timing.lag,
                "generation_s": timing.generation_s,
                "queue_s": timing.queue_s,
                "age_s": timing.age_s,
            }
        )
    return rows


def group_metrics(groups: list[RolloutGroup], step: int) -> dict[str, float]:
    """Reward, length and staleness statistics of a step's batch (design section 7)."""
    rewards = np.array([r for g in groups for r in g.rewards], dtype=np.float64)
    group_std = np.array([np.std(g.rewards) for g in groups])
    lengths = np.array([len(ids) for g in groups for ids in g.response_ids], dtype=np.float64)
    truncated = np.array([f == "length" for g in groups for f in g.finish_reasons])
    lags = np.array([group_lag(step, g.policy_version) for g in groups], dtype=np.float64)
    return token_lag_metrics(groups, step) | {
        M.REWARD_MEAN: float(rewards.mean()),
        M.REWARD_STD: float(rewards.std()),
        M.REWARD_GROUP_STD_MEAN: float(group_std.mean()),
        M.GROUPS_ZERO_ADV_FRAC: float((group_std == 0).mean()),
        M.GROUPS_TRAINED: float(len(groups)),
        M.LENGTH_MEAN: float(lengths.mean()),
        M.LENGTH_P95: float(np.percentile(lengths, 95)),
        M.LENGTH_TRUNCATED_FRAC: float(truncated.mean()),
        M.STALENESS_MEAN: float(lags.mean()),
        M.STALENESS_MAX: float(lags.max()),
    }


def token_lag_metrics(groups: list[RolloutGroup], step: int) -> dict[str, float]:
    """Per-token staleness of the trained responses (`contract.metrics` staleness/token_*): each
    token's lag is `step` minus the version that sampled it (rollout schema v3); NaN without
    response tokens."""
    versions = [v for g in groups for v in g.versions_per_token()]
    lags = group_lag(step, np.concatenate(versions).astype(np.int64)) if versions else np.zeros(0)
    spanning = [bool(v.size) and int(v[0]) != int(v[-1]) for v in versions]
    if not lags.size:
        nan = float("nan")
        return {name: nan for name in _TOKEN_LAG_METRICS} | {
            M.STALENESS_SPANNING_FRAC: float(np.mean(spanning)) if spanning else nan
        }
    return {
        M.STALENESS_TOKEN_LAG_MEAN: float(lags.mean()),
        M.STALENESS_TOKEN_LAG_MAX: float(lags.max()),
        M.STALENESS_TOKENS_LAG0_FRAC: float((lags == 0).mean()),
        M.STALENESS_TOKENS_LAG1_FRAC: float((lags == 1).mean()),
        M.STALENESS_TOKENS_LAG2_FRAC: float((lags == 2).mean()),
        M.STALENESS_TOKENS_LAG3PLUS_FRAC: float((lags >= 3).mean()),
        M.STALENESS_SPANNING_FRAC: float(np.mean(spanning)),
    }


_TOKEN_LAG_METRICS = (
    M.STALENESS_TOKEN_LAG_MEAN,
    M.STALENESS_TOKEN_LAG_MAX,
    M.STALENESS_TOKENS_LAG0_FRAC,
    M.STALENESS_TOKENS_LAG1_FRAC,
    M.STALENESS_TOKENS_LAG2_FRAC,
    M.STALENESS_TOKENS_LAG3PLUS_FRAC,
)


def generated_tokens(groups: list[RolloutGroup]) -> float:
    """Response tokens of `groups`: tokens/generated, given every group a step read (trained,
    dropped as too stale and filtered by dynamic sampling alike: not training a group does not
    refund its generation)."""
    return float(sum(len(ids) for group in groups for ids in group.response_ids))


def is_spike(history: list[float], grad_norm: float, factor: float) -> bool:
    """A gradient norm over `factor` x the rolling median of the previous SPIKE_WINDOW steps."""
    window = history[-SPIKE_WINDOW:]
    return len(window) >= 3 and grad_norm > factor * statistics.median(window)


def grad_spikes(state: TrainingState, grad_norm: float, factor: float) -> dict[str, float]:
    """optim/grad_spikes after this step's `grad_norm`: counts a spike and keeps the window of
    norms in `state` (checkpointed, so a resumed run counts the same spikes)."""
    state.grad_spikes += is_spike(state.grad_norm_history, grad_norm, factor)
    state.grad_norm_history = [*state.grad_norm_history, grad_norm][-SPIKE_WINDOW:]
    return {M.OPTIM_GRAD_SPIKES: float(state.grad_spikes)}


def perf_metrics(
    wait_started: float,
    train_started: float,
    publish_started: float,
    published: float,
    checkpoint_s: float | None,
) -> dict[str, float]:
    """perf/* of a step from its `time.perf_counter` marks (`contract.metrics` says what each
    covers): waiting for the batch, the update, the snapshot the publication blocks on (writing
    it overlaps the next step), and the last checkpoint's seconds when one is not logged yet (a
    checkpoint step's row is on disk before its checkpoint, so it is logged on the step after)."""
    wait_s, publish_s = train_started - wait_started, published - publish_started
    train_s = publish_started - train_started + publish_s
    metrics = {
        M.PERF_LEARNER_STEP_S: wait_s + train_s,
        M.PERF_LEARNER_WAIT_FRAC: wait_s / max(wait_s + train_s, 1e-9),
        M.PERF_LEARNER_TRAIN_S: train_s - publish_s,
        M.PERF_WEIGHT_PUBLISH_S: publish_s,
    }
    if checkpoint_s is not None:
        metrics[M.PERF_CHECKPOINT_S] = checkpoint_s
    learner_cpu = _LEARNER_CPU.share()
    if learner_cpu is not None:
        metrics[M.PERF_LEARNER_CPU_FRAC] = learner_cpu
    return metrics


class CpuShare:
    """perf/learner_cpu_frac: the share of its CPUs this process used between two calls.

    CPU seconds (process_time: every thread, the background writers included) over wall
    seconds x the CPUs the process may run on (its executor.cpu_sets set when pinned). The
    window runs from the previous step's row to this one's, so it covers a whole step; the
    first call of a trial has no window and gives None. A trial is this process and its
    HARNESS_RUN_ID, which the supervisor gives its components: a warm learner process serves
    several trials, and the time between them is no step's. Without one (a learner run in
    process, as tests do) there is no component to measure: None.
    """

    def __init__(self) -> None:
        self._last: tuple[tuple[int, str], float, float] | None = None

    def share(self) -> float | None:
        run_id = os.environ.get("HARNESS_RUN_ID")
        if not run_id:
            return None
        key = (os.getpid(), run_id)
        wall, cpu = time.perf_counter(), time.process_time()
        last, self._last = self._last, (key, wall, cpu)
        if last is None or last[0] != key or wall <= last[1]:
            return None
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        return (cpu - last[2]) / ((wall - last[1]) * max(cpus or 1, 1))


_LEARNER_CPU = CpuShare()


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
        lag=group_lag(learner_version, group.policy_version),
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
