"""Taking a step's batch (learner.runtime.take.BatchTaker) against a scripted source: prompt
order, the consumed ids a checkpoint records, and redelivered copies of consumed groups."""

from __future__ import annotations

from pathlib import Path

import pytest

from buffer.intake import ModelLimits
from buffer.streams import Delivery, TakeResult
from learner.config import LearnerConfig, make_arm
from learner.runtime.take import BatchTaker
from learner.runtime.task import LearnerTask
from tests.buffer.factories import make_group

PER_STEP = 2


class ScriptedSource:
    """Hands out the deliveries queued per step; records acks. Accepts every group."""

    def __init__(self, per_step: dict[int, list[Delivery]]) -> None:
        self.per_step, self.acked = per_step, []

    def take_batch(self, batch_index, n_groups, consumer, timeout_s, *, rules=None, slots=()):
        return list(self.per_step[batch_index])

    def take(
        self, n_groups, learner_version, max_lag, consumer, timeout_s, *, rules=None, timeline=None
    ):
        return TakeResult(list(self.per_step[learner_version]))

    def ack(self, entry_ids) -> None:
        self.acked += list(entry_ids)


def _delivery(prompt: int, batch: int, entry: int) -> Delivery:
    group = make_group(prompt, batch_index=batch, seed=0)
    return Delivery(f"{1000 + entry}-0", group, batch, group.policy_version)


def _taker(source: ScriptedSource, mode: str, trained: list[str]) -> BatchTaker:
    task = LearnerTask(
        arm=make_arm(name="grpo", objective="grpo"),
        learner=LearnerConfig(steps=3, prompts_per_step=PER_STEP),
        mode=mode,
        lag=0,
        seed=0,
        group_size=2,
        max_new_tokens=8,
        model_dir=Path("unused"),
        trial_dir=Path("unused"),
    )
    return BatchTaker(source, task, ModelLimits(vocab_size=10_000), trained=trained)


def test_fixed_mode_trains_in_prompt_order_and_settles_the_consumed_ids() -> None:
    p1, p0 = _delivery(1, 0, entry=1), _delivery(0, 0, entry=2)  # arrived p1 first
    taker = _taker(ScriptedSource({0: [p1, p0]}), "fixed", trained=[])
    taken = taker.take(0)
    assert [d.group.prompt_index for d in taken.trained] == [0, 1]
    assert taken.consumed == [p1, p0]  # settled as read
    assert taken.dropped == [] and taken.sampling_metrics == {}
    assert taker.settle(taken) == sorted([p0.group.group_id, p1.group.group_id])


def test_fixed_mode_fails_on_a_redelivered_consumed_group_after_acking_it() -> None:
    p0, p1 = _delivery(0, 0, entry=1), _delivery(1, 0, entry=2)
    source = ScriptedSource({0: [p0, p1]})
    taker = _taker(source, "fixed", trained=[p1.group.group_id])  # a checkpoint's id
    with pytest.raises(RuntimeError, match="redelivered groups already trained"):
        taker.take(0)
    assert source.acked == [p1.entry_id]


def test_bounded_mode_drops_a_redelivered_copy_and_trains_the_rest() -> None:
    p0, p1 = _delivery(0, 0, entry=1), _delivery(1, 0, entry=2)
    source = ScriptedSource({0: [p0, p1], 1: [p1]})
    taker = _taker(source, "bounded", trained=[p0.group.group_id])
    taken = taker.take(0)
    assert taken.trained == [p1] and source.acked == [p0.entry_id]
    taker.settle(taken)
    with pytest.raises(RuntimeError, match="redelivered"):  # nothing but copies came
        taker.take(1)
